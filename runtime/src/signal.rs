//! Turning SIGTERM and SIGINT into a cancellation.

use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGTERM or SIGINT.
pub fn cancel_on_signal(token: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
        token.cancel();
    });
    Ok(())
}
