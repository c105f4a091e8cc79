//! Every deadline of `bridgehead-server` and `bridgehead-agent`, named once.
//!
//! A deadline an operator may need to move is a flag, read from the binary's `Config` where its
//! one user reads it; one nobody needs to move is a constant here, with why it has its value.
//! [`DEADLINES`] lists them all, each with what it bounds, which binary keeps it, its flag or
//! constant and its default: docs/architecture.md's Deadlines table is tested against it
//! (`e2e/tests/deadlines.rs`), and so are the flags' defaults in each binary's `--help` and
//! the `Duration` constants of the binaries' code (a deadline written as a constant anywhere
//! else fails that test). Why a module and a list rather than a struct both `Config`s carry:
//! docs/architecture.md, Bounds.
//!
//! Left out on purpose, because they pace work rather than bound a wait on a peer: the
//! intervals (`--sync-interval`, `--peer-sync-interval`, certificate reloads, revocation
//! rechecks, accept back-off), lifetimes (`--lease-duration`, `--token-review-cache-ttl`) and
//! TCP's own keepalive probes (`--frontend-keepalive-time`).

use std::time::Duration;

use self::Binary::{Agent, Both, Server};
use self::Source::{Constant, Flag, FlagTimes};

/// Agent: longest wait for the TCP connection to a server, name resolution included. As long
/// as a server's handshake may take: a server busy enough to answer late is still better
/// than the next attempt's backoff.
pub const AGENT_CONNECT: Duration = Duration::from_secs(10);

/// Agent: longest wait for the server's first answer to the ClientHello: its listen backlog,
/// where it keeps agents while every handshake place is busy (a place is given back within the
/// server's `--agent-handshake-timeout`, 20 s, and sooner when its agent stalls), and its own
/// TLS work. Waiting in the backlog keeps the agent's place in the queue, where giving up would
/// send it to the back after its backoff.
pub const AGENT_FIRST_ANSWER: Duration = Duration::from_secs(30);

/// Agent: longest wait for the TLS handshake with a server, counted from the server's first
/// answer ([`AGENT_FIRST_ANSWER`] bounds the wait before). With [`AGENT_UPGRADE_ANSWER`] it
/// makes the server's `--agent-handshake-timeout` (20 s, counted from its accept), so the
/// server never cuts a handshake this agent still waits for: raise that flag's default with
/// these.
pub const AGENT_TLS_HANDSHAKE: Duration = Duration::from_secs(10);

/// Agent: longest wait for the server's answer to the WebSocket upgrade, its token review
/// included: above the server's [`TOKEN_REVIEW_PATIENCE`], so the agent hears the `503` and
/// its `Retry-After` rather than giving up first.
pub const AGENT_UPGRADE_ANSWER: Duration = Duration::from_secs(10);

/// Agent: after a session ended, how long its tunnel tasks get to notice and finish before the
/// agent stops waiting for them (they hold nothing the ended session still needs).
pub const AGENT_SESSION_TASKS: Duration = Duration::from_secs(5);

/// Server: longest wait for a dialed peer's TCP connection, TLS handshake and upgrade answer,
/// together: a peer is another control-plane node on a near network, and the next round of
/// dialing (`--peer-sync-interval`) tries again.
pub const PEER_CONNECT: Duration = Duration::from_secs(10);

/// Server: longest wait for a peer to accept the view stream, the first stream of a peer
/// session; as [`PEER_CONNECT`], whose session it is.
pub const PEER_VIEW_OPEN: Duration = Duration::from_secs(10);

/// Server: how long a connection waits for its token's review before it is told to come back
/// (`503` with `Retry-After`): below the agent's [`AGENT_UPGRADE_ANSWER`], so the agent hears
/// when.
pub const TOKEN_REVIEW_PATIENCE: Duration = Duration::from_secs(8);

/// Server: how long a token presented while the local verifier starts (keys and watches not in
/// yet) waits for it before it goes to TokenReview. Inside the agent's
/// [`AGENT_UPGRADE_ANSWER`] with room for the rest of the answer; long enough for the first
/// lists of a large cluster made while the returning fleet's handshakes take the server's CPU
/// (each token that gives up costs a TokenReview and a Node GET).
pub const VERIFIER_STARTUP_WAIT: Duration = Duration::from_secs(7);

/// Both: after the grace period, how long what is left (sessions, listeners, watchers) gets to
/// close before the process exits anyway: closing sends a frame or two, never waits on data.
pub const CLOSE: Duration = Duration::from_secs(5);

/// Both: longest a client of the health and admin ports may take to send its request head
/// (probes and scrapes send theirs at once; a connection that never does must not stay).
pub const HEALTH_HEADER_READ: Duration = Duration::from_secs(10);

/// Both: a session's peer is dead after this many `--keepalive-time` intervals with nothing
/// heard: one lost pong is no reason to drop every tunnel, three are.
pub const KEEPALIVE_MISSES: u32 = 3;

/// A session's keepalive from `--keepalive-time`: a ping every `interval`, the session given
/// up after [`KEEPALIVE_MISSES`] of them without a word from the peer.
pub fn keepalive(interval: Duration) -> bridgehead_mux::Keepalive {
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    bridgehead_mux::Keepalive {
        interval_ms,
        timeout_ms: interval_ms.saturating_mul(u64::from(KEEPALIVE_MISSES)),
    }
}

/// Which binary keeps a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Server,
    Agent,
    Both,
}

impl Binary {
    /// As the Deadlines table writes it.
    pub fn name(self) -> &'static str {
        match self {
            Binary::Server => "server",
            Binary::Agent => "agent",
            Binary::Both => "both",
        }
    }
}

/// Where a deadline's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A flag (`--dial-timeout`), its default given in [`Deadline::default`].
    Flag(&'static str),
    /// A flag's value times a constant (the keepalive's silence).
    FlagTimes(&'static str, &'static str, u32),
    /// A constant of this module (or, for the session driver below it, of `bridgehead_mux`; for
    /// the Kubernetes client, which this crate does not use, `bridgehead_kubeapi`'s, its value
    /// held to the row's by `e2e/tests/deadlines.rs`).
    Constant(&'static str),
}

impl Source {
    /// As the Deadlines table writes it.
    pub fn name(self) -> String {
        match self {
            Source::Flag(flag) => format!("`{flag}`"),
            Source::FlagTimes(flag, times, _) => format!("`{flag}` × `{times}`"),
            Source::Constant(name) => format!("`{name}`"),
        }
    }

    /// The flag, and what its default is multiplied by to give the deadline.
    pub fn flag(self) -> Option<(&'static str, u32)> {
        match self {
            Source::Flag(flag) => Some((flag, 1)),
            Source::FlagTimes(flag, _, times) => Some((flag, times)),
            Source::Constant(_) => None,
        }
    }
}

/// One deadline: what it bounds, who keeps it, where its value comes from, its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub what: &'static str,
    pub binary: Binary,
    pub source: Source,
    pub default: Duration,
}

const fn deadline(
    what: &'static str,
    binary: Binary,
    source: Source,
    default: Duration,
) -> Deadline {
    Deadline {
        what,
        binary,
        source,
        default,
    }
}

/// Every deadline of both binaries; docs/architecture.md's Deadlines table, row for row (one
/// line each, as the table has: kept out of rustfmt's way so it reads as one).
#[rustfmt::skip]
pub const DEADLINES: &[Deadline] = &[
    deadline("a CONNECT client's TLS handshake", Server, Flag("--handshake-timeout"), Duration::from_secs(10)),
    deadline("a CONNECT client's head, after its handshake", Server, Flag("--handshake-timeout"), Duration::from_secs(10)),
    deadline("an agent's or peer's TLS handshake and upgrade request", Server, Flag("--agent-handshake-timeout"), Duration::from_secs(20)),
    deadline("a handshake owing bytes keeps its place while another waits", Server, Flag("--agent-handshake-stall"), Duration::from_secs(2)),
    deadline("writing the upgrade answer to an admitted agent or peer", Server, Flag("--handshake-timeout"), Duration::from_secs(10)),
    deadline("a token's review, before `503` with `Retry-After`", Server, Constant("TOKEN_REVIEW_PATIENCE"), TOKEN_REVIEW_PATIENCE),
    deadline("a token waiting for the local verifier to start", Server, Constant("VERIFIER_STARTUP_WAIT"), VERIFIER_STARTUP_WAIT),
    deadline("a tunnel's opening: the first round of peers, the agent's dial, the fallback's answer", Server, Flag("--dial-timeout"), Duration::from_secs(10)),
    deadline("a target's first bytes waiting for the client's", Server, Flag("--target-bytes-hold"), Duration::from_millis(250)),
    deadline("a dialed peer's connection, TLS handshake and upgrade answer", Server, Constant("PEER_CONNECT"), PEER_CONNECT),
    deadline("a peer accepting the view stream", Server, Constant("PEER_VIEW_OPEN"), PEER_VIEW_OPEN),
    deadline("open tunnels after SIGTERM", Server, Flag("--shutdown-grace-period"), Duration::from_secs(30)),
    deadline("the TCP connection to a server", Agent, Constant("AGENT_CONNECT"), AGENT_CONNECT),
    deadline("a server's first answer to the ClientHello", Agent, Constant("AGENT_FIRST_ANSWER"), AGENT_FIRST_ANSWER),
    deadline("the TLS handshake with a server, from its first answer", Agent, Constant("AGENT_TLS_HANDSHAKE"), AGENT_TLS_HANDSHAKE),
    deadline("a server's upgrade answer", Agent, Constant("AGENT_UPGRADE_ANSWER"), AGENT_UPGRADE_ANSWER),
    deadline("an ended session's tunnel tasks", Agent, Constant("AGENT_SESSION_TASKS"), AGENT_SESSION_TASKS),
    deadline("open tunnels after SIGTERM", Agent, Flag("--drain-grace-period"), Duration::from_secs(30)),
    deadline("between pings on a quiet session", Both, Flag("--keepalive-time"), Duration::from_secs(5)),
    deadline("a silent session's peer, before the session ends", Both, FlagTimes("--keepalive-time", "KEEPALIVE_MISSES", KEEPALIVE_MISSES), Duration::from_secs(15)),
    deadline("a closing session's last frames", Both, Constant("CLOSE_FLUSH"), bridgehead_mux::CLOSE_FLUSH),
    deadline("what is left after the grace period", Both, Constant("CLOSE"), CLOSE),
    deadline("a health or admin client's request head", Both, Constant("HEALTH_HEADER_READ"), HEALTH_HEADER_READ),
    deadline("one answer from kube-apiserver (TokenReview, Nodes, Leases)", Both, Constant("REQUEST_TIMEOUT"), Duration::from_secs(5)),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_deadline_is_listed_once() {
        for (i, a) in DEADLINES.iter().enumerate() {
            for b in &DEADLINES[i + 1..] {
                assert!(
                    (a.what, a.binary) != (b.what, b.binary),
                    "{} ({}) listed twice",
                    a.what,
                    a.binary.name()
                );
            }
        }
    }

    #[test]
    fn a_flag_times_a_constant_defaults_to_the_product() {
        for deadline in DEADLINES {
            if let Source::FlagTimes(flag, _, times) = deadline.source {
                let interval = DEADLINES
                    .iter()
                    .find(|d| d.source == Source::Flag(flag) && d.binary == deadline.binary)
                    .unwrap_or_else(|| panic!("{flag} has a row of its own"));
                assert_eq!(
                    interval.default * times,
                    deadline.default,
                    "{}",
                    deadline.what
                );
            }
        }
    }
}
