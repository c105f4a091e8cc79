//! The tokio runtime, sized by `--worker-threads`.

use std::io;

/// Builds the runtime: `worker_threads` 0 means one worker per CPU (tokio's default), 1 a
/// single-threaded runtime, more a multi-threaded one of that size.
///
/// One thread is the lower-latency choice on small machines: every hand-off between the
/// session driver and a tunnel stays on one thread (on 2 cores: ~25 % more tunnel setups per
/// second, ~10 µs less per round trip), at the price of using one core for all the process's
/// TLS and copying (bulk throughput drops). docs/benchmarks.md has the figures.
pub fn build_runtime(worker_threads: usize) -> io::Result<tokio::runtime::Runtime> {
    match worker_threads {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        0 => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
}

/// What both binaries do between parsing their configuration and binding: logging, the
/// crypto provider, the open-files limit, then the runtime.
pub fn start_process(
    log_format: crate::logging::LogFormat,
    worker_threads: usize,
) -> io::Result<tokio::runtime::Runtime> {
    crate::logging::init(log_format);
    crate::tls::install_crypto_provider();
    let open_files = crate::limits::raise_nofile();
    tracing::debug!(?open_files, "open-files limit");
    build_runtime(worker_threads)
}
