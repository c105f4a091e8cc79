//! The multiplexer: runs a [`bridgehead_proto::session::Session`] over a WebSocket with tokio.
//!
//! A [`Mux`] is a cheap handle to one session. [`Mux::run`] drives the WebSocket with one
//! reader and one writer (plus keepalive) until it ends; meanwhile the server side calls
//! [`Mux::open`] to get a [`MuxStream`] per tunnel and the agent side takes [`DialRequest`]s
//! from [`Mux::accept`]. [`splice::splice`] copies bytes between a stream and a socket, with
//! half-close and per-stream flow control.
//!
//! The session state sits behind one `std::sync::Mutex` per WebSocket, held for the few
//! hundred nanoseconds a state transition takes and never across an `.await` — the design of
//! quinn, whose pure `quinn-proto` state is driven the same way. Wake-ups go through one
//! reader and writer waker per stream, left in the state under the same lock, so a stalled
//! stream never delays the others.
//!
//! Not here: TLS, HTTP, routing, metrics. Those belong to the server and the agent.

mod branches;
mod driver;
mod session_state;
pub mod splice;
mod stream;
pub mod websocket;

use std::sync::Arc;
use std::time::Duration;

use bridgehead_proto::session::{OpenError, Role, SessionConfig};
use bridgehead_proto::ErrorCode;

pub use branches::Branches;
pub use driver::{Keepalive, SessionEnd, Violation, MAX_MESSAGE, SESSION_TLS_BUFFER};
pub use stream::{DialRequest, MuxStream, StreamEnd};
pub use websocket::{Role as WsRole, WebSocket, WsError};

use session_state::SessionState;

/// Handle to one multiplexed session. Clones share the session.
#[derive(Debug, Clone)]
pub struct Mux {
    shared: Arc<SessionState>,
}

/// Why [`Mux::open`] produced no stream.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OpenFailure {
    /// The agent answered DIAL_ERR (or reset the dialing stream).
    #[error("agent could not dial: {code}: {message}")]
    Dial { code: ErrorCode, message: String },
    /// No answer before the deadline.
    #[error("agent did not answer the dial within {0:?}")]
    TimedOut(Duration),
    /// The session refused to open a stream (draining, stream limit).
    #[error("{0}")]
    Refused(OpenError),
    /// The session ended before the agent answered.
    #[error("agent session ended: {0}")]
    SessionClosed(SessionEnd),
}

impl Mux {
    /// A session for `config.role`; call [`Mux::run`] with its WebSocket to drive it.
    pub fn new(config: SessionConfig) -> Mux {
        Mux {
            shared: Arc::new(SessionState::new(config)),
        }
    }

    /// A server-side session with default settings.
    pub fn server() -> Mux {
        Mux::new(SessionConfig::new(Role::Server))
    }

    /// An agent-side session with default settings.
    pub fn agent() -> Mux {
        Mux::new(SessionConfig::new(Role::Agent))
    }

    /// Records the runtime this session's driver runs on (a shard of its own), so that
    /// whoever splices one of its streams can do so on the same thread
    /// ([`MuxStream::home`]). The first call counts.
    pub fn set_home(&self, home: tokio::runtime::Handle) {
        let _ = self.shared.home.set(home);
    }

    /// Streams currently open or dialing: the load the router balances on.
    pub fn open_streams(&self) -> usize {
        self.shared.open_streams()
    }

    /// Streams open or dialing, and of those the dials waiting for the agent's answer.
    pub fn load(&self) -> (usize, usize) {
        self.shared.load()
    }

    /// Whether the peer announced that it drains.
    pub fn peer_draining(&self) -> bool {
        self.shared.peer_draining()
    }

    /// Resolves when the session has ended, with the reason.
    pub async fn closed(&self) -> SessionEnd {
        self.shared.closed().await
    }

    /// Resolves when the peer announces DRAIN (or the session ends).
    pub async fn peer_drained(&self) {
        self.shared.peer_drained().await
    }

    /// Announces DRAIN to the peer.
    pub fn drain(&self) {
        self.shared.drain();
    }

    /// Ends the session now: every stream fails, the driver closes the WebSocket.
    pub fn close(&self, reason: &str) {
        self.shared.close(SessionEnd::Closed(reason.to_owned()));
    }

    /// Server: asks the agent to dial `host:port` and waits for its answer, at most `timeout`.
    pub async fn open(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<MuxStream, OpenFailure> {
        stream::open(&self.shared, host, port, timeout).await
    }

    /// Agent: the next dial the server asks for, or `None` once the session ended.
    pub async fn accept(&self) -> Option<DialRequest> {
        stream::accept(&self.shared).await
    }
}
