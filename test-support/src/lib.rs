//! What the Bridgehead crates' tests share, so that no test file carries its own copy: the
//! bound every async test runs under ([`bounded`]) and a pair of multiplexer sessions over an
//! in-memory pipe ([`MuxPair`]).
//!
//! A dev-dependency only: nothing here is in a binary. Not here: the end-to-end harness
//! (processes, PKI, network namespaces), which is `bridgehead-e2e`.

use std::future::Future;
use std::time::Duration;

use bridgehead_mux::{Keepalive, Mux, WebSocket, WsRole};
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

/// Every async test fails after this long instead of hanging the suite.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a test body under [`TEST_TIMEOUT`]; panics ("test timed out") when it runs longer.
pub async fn bounded<F: Future>(body: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, body)
        .await
        .expect("test timed out")
}

/// A server session and an agent session connected over an in-memory pipe, each driven in a
/// task of its own with the default keepalive until `shutdown` fires (or the session ends).
#[derive(Debug, Clone)]
pub struct MuxPair {
    /// The server's end: it opens streams.
    pub server: Mux,
    /// The agent's end: it accepts the server's dials.
    pub agent: Mux,
}

impl MuxPair {
    /// Default sessions over a pipe holding `pipe` bytes each way.
    pub fn new(pipe: usize, shutdown: &CancellationToken) -> MuxPair {
        MuxPair::connect(Mux::server(), Mux::agent(), pipe, shutdown)
    }

    /// `server` and `agent`, made by the caller (a session config of its choosing), connected
    /// over a pipe holding `pipe` bytes each way and driven until `shutdown`.
    pub fn connect(server: Mux, agent: Mux, pipe: usize, shutdown: &CancellationToken) -> MuxPair {
        let (a, b) = tokio::io::duplex(pipe);
        let ends = [
            (
                server.clone(),
                WebSocket::new(a, WsRole::Server, Bytes::new()),
            ),
            (
                agent.clone(),
                WebSocket::new(b, WsRole::Client, Bytes::new()),
            ),
        ];
        for (mux, ws) in ends {
            let shutdown = shutdown.clone();
            tokio::spawn(async move { mux.run(ws, Keepalive::default(), shutdown).await });
        }
        MuxPair { server, agent }
    }
}
