//! Logging setup: a `RUST_LOG`-style filter (default `info`), text or JSON lines on stderr.

use std::io::IsTerminal;
use std::str::FromStr;

use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other:?} (valid: text, json)")),
        }
    }
}

/// Libraries whose trace output carries secrets or tunnel bytes: tungstenite logs the upgrade
/// request with the agent's `Authorization` header, the TLS and HTTP layers log records and
/// headers (the server's own credentials towards kube-apiserver, an agent's token inside a
/// TokenReview). They are capped at `debug`, whatever `RUST_LOG` asks.
const CAPPED: [&str; 11] = [
    "tungstenite",
    "tokio_tungstenite",
    "rustls",
    "tokio_rustls",
    "hyper",
    "hyper_util",
    "h2",
    "tower",
    "tower_http",
    "kube",
    "kube_client",
];

/// Installs the global subscriber. `RUST_LOG` overrides the default `info` filter. Text is
/// colored only on a terminal (and not with `NO_COLOR` set): in a pod, stderr is a file or a
/// pipe that log collectors read, where escape codes are noise.
pub fn init(format: LogFormat) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    for target in CAPPED {
        if let Ok(cap) = format!("{target}=debug").parse() {
            filter = filter.add_directive(cap);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colored(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(std::io::stderr);
    // A second init (tests calling run twice) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Whether text logs get ANSI colors: on a terminal, unless `NO_COLOR` is set and not empty
/// (no-color.org).
fn colored(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|value| value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::colored;

    #[test]
    fn colors_only_on_a_terminal_without_no_color() {
        assert!(colored(true, None));
        assert!(colored(true, Some("".into())));
        assert!(!colored(true, Some("1".into())));
        assert!(!colored(false, None));
    }
}
