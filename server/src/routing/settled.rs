//! Whether the first round of dialing the peers is over. The registry's peers' tables fill
//! from the sessions `crate::peering` dials; the tunnel opener waits on this before it says no
//! agent matches, and the context holds it, so it lives here, below both.

use std::time::Duration;

use tokio::sync::watch;

/// Whether the first round of dialing the peers is over: until then, a CONNECT that finds no
/// agent waits for it (at most its dial timeout), since a server that just started learns of
/// its peers' agents a moment after it listens.
#[derive(Debug)]
pub struct Settled(watch::Receiver<bool>);

impl Settled {
    /// A pair: the sender for `crate::peering::dialed::dial_peers`, and what the opener waits
    /// on.
    pub fn new() -> (watch::Sender<bool>, Settled) {
        let (sender, receiver) = watch::channel(false);
        (sender, Settled(receiver))
    }

    /// Settled from the start: no peers to wait for.
    pub fn already() -> Settled {
        let (sender, settled) = Settled::new();
        sender.send_replace(true);
        settled
    }

    /// Waits until the first round is over, at most `limit`; true when it is over.
    pub async fn wait(&self, limit: Duration) -> bool {
        let mut receiver = self.0.clone();
        let settled = async move { receiver.wait_for(|settled| *settled).await.is_ok() };
        tokio::time::timeout(limit, settled).await.unwrap_or(false)
    }

    /// Whether the first round is over.
    pub fn is_settled(&self) -> bool {
        *self.0.borrow()
    }
}
