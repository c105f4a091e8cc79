//! Forwarding between servers (`--peer-port`): a CONNECT whose agent holds no session with
//! this server, but with a peer server, is carried to that peer and dialed there.
//!
//! Each server dials every peer ([`dialed`]) and serves the peers that dial it
//! ([`accepted`]), so two servers hold two sessions, one per direction of forwarding. Over the
//! session it dialed, a server keeps the peer's agents in its registry (the view stream,
//! [`view`]), routes to them strategy by strategy after its own agents, and opens a stream
//! per forwarded tunnel; the peer routes it among its own agents only (at most one hop) and
//! pumps the two streams into each other, each under its own flow control, so a stalled
//! client holds back only its own tunnel at every hop.
//!
//! Peers authenticate each other with mutual TLS against `--peer-ca-cert` (the CA the
//! frontend's clients chain to, since a peer opens tunnels as a CONNECT client does) and a
//! certificate only a peer holds ([`identity`]: `--allowed-peers`, both TLS usages, never a
//! CONNECT client's).

pub mod accepted;
pub mod dialed;
mod forwarded;
pub mod identity;
pub mod view;

#[cfg(test)]
mod tests;

use std::time::Duration;

use tokio::sync::watch;

/// Whether the first round of dialing the peers is over: until then, a CONNECT that finds no
/// agent waits for it (at most its dial timeout), since a server that just started learns of
/// its peers' agents a moment after it listens.
#[derive(Debug)]
pub struct Settled(watch::Receiver<bool>);

impl Settled {
    /// A pair: the sender for [`dialed::dial_peers`], and what the frontend waits on.
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
