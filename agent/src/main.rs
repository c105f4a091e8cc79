//! The `bridgehead-agent` binary: parse, validate, set up logging and TLS, bind, run.

use std::io::Write;
use std::process::ExitCode;

use bridgehead_agent::Cli;
use bridgehead_runtime::threads::start_process;
use bridgehead_runtime::{signal, EX_USAGE};
use clap::error::ErrorKind;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing::error;

/// jemalloc, not glibc malloc: with tunnels opening and closing all day, glibc's heap
/// creeps where jemalloc's stays flat (docs/benchmarks.md, "Soak", has the figures).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error)
            if matches!(
                error.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) =>
        {
            error.exit()
        }
        Err(error) => usage_error(clap_message(&error)),
    };
    let config = match cli.into_config() {
        Ok(config) => config,
        Err(error) => usage_error(format!("{error:#}")),
    };
    let runtime = match start_process(
        "bridgehead-agent",
        config.logging.format,
        &config.logging.settings,
        &config.notes,
        config.process.worker_threads,
    ) {
        Ok(runtime) => runtime,
        Err(error) => {
            error!(%error, "starting the tokio runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let listeners = bridgehead_agent::Listeners::bind(&config).await?;
        // For scripts that read the addresses; nobody reading them (a closed pipe) is no
        // reason to stop.
        let mut stdout = std::io::stdout().lock();
        for (what, listener) in [("health", &listeners.health), ("admin", &listeners.admin)] {
            let address = listener.local_addr()?;
            let _ = writeln!(stdout, "bridgehead-agent {what} listening on {address}");
        }
        let _ = stdout.flush();
        drop(stdout);
        let shutdown = CancellationToken::new();
        signal::cancel_on_signal(shutdown.clone())?;
        // On a worker thread, not the main thread `block_on` parks: the session driver and
        // the tunnel tasks then hand work to each other without crossing threads.
        tokio::spawn(bridgehead_agent::run(config, listeners, shutdown))
            .await
            .map_err(|e| anyhow::anyhow!("agent task failed: {e}"))?
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            error!(error = format!("{error:#}"), "bridgehead-agent failed");
            ExitCode::FAILURE
        }
    }
}

/// Prints `bridgehead-agent: <message>` and exits with `EX_USAGE`.
fn usage_error(message: String) -> ! {
    eprintln!("bridgehead-agent: {message}");
    std::process::exit(EX_USAGE)
}

/// A clap error on one line: its first paragraph (the message and any detail lines, such as
/// the missing flags or the possible values), without the `error: ` prefix.
fn clap_message(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let message = rendered
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    message
        .strip_prefix("error: ")
        .unwrap_or(&message)
        .to_owned()
}
