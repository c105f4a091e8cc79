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

/// Writes a duration as [`parse`] reads it: `10s`, `250ms`, `1m30s`, `0`.
pub fn format(duration: Duration) -> String {
    if duration.is_zero() {
        return "0".to_owned();
    }
    if duration.subsec_nanos() != 0 {
        let nanos = duration.as_nanos();
        return match (nanos % 1_000_000, nanos % 1_000) {
            (0, _) => format!("{}ms", nanos / 1_000_000),
            (_, 0) => format!("{}us", nanos / 1_000),
            _ => format!("{nanos}ns"),
        };
    }
    let secs = duration.as_secs();
    let mut text = String::new();
    for (count, unit) in [
        (secs / 3600, "h"),
        (secs % 3600 / 60, "m"),
        (secs % 60, "s"),
    ] {
        if count != 0 {
            text.push_str(&format!("{count}{unit}"));
        }
    }
    text
}

/// serde's `serialize_with` for a duration field: the [`format`] text, so an effective
/// configuration reads as its flags are written.
pub fn serialize<S: serde::Serializer>(duration: &Duration, to: S) -> Result<S::Ok, S::Error> {
    to.collect_str(&format(*duration))
}

/// [`serialize`] for an optional duration (`null` when unset).
pub fn serialize_option<S: serde::Serializer>(
    duration: &Option<Duration>,
    to: S,
) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => serialize(duration, to),
        None => to.serialize_none(),
    }
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

    #[test]
    fn formatted_durations_parse_back() {
        for (duration, text) in [
            (Duration::ZERO, "0"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(100 * 3600 + 1), "100h1s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_nanos(7), "7ns"),
        ] {
            assert_eq!(format(duration), text);
            assert_eq!(parse(text), Ok(duration), "{text}");
        }
    }
}
