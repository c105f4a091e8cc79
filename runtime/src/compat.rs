//! The flags both binaries take so that konnectivity's command lines run unchanged: klog's
//! logging flags (every Kubernetes component and ANP's binaries have them) and ANP's flags that
//! have no meaning for an HTTP-CONNECT proxy with WebSocket agents.
//!
//! klog's flags are honoured where Bridgehead can do what they ask ([`KlogArgs::settings`]):
//! `-v` sets the level, `--logtostderr=false` with `--log-file` (or `--log-dir`) writes the
//! log to a file, `--alsologtostderr` and `--stderrthreshold` copy lines to stderr, and
//! `--log-file-max-size` bounds the file. The rest are accepted and named in one startup line
//! each ([`Notes`]), as are ANP's gRPC-only flags ([`AnpIgnoredArgs`]).

use std::path::PathBuf;

use clap::Args;

/// Startup lines about accepted flags that are ignored or mapped: logged once logging is up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notes(pub Vec<String>);

impl Notes {
    /// Adds a line for `--flag` when it was given.
    pub fn given<T>(&mut self, value: &Option<T>, flag: &str, why: &str) {
        if value.is_some() {
            self.0
                .push(format!("--{flag} is accepted and ignored: {why}"));
        }
    }

    /// Logs every line at info.
    pub fn log(&self) {
        for line in &self.0 {
            tracing::info!("{line}");
        }
    }
}

/// klog's flags, as ANP's binaries register them. Booleans are pflag's: `--flag` is true,
/// `--flag=false` false, a value only after `=` (underscores spelled as dashes; the
/// underscore spellings are accepted too).
#[derive(Debug, Clone, Default, Args)]
pub struct KlogArgs {
    /// klog verbosity: 0–4 log at info (ANP's normal operation is 4), 5–8 at debug, 9 and
    /// above at trace. `RUST_LOG`, when set, wins.
    #[arg(short = 'v', long = "v", value_name = "N")]
    pub verbosity: Option<u8>,
    /// klog: log to stderr (the default); `false` logs to --log-file or --log-dir instead.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub logtostderr: Option<bool>,
    /// klog: with --logtostderr=false, also log every line to stderr.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub alsologtostderr: Option<bool>,
    /// klog: with --logtostderr=false, lines at or above this severity also go to stderr
    /// (INFO, WARNING, ERROR, FATAL or 0–3; default ERROR).
    #[arg(long, value_name = "SEVERITY")]
    pub stderrthreshold: Option<String>,
    /// klog: the log file, with --logtostderr=false.
    #[arg(long, alias = "log_file", value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// klog: the file's largest size in MB, after which it starts again empty; 0: no limit
    /// (klog's default is 1800).
    #[arg(long, alias = "log_file_max_size", value_name = "MB")]
    pub log_file_max_size: Option<u64>,
    /// klog: a directory for the log file (`<binary>.log`), with --logtostderr=false and no
    /// --log-file.
    #[arg(long, alias = "log_dir", value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// klog: accepted and ignored (Bridgehead's line format is --log-format's).
    #[arg(long, alias = "skip_headers", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide = true)]
    pub skip_headers: Option<bool>,
    /// klog: accepted and ignored.
    #[arg(long, alias = "skip_log_headers", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide = true)]
    pub skip_log_headers: Option<bool>,
    /// klog: accepted and ignored.
    #[arg(long, alias = "add_dir_header", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide = true)]
    pub add_dir_header: Option<bool>,
    /// klog: accepted and ignored (every line is written once).
    #[arg(long, alias = "one_output", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide = true)]
    pub one_output: Option<bool>,
    /// klog: accepted and ignored.
    #[arg(long, alias = "legacy_stderr_threshold_behavior", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide = true)]
    pub legacy_stderr_threshold_behavior: Option<bool>,
    /// klog: accepted and ignored (use RUST_LOG's per-module directives).
    #[arg(long, value_name = "PATTERNS", hide = true)]
    pub vmodule: Option<String>,
    /// klog: accepted and ignored.
    #[arg(
        long,
        alias = "log_backtrace_at",
        value_name = "FILE:LINE",
        hide = true
    )]
    pub log_backtrace_at: Option<String>,
}

/// Where log lines go and at what level, from klog's flags.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogSettings {
    /// The default filter (`info`, `debug`, `trace`); `RUST_LOG` overrides it.
    pub level: &'static str,
    /// Log to this file instead of stderr.
    pub file: Option<LogFile>,
    /// With a file: the least severity also copied to stderr (`None`: nothing).
    #[serde(serialize_with = "level_name")]
    pub stderr_threshold: Option<tracing::Level>,
}

impl Default for LogSettings {
    fn default() -> LogSettings {
        LogSettings {
            level: "info",
            file: None,
            stderr_threshold: None,
        }
    }
}

fn level_name<S: serde::Serializer>(
    level: &Option<tracing::Level>,
    to: S,
) -> Result<S::Ok, S::Error> {
    match level {
        Some(level) => to.collect_str(level),
        None => to.serialize_none(),
    }
}

/// A log file and its size bound.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogFile {
    pub path: PathBuf,
    /// In bytes; 0: none.
    pub max_bytes: u64,
}

/// klog's default --log-file-max-size, in MB.
const KLOG_MAX_SIZE_MB: u64 = 1800;

/// The level a klog verbosity maps to.
pub fn level_for(verbosity: u8) -> &'static str {
    match verbosity {
        0..=4 => "info",
        5..=8 => "debug",
        _ => "trace",
    }
}

/// A klog severity (`INFO`, `WARNING`, `ERROR`, `FATAL`, or 0–3) as the least level copied.
fn severity(text: &str) -> Result<tracing::Level, String> {
    match text.trim().to_ascii_uppercase().as_str() {
        "INFO" | "0" => Ok(tracing::Level::INFO),
        "WARNING" | "1" => Ok(tracing::Level::WARN),
        "ERROR" | "2" => Ok(tracing::Level::ERROR),
        // Bridgehead has no level above error: a fatal error is logged at error and exits.
        "FATAL" | "3" => Ok(tracing::Level::ERROR),
        other => Err(format!(
            "--stderrthreshold {other:?}: valid are INFO, WARNING, ERROR, FATAL or 0-3"
        )),
    }
}

impl KlogArgs {
    /// The log settings for `binary`, and a line for each flag accepted but not honoured.
    pub fn settings(&self, binary: &str, notes: &mut Notes) -> Result<LogSettings, String> {
        let mut settings = LogSettings {
            level: self.verbosity.map_or("info", level_for),
            ..LogSettings::default()
        };
        let threshold = self
            .stderrthreshold
            .as_deref()
            .map(severity)
            .transpose()?
            .unwrap_or(tracing::Level::ERROR);
        let to_stderr = self.logtostderr.unwrap_or(true);
        let file = match (&self.log_file, &self.log_dir) {
            (Some(path), _) => Some(path.clone()),
            (None, Some(dir)) => Some(dir.join(format!("{binary}.log"))),
            (None, None) => None,
        };
        match (to_stderr, file) {
            (true, file) => {
                if file.is_some() {
                    notes.0.push(
                        "--log-file/--log-dir are ignored while --logtostderr is true (klog's rule): logging to stderr".to_owned(),
                    );
                }
            }
            (false, None) => notes.0.push(
                "--logtostderr=false without --log-file or --log-dir: logging to stderr".to_owned(),
            ),
            (false, Some(path)) => {
                let mb = self.log_file_max_size.unwrap_or(KLOG_MAX_SIZE_MB);
                settings.file = Some(LogFile {
                    path,
                    max_bytes: mb.saturating_mul(1024 * 1024),
                });
                settings.stderr_threshold = if self.alsologtostderr.unwrap_or(false) {
                    Some(tracing::Level::TRACE)
                } else {
                    Some(threshold)
                };
            }
        }
        if settings.file.is_none() && self.log_file_max_size.is_some() && !to_stderr {
            notes
                .0
                .push("--log-file-max-size is ignored: no log file".to_owned());
        }
        let line_format = "Bridgehead's line format is --log-format's";
        notes.given(&self.skip_headers, "skip-headers", line_format);
        notes.given(&self.skip_log_headers, "skip-log-headers", line_format);
        notes.given(&self.add_dir_header, "add-dir-header", line_format);
        notes.given(&self.one_output, "one-output", "every line is written once");
        notes.given(
            &self.legacy_stderr_threshold_behavior,
            "legacy-stderr-threshold-behavior",
            "--stderrthreshold applies only with a log file",
        );
        notes.given(
            &self.vmodule,
            "vmodule",
            "use RUST_LOG's per-module directives (target=level)",
        );
        notes.given(
            &self.log_backtrace_at,
            "log-backtrace-at",
            "Bridgehead logs no stack traces",
        );
        Ok(settings)
    }
}

/// ANP flags of both binaries that an HTTP-CONNECT proxy with WebSocket agents has no use
/// for; each given one is named in a startup line.
#[derive(Debug, Clone, Default, Args)]
pub struct AnpIgnoredArgs {
    /// ANP: Go's pprof on the admin port. Accepted and ignored.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide = true)]
    pub enable_profiling: Option<bool>,
    /// ANP: Go's contention profiling. Accepted and ignored.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide = true)]
    pub enable_contention_profiling: Option<bool>,
    /// ANP: protobuf or JSON towards kube-apiserver. Accepted and ignored (JSON).
    #[arg(long, value_name = "TYPE", hide = true)]
    pub kube_api_content_type: Option<String>,
    /// ANP: a warning on full gRPC channels. Accepted and ignored.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide = true)]
    pub warn_on_channel_limit: Option<bool>,
    /// ANP: the size of the gRPC transfer channels. Accepted and ignored.
    #[arg(long, value_name = "N", hide = true)]
    pub xfr_channel_size: Option<i64>,
}

impl AnpIgnoredArgs {
    /// A line for each given flag.
    pub fn notes(&self, notes: &mut Notes) {
        let pprof = "Go's pprof has no counterpart in a Rust binary (profile with perf, or bench --flamegraph)";
        notes.given(&self.enable_profiling, "enable-profiling", pprof);
        notes.given(
            &self.enable_contention_profiling,
            "enable-contention-profiling",
            pprof,
        );
        notes.given(
            &self.kube_api_content_type,
            "kube-api-content-type",
            "the Kubernetes client speaks JSON",
        );
        notes.given(
            &self.warn_on_channel_limit,
            "warn-on-channel-limit",
            "there are no gRPC channels; per-stream windows bound what is buffered",
        );
        notes.given(
            &self.xfr_channel_size,
            "xfr-channel-size",
            "there are no gRPC channels; per-stream windows bound what is buffered",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    #[command(args_override_self = true)]
    struct Cli {
        #[command(flatten)]
        klog: KlogArgs,
        #[command(flatten)]
        anp: AnpIgnoredArgs,
    }

    fn parse(args: &[&str]) -> (LogSettings, Notes) {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).unwrap();
        let mut notes = Notes::default();
        let settings = cli.klog.settings("bin", &mut notes).unwrap();
        cli.anp.notes(&mut notes);
        (settings, notes)
    }

    #[test]
    fn verbosity_in_every_spelling_and_the_last_wins() {
        for args in [
            &["-v", "5"][..],
            &["-v=5"],
            &["-v5"],
            &["--v=5"],
            &["--v", "5"],
            &["--v=2", "-v=5"],
        ] {
            assert_eq!(parse(args).0.level, "debug", "{args:?}");
        }
        assert_eq!(parse(&[]).0.level, "info");
        assert_eq!(parse(&["--v=4"]).0.level, "info");
        assert_eq!(parse(&["--v=9"]).0.level, "trace");
    }

    #[test]
    fn a_log_file_only_without_logtostderr() {
        let (settings, notes) = parse(&["--logtostderr=true", "--log-file=/tmp/x.log"]);
        assert_eq!(settings.file, None);
        assert!(
            notes.0[0].contains("ignored while --logtostderr"),
            "{notes:?}"
        );
        let (settings, notes) = parse(&[
            "--log-file=/tmp/x.log",
            "--logtostderr=false",
            "--log-file-max-size=0",
        ]);
        assert!(notes.0.is_empty(), "{notes:?}");
        assert_eq!(
            settings.file,
            Some(LogFile {
                path: "/tmp/x.log".into(),
                max_bytes: 0
            })
        );
        assert_eq!(settings.stderr_threshold, Some(tracing::Level::ERROR));
        let (settings, _) = parse(&["--logtostderr=false", "--log_dir=/d", "--alsologtostderr"]);
        let file = settings.file.unwrap();
        assert_eq!(file.path, PathBuf::from("/d/bin.log"));
        assert_eq!(file.max_bytes, 1800 * 1024 * 1024);
        assert_eq!(settings.stderr_threshold, Some(tracing::Level::TRACE));
        let (settings, _) = parse(&[
            "--logtostderr=false",
            "--log-file=/f",
            "--stderrthreshold=1",
        ]);
        assert_eq!(settings.stderr_threshold, Some(tracing::Level::WARN));
    }

    #[test]
    fn a_size_bound_without_a_file_is_named_only_when_a_file_was_asked_for() {
        let (_, notes) = parse(&["--logtostderr=false", "--log-file-max-size=5"]);
        assert!(
            notes
                .0
                .iter()
                .any(|n| n.contains("--log-file-max-size is ignored")),
            "{notes:?}"
        );
        let (_, notes) = parse(&["--log-file-max-size=5"]);
        assert!(notes.0.is_empty(), "{notes:?}");
    }

    #[test]
    fn ignored_flags_are_named() {
        let (_, notes) = parse(&[
            "--skip-headers",
            "--vmodule=x=2",
            "--enable-profiling",
            "--xfr-channel-size=150",
            "--kube-api-content-type=application/json",
            "--warn-on-channel-limit=false",
        ]);
        let text = notes.0.join("\n");
        for flag in [
            "--skip-headers",
            "--vmodule",
            "--enable-profiling",
            "--xfr-channel-size",
            "--kube-api-content-type",
            "--warn-on-channel-limit",
        ] {
            assert!(
                text.contains(&format!("{flag} is accepted and ignored")),
                "{flag}: {text}"
            );
        }
    }

    #[test]
    fn a_bad_threshold_is_refused() {
        let cli = Cli::try_parse_from(["x", "--stderrthreshold=LOUD"]).unwrap();
        let error = cli.klog.settings("bin", &mut Notes::default()).unwrap_err();
        assert!(error.contains("INFO, WARNING, ERROR, FATAL"), "{error}");
    }
}
