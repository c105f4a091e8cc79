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
