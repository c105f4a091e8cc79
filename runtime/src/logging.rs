//! Logging setup: a `RUST_LOG`-style filter (default from `-v`, else `info`), text or JSON
//! lines on stderr or, with klog's `--logtostderr=false --log-file`, in a file (lines at or
//! above `--stderrthreshold` copied to stderr). The level can be changed at run time
//! ([`set_verbosity`], the admin port's `PUT /debug/flags/v`).

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tracing::span;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

use crate::compat::{level_for, LogFile, LogSettings};

/// Lines that could not be written (a closed or full stderr, a log file that fails).
static DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many log lines could not be written so far.
pub fn dropped_lines() -> u64 {
    DROPPED.load(std::sync::atomic::Ordering::Relaxed)
}

/// A log destination whose write errors drop the line and count it: a reader that went
/// away must cost the process nothing but the lines.
#[derive(Debug, Clone, Copy)]
struct Dropping<M>(M);

/// The writer [`Dropping`] makes.
struct DroppingWriter<W>(W);

impl<W: Write> Write for DroppingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.0.write_all(buf) {
            Ok(()) => Ok(buf.len()),
            Err(_) => {
                DROPPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Dropping<M> {
    type Writer = DroppingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        DroppingWriter(self.0.make_writer())
    }
}

/// `log_lines_dropped_total`: lines lost to a closed or failing log destination.
#[derive(Debug, Default)]
pub struct DroppedCollector;

impl prometheus_client::collector::Collector for DroppedCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let counter = prometheus_client::metrics::counter::ConstCounter::new(dropped_lines());
        let metric = encoder.encode_descriptor(
            "log_lines_dropped",
            "Log lines that could not be written (stderr or the log file closed or failing)",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
}

/// The installed filter, for [`set_verbosity`].
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Whether the installed filter has directives that name spans (`target[span{field}]=level`),
/// the only ones for which it must see spans entered and exited ([`Verbosity`]).
static SPAN_DIRECTIVES: AtomicBool = AtomicBool::new(false);

/// The level filter as the subscriber's global filter, reloadable for [`set_verbosity`].
///
/// `EnvFilter` takes a read lock on its span table on every span enter and exit, behind the
/// read lock of the reload that wraps it: four shared locks each time a task that runs in a
/// span (a session's) is polled, twice a round trip in each process. Its table only ever
/// holds spans that a directive names, so without such directives enter and exit have
/// nothing to do and are not passed on; everything else is.
struct Verbosity(reload::Layer<EnvFilter, Registry>);

impl Layer<Registry> for Verbosity {
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        self.0.on_register_dispatch(subscriber);
    }

    fn on_layer(&mut self, subscriber: &mut Registry) {
        self.0.on_layer(subscriber);
    }

    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        self.0.register_callsite(metadata)
    }

    fn enabled(&self, metadata: &tracing::Metadata<'_>, ctx: Context<'_, Registry>) -> bool {
        self.0.enabled(metadata, ctx)
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, Registry>) {
        self.0.on_new_span(attrs, id, ctx);
    }

    fn on_record(&self, span: &span::Id, values: &span::Record<'_>, ctx: Context<'_, Registry>) {
        self.0.on_record(span, values, ctx);
    }

    fn on_follows_from(&self, span: &span::Id, follows: &span::Id, ctx: Context<'_, Registry>) {
        self.0.on_follows_from(span, follows, ctx);
    }

    fn event_enabled(&self, event: &tracing::Event<'_>, ctx: Context<'_, Registry>) -> bool {
        self.0.event_enabled(event, ctx)
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, Registry>) {
        self.0.on_event(event, ctx);
    }

    fn on_enter(&self, id: &span::Id, ctx: Context<'_, Registry>) {
        if SPAN_DIRECTIVES.load(Ordering::Relaxed) {
            self.0.on_enter(id, ctx);
        }
    }

    fn on_exit(&self, id: &span::Id, ctx: Context<'_, Registry>) {
        if SPAN_DIRECTIVES.load(Ordering::Relaxed) {
            self.0.on_exit(id, ctx);
        }
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, Registry>) {
        self.0.on_close(id, ctx);
    }

    fn on_id_change(&self, old: &span::Id, new: &span::Id, ctx: Context<'_, Registry>) {
        self.0.on_id_change(old, new, ctx);
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.0.max_level_hint()
    }
}

/// Whether `directives` (an `EnvFilter` string) name spans: only then does the filter track
/// entered spans.
fn names_spans(directives: &str) -> bool {
    directives.contains('[')
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
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
/// TokenReview). Their trace lines are dropped, whatever `RUST_LOG` asks; their debug lines
/// show only where the filter asks for debug.
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

/// Whether a span or event of `target` at `level` is a capped library's trace output.
fn capped(target: &str, level: &tracing::Level) -> bool {
    *level == tracing::Level::TRACE
        && CAPPED.iter().any(|library| {
            target
                .strip_prefix(library)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
}

/// The filter for `level` (or `RUST_LOG`, when `from_env` and it is set). The cap is not a
/// directive here: `rustls=debug` would switch rustls' debug lines on at the default `info`
/// (every TLS handshake logged them until it was a filter of its own, [`capped`]).
/// Also whether its directives name spans ([`names_spans`]), for [`SPAN_DIRECTIVES`] once it
/// is installed.
fn filter(level: &str, from_env: bool) -> (EnvFilter, bool) {
    from_env
        .then(|| std::env::var(EnvFilter::DEFAULT_ENV).ok())
        .flatten()
        .and_then(|directives| {
            let filter = EnvFilter::try_new(&directives).ok()?;
            Some((filter, names_spans(&directives)))
        })
        .unwrap_or_else(|| (EnvFilter::new(level), names_spans(level)))
}

/// One output: lines in `format` to `writer`.
fn output<S, W>(format: LogFormat, writer: W, ansi: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => layer.boxed(),
        LogFormat::Json => layer.json().flatten_event(true).boxed(),
    }
}

/// Installs the global subscriber. `RUST_LOG` overrides the default filter. Text is colored
/// only on a terminal (and not with `NO_COLOR` set): in a pod, stderr is a file or a pipe
/// that log collectors read, where escape codes are noise. A log file that cannot be opened
/// is reported on stderr, and stderr is used instead.
pub fn init(format: LogFormat, settings: &LogSettings) {
    let (filter, spans) = filter(settings.level, true);
    let (filter, handle) = reload::Layer::new(filter);
    let filter = Verbosity(filter);
    let ansi = colored(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR"),
    );
    let mut problem = None;
    let file = settings
        .file
        .as_ref()
        .and_then(|file| match SizedFile::open(file) {
            Ok(opened) => Some(Arc::new(opened)),
            Err(error) => {
                problem = Some(format!("{}: {error}", file.path.display()));
                None
            }
        });
    let stderr = Dropping(std::io::stderr);
    let layers = match file {
        None => output(format, stderr, ansi),
        Some(file) => {
            let threshold = settings
                .stderr_threshold
                .map_or(LevelFilter::OFF, LevelFilter::from_level);
            output(format, Dropping(file), false)
                .and_then(output(format, stderr, ansi).with_filter(threshold))
                .boxed()
        }
    };
    // A global filter beside the level's, not a per-layer one on the outputs: a per-layer
    // filter looks every entered span up in the registry on each enter and exit, and a
    // session's span is entered on every poll of its task (two per round trip).
    let uncapped =
        tracing_subscriber::filter::filter_fn(|meta| !capped(meta.target(), meta.level()));
    // A second init (tests calling run twice) keeps the first subscriber.
    if tracing_subscriber::registry()
        .with(filter)
        .with(uncapped)
        .with(layers)
        .try_init()
        .is_ok()
    {
        SPAN_DIRECTIVES.store(spans, Ordering::Relaxed);
        let _ = FILTER.set(handle);
    }
    if let Some(problem) = problem {
        tracing::warn!(%problem, "cannot open the log file; logging to stderr");
    }
}

/// Sets the level as klog's `-v` would (`RUST_LOG` no longer applies); the level set.
pub fn set_verbosity(verbosity: u8) -> Result<&'static str, String> {
    let level = level_for(verbosity);
    let handle = FILTER.get().ok_or("logging is not set up")?;
    let (filter, spans) = filter(level, false);
    handle
        .reload(filter)
        .map_err(|e| format!("changing the log level: {e}"))?;
    SPAN_DIRECTIVES.store(spans, Ordering::Relaxed);
    tracing::info!(verbosity, level, "log level changed");
    Ok(level)
}

/// A log file that starts again empty when it would pass its size bound (klog's
/// `--log-file-max-size`). Write errors are returned to the logger, which drops the line:
/// logging never stops the process.
#[derive(Debug)]
struct SizedFile {
    max_bytes: u64,
    state: Mutex<(File, u64)>,
}

impl SizedFile {
    fn open(file: &LogFile) -> std::io::Result<SizedFile> {
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file.path)?;
        let written = opened.metadata()?.len();
        Ok(SizedFile {
            max_bytes: file.max_bytes,
            state: Mutex::new((opened, written)),
        })
    }
}

impl Write for &SizedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (file, written) = &mut *state;
        if self.max_bytes > 0 && *written + buf.len() as u64 > self.max_bytes {
            // Appending, so writes go to the new end: the start.
            file.set_len(0)?;
            *written = 0;
        }
        let n = file.write(buf)?;
        *written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0.flush()
    }
}

/// Whether text logs get ANSI colors: on a terminal, unless `NO_COLOR` is set and not empty
/// (no-color.org).
fn colored(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|value| value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A destination whose every write fails, as a closed pipe.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn failed_writes_drop_the_line_count_it_and_report_success() {
        let before = dropped_lines();
        let mut closed = DroppingWriter(Closed);
        assert_eq!(closed.write(b"a line\n").unwrap(), 7);
        assert!(closed.flush().is_ok());
        assert_eq!(dropped_lines(), before + 1);
        let mut kept = DroppingWriter(Vec::new());
        assert_eq!(kept.write(b"kept\n").unwrap(), 5);
        assert_eq!(kept.0, b"kept\n");
        assert_eq!(dropped_lines(), before + 1);
        // The count is on the metrics page.
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(DroppedCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(&format!("log_lines_dropped_total {}", dropped_lines())),
            "{text}"
        );
    }

    #[test]
    fn an_empty_log_file_starts_again_past_its_bound_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        let file = SizedFile::open(&LogFile {
            path: path.clone(),
            max_bytes: 10,
        })
        .unwrap();
        (&file).write_all(b"first\n").unwrap();
        (&file).write_all(b"again\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "again\n");
    }

    #[test]
    fn a_log_file_starts_again_past_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        std::fs::write(&path, "old\n").unwrap();
        let file = SizedFile::open(&LogFile {
            path: path.clone(),
            max_bytes: 10,
        })
        .unwrap();
        (&file).write_all(b"12345\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n12345\n");
        (&file).write_all(b"abcdef\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "abcdef\n");
        let unbounded = SizedFile::open(&LogFile {
            path: path.clone(),
            max_bytes: 0,
        })
        .unwrap();
        for _ in 0..10 {
            (&unbounded).write_all(b"0123456789\n").unwrap();
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 7 + 110);
    }

    #[test]
    fn only_directives_with_a_span_part_name_spans() {
        for (directives, spans) in [
            ("info", false),
            ("bridgehead_mux=debug,warn", false),
            ("info,[session]=debug", true),
            ("[{stream=1}]=trace", true),
        ] {
            assert_eq!(names_spans(directives), spans, "{directives}");
        }
    }

    #[test]
    fn only_the_capped_libraries_trace_output_is_dropped() {
        use tracing::Level;
        for (target, level, dropped) in [
            ("rustls::server::hs", Level::TRACE, true),
            ("rustls", Level::TRACE, true),
            ("hyper_util::client", Level::TRACE, true),
            ("tungstenite::handshake", Level::TRACE, true),
            ("rustls::server::hs", Level::DEBUG, false),
            ("hyper", Level::INFO, false),
            ("rustlsx", Level::TRACE, false),
            ("bridgehead_mux::driver", Level::TRACE, false),
        ] {
            assert_eq!(capped(target, &level), dropped, "{target} at {level}");
        }
    }

    #[test]
    fn colors_only_on_a_terminal_without_no_color() {
        assert!(colored(true, None));
        assert!(colored(true, Some("".into())));
        assert!(!colored(true, Some("1".into())));
        assert!(!colored(false, None));
    }
}
