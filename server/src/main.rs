//! bridgehead-server's entry point: flags, logging, crypto provider, bind, run.

use bridgehead_runtime::threads::start_process;
use bridgehead_runtime::{signal, EX_USAGE};
use bridgehead_server::{Cli, Listeners};
use clap::Parser;
use tokio_util::sync::CancellationToken;

/// jemalloc, not glibc malloc: with tunnels opening and closing all day, glibc's heap
/// creeps where jemalloc's stays flat (docs/benchmarks.md, "Soak", has the figures).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if error.use_stderr() => {
            let _ = error.print();
            std::process::exit(EX_USAGE);
        }
        Err(error) => {
            let _ = error.print();
            std::process::exit(0);
        }
    };
    let config = match cli.validate() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("bridgehead-server: {error:#}");
            std::process::exit(EX_USAGE);
        }
    };
    let runtime = match start_process(
        "bridgehead-server",
        config.logging.format,
        &config.logging.settings,
        &config.notes,
        config.process.worker_threads,
    ) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("bridgehead-server: starting the runtime: {error}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async {
        let listeners = Listeners::bind(&config).await?;
        let shutdown = CancellationToken::new();
        signal::cancel_on_signal(shutdown.clone())?;
        // On a worker thread rather than the main thread that `block_on` parks.
        tokio::spawn(bridgehead_server::run(config, listeners, shutdown))
            .await
            .map_err(|e| anyhow::anyhow!("server task failed: {e}"))?
    });
    if let Err(error) = result {
        tracing::error!(error = %format!("{error:#}"), "bridgehead-server failed");
        eprintln!("bridgehead-server: {error:#}");
        std::process::exit(1);
    }
}
