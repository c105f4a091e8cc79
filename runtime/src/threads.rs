//! The tokio runtime, sized by `--worker-threads`.

use std::io;

/// Builds the runtime: `worker_threads` 0 means one worker per CPU this process may use
/// (its affinity mask and cgroup CPU quota, as `std::thread::available_parallelism` reads
/// them), 1 a single-threaded runtime, more a multi-threaded one of that size. With one CPU
/// available, 0 also means the single-threaded runtime: a pod limited to one CPU gains
/// nothing from a worker thread beside the main one, only wake-ups between them.
///
/// One thread is the better choice on small machines: every hand-off between the session
/// driver and a tunnel stays on one thread. On 2 cores shared with the client and target,
/// alternated runs put it at 5–15 % less CPU per GiB, 10–20 % more Unix-socket setups per
/// second and 10–25 µs less per round trip, with mTLS handshakes at concurrency 16 no faster
/// (they are what spreads over the cores of a larger node). docs/benchmarks.md has the
/// figures.
pub fn build_runtime(worker_threads: usize) -> io::Result<tokio::runtime::Runtime> {
    let workers = match worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    if workers == 1 {
        tracing::info!(
            worker_threads,
            "runtime: current-thread (one thread for everything)"
        );
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
    }
    tracing::info!(worker_threads, workers, "runtime: multi-thread");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
}

/// What both binaries do between parsing their configuration and binding: logging, the
/// crypto provider, the open-files limit, then the runtime.
pub fn start_process(
    log_format: crate::logging::LogFormat,
    log: &crate::compat::LogSettings,
    notes: &crate::compat::Notes,
    worker_threads: usize,
) -> io::Result<tokio::runtime::Runtime> {
    crate::logging::init(log_format, log);
    notes.log();
    crate::tls::install_crypto_provider();
    let open_files = crate::limits::raise_nofile();
    tracing::debug!(?open_files, "open-files limit");
    build_runtime(worker_threads)
}
