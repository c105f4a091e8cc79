//! Durations as Go's `time.ParseDuration` (and so ANP's flags) write them.

use std::time::Duration;

/// Why a duration did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (write e.g. 10s, 500ms, 1m30s)")]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

/// Parses `10s`, `500ms`, `1m30s`, `1.5h`, `0`. Units: ns, us, µs, ms, s, m, h.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let error = |reason| DurationError {
        input: input.to_owned(),
        reason,
    };
    let s = input.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(error("empty"));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| error("missing unit"))?;
        if number_len == 0 {
            return Err(error("expected a number"));
        }
        let value: f64 = rest[..number_len]
            .parse()
            .map_err(|_| error("bad number"))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(error("unknown unit")),
        };
        total += value * seconds;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total > 1e9 {
        return Err(error("too large"));
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations() {
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("250us"), Ok(Duration::from_micros(250)));
        for bad in ["", "10", "s", "10x", "1..5s", "-1s"] {
            let err = parse(bad).unwrap_err();
            assert!(err.to_string().contains("invalid duration"), "{bad}: {err}");
        }
    }
}
