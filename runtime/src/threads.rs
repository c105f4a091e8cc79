//! The tokio runtime, sized by `--worker-threads`.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Builds the runtime: `worker_threads` 0 means one worker per CPU this process may use
/// (its affinity mask and cgroup CPU quota, as `std::thread::available_parallelism` reads
/// them), 1 a single-threaded runtime, more a multi-threaded one of that size. With one CPU
/// available, 0 also means the single-threaded runtime: a pod limited to one CPU gains
/// nothing from a worker thread beside the main one, only wake-ups between them.
///
/// One thread is the better choice on small machines: every hand-off between the session
/// driver and a tunnel stays on one thread, so a tunnel's bytes never cross cores. What it
/// costs is spread: mTLS handshakes are what a larger node's cores share out. The measured
/// difference, with its command, is in docs/benchmark-history.md (optimisation log).
pub fn build_runtime(worker_threads: usize) -> io::Result<tokio::runtime::Runtime> {
    let workers = workers(worker_threads);
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

/// What both binaries do between parsing their configuration and binding: logging (its first
/// line `program`'s version and commit), the crypto provider, the open-files limit, then the
/// runtime.
pub fn start_process(
    program: &'static str,
    log_format: crate::logging::LogFormat,
    log: &crate::compat::LogSettings,
    notes: &crate::compat::Notes,
    worker_threads: usize,
) -> io::Result<tokio::runtime::Runtime> {
    crate::logging::init(log_format, log);
    crate::build::log_start(program);
    notes.log();
    crate::tls::install_crypto_provider();
    let open_files = crate::limits::raise_nofile();
    tracing::debug!(?open_files, "open-files limit");
    build_runtime(worker_threads)
}

/// The number of workers `worker_threads` stands for (0: one per CPU this process may use).
pub fn workers(worker_threads: usize) -> usize {
    match worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// `--session-threads`: `auto` or a count of [`Shards`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionThreads {
    /// One per worker thread; none when there is one worker.
    Auto,
    Count(usize),
}

impl SessionThreads {
    /// The threads to start beside `--worker-threads` `worker_threads`.
    pub fn count(self, worker_threads: usize) -> usize {
        match self {
            SessionThreads::Count(count) => count,
            SessionThreads::Auto => match workers(worker_threads) {
                1 => 0,
                workers => workers,
            },
        }
    }

    /// Reads the flag's value.
    pub fn parse(value: &str) -> Result<SessionThreads, String> {
        if value == "auto" {
            return Ok(SessionThreads::Auto);
        }
        value
            .parse()
            .map(SessionThreads::Count)
            .map_err(|_| format!("`{value}` is neither `auto` nor a number of threads"))
    }
}

/// Threads of their own, each with a single-threaded runtime, that agent sessions are homed
/// on: a session's driver and every tunnel spliced over it run on its shard's thread, so the
/// hand-off of each chunk between a tunnel's task and its session's stays on one thread and
/// in one core's cache (the multi-threaded runtime hands such wake-ups to whichever worker
/// is free, and the other core then takes the task). A CONNECT client's handshake, head and
/// dial stay on the main runtime and spread over its workers; its splice moves here after
/// the `200`.
///
/// The threads end when the last clone is dropped, dropping whatever still runs on them.
#[derive(Debug, Clone)]
pub struct Shards {
    inner: Arc<ShardsInner>,
}

#[derive(Debug)]
struct ShardsInner {
    shards: Vec<Shard>,
    stop: CancellationToken,
}

#[derive(Debug)]
struct Shard {
    handle: Handle,
    /// Sessions homed here now.
    homed: Arc<AtomicUsize>,
}

impl Drop for ShardsInner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A place on a shard: its runtime, counted as one session there until dropped.
#[derive(Debug)]
pub struct Home {
    handle: Handle,
    homed: Arc<AtomicUsize>,
}

impl Home {
    /// The shard's runtime.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

/// Runs `task` on `home`'s thread (on the current runtime without one), tracked by `tracker`:
/// the one way a session, and what it spawns, is put on its thread.
pub fn spawn_home<F>(home: Option<&Handle>, tracker: &TaskTracker, task: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let task = tracker.track_future(task);
    match home {
        Some(home) => drop(home.spawn(task)),
        None => drop(tokio::spawn(task)),
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        self.homed.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Shards {
    /// `count` shard threads, named `{name}-{i}` (none for 0).
    pub fn start(name: &str, count: usize) -> io::Result<Shards> {
        let stop = CancellationToken::new();
        let mut shards = Vec::with_capacity(count);
        let (started_tx, started) = std::sync::mpsc::channel();
        for i in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let stop = stop.clone();
            let started_tx = started_tx.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    let _ = started_tx.send(());
                    runtime.block_on(stop.cancelled())
                })?;
            shards.push(Shard {
                handle,
                homed: Arc::default(),
            });
        }
        // A thread takes its name as it starts and carries its parent's (a runtime worker's)
        // until then: returned only once every one has, so that nothing counts the process's
        // threads by name (a test, an operator's `ps -L`) while they are half made.
        for _ in 0..count {
            let _ = started.recv();
        }
        Ok(Shards {
            inner: Arc::new(ShardsInner { shards, stop }),
        })
    }

    /// No shards: everything runs where it is spawned.
    pub fn none() -> Shards {
        Shards {
            inner: Arc::new(ShardsInner {
                shards: Vec::new(),
                stop: CancellationToken::new(),
            }),
        }
    }

    /// A place on the shard with the fewest sessions homed now (the first of those tied), or
    /// `None` without shards.
    pub fn home(&self) -> Option<Home> {
        let shard = self
            .inner
            .shards
            .iter()
            .min_by_key(|shard| shard.homed.load(Ordering::Relaxed))?;
        shard.homed.fetch_add(1, Ordering::Relaxed);
        Some(Home {
            handle: shard.handle.clone(),
            homed: shard.homed.clone(),
        })
    }

    /// Sessions homed on each shard now.
    pub fn homed(&self) -> Vec<usize> {
        self.inner
            .shards
            .iter()
            .map(|shard| shard.homed.load(Ordering::Relaxed))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name of the thread `home`'s runtime runs a task on.
    fn thread_of(home: &Home) -> Option<String> {
        let task = home
            .handle()
            .spawn(async { std::thread::current().name().map(str::to_owned) });
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(task)
            .unwrap()
    }

    #[test]
    fn homes_go_to_the_least_loaded_shard_and_are_given_back_when_dropped() {
        let shards = Shards::start("test-shard", 2).unwrap();
        let a = shards.home().unwrap();
        let b = shards.home().unwrap();
        assert_eq!(shards.homed(), vec![1, 1]);
        assert_eq!(thread_of(&a).as_deref(), Some("test-shard-0"));
        assert_eq!(thread_of(&b).as_deref(), Some("test-shard-1"));
        drop(a);
        assert_eq!(shards.homed(), vec![0, 1]);
        let c = shards.home().unwrap();
        assert_eq!(thread_of(&c).as_deref(), Some("test-shard-0"));
        drop((b, c));
        assert_eq!(shards.homed(), vec![0, 0]);
    }

    #[test]
    fn session_threads_are_one_per_worker_or_as_many_as_asked() {
        assert_eq!(SessionThreads::parse("auto"), Ok(SessionThreads::Auto));
        assert_eq!(SessionThreads::Auto.count(4), 4);
        assert_eq!(SessionThreads::Auto.count(1), 0);
        assert_eq!(SessionThreads::parse("0").unwrap().count(4), 0);
        assert_eq!(SessionThreads::parse("3").unwrap().count(1), 3);
        assert!(SessionThreads::parse("many").is_err());
    }

    #[test]
    fn no_shards_no_homes() {
        assert!(Shards::start("test-shard", 0).unwrap().home().is_none());
        assert!(Shards::none().home().is_none());
    }

    #[test]
    fn the_threads_stop_with_the_last_clone() {
        let shards = Shards::start("test-shard", 2).unwrap();
        let home = shards.home().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // A task that holds `tx` until its runtime drops it.
        home.handle().spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await
        });
        drop((home, shards.clone()));
        drop(shards);
        // Err(Disconnected): the shard's runtime dropped its task (a bound, not a wait).
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(30)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
        );
    }
}
