//! Why a session ended: the one signal every stream, dial and waiter of a session gets.

use std::sync::Arc;
use std::time::Duration;

use bridgehead_proto::session::SessionError;
use bridgehead_proto::DecodeError;

use crate::websocket::{close_code, WsError};

/// How the peer broke the protocol.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Violation {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("a text message")]
    TextMessage,
}

/// Why a session ended. Every stream of the session fails with it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SessionEnd {
    /// The peer broke the protocol (WebSocket close code 1002).
    #[error("protocol error: {0}")]
    Protocol(Violation),
    /// Nothing heard from the peer for the keepalive timeout.
    #[error("peer silent for {0:?}")]
    KeepaliveTimeout(Duration),
    /// Reading from the WebSocket failed.
    #[error("websocket: {0}")]
    WebSocket(Arc<WsError>),
    /// Writing to the WebSocket failed: the transport's fault, not the peer's protocol.
    #[error("writing: {0}")]
    Write(Arc<WsError>),
    /// The peer closed the WebSocket (a close frame).
    #[error("closed by peer")]
    ClosedByPeer,
    /// This end shut the session down.
    #[error("shut down")]
    Shutdown,
    /// This end closed the session ([`crate::Mux::close`]).
    #[error("{0}")]
    Closed(String),
}

impl From<Violation> for SessionEnd {
    fn from(violation: Violation) -> SessionEnd {
        SessionEnd::Protocol(violation)
    }
}

impl SessionEnd {
    /// The close frame this end sends, if the WebSocket can still carry one.
    pub(crate) fn close_code(&self) -> Option<u16> {
        match self {
            SessionEnd::Protocol(_) => Some(close_code::PROTOCOL),
            SessionEnd::Shutdown | SessionEnd::Closed(_) => Some(close_code::AWAY),
            // The peer's close is answered, completing the closing handshake.
            SessionEnd::KeepaliveTimeout(_) | SessionEnd::ClosedByPeer => Some(close_code::NORMAL),
            SessionEnd::WebSocket(_) | SessionEnd::Write(_) => None,
        }
    }

    /// Whether this is how a session is expected to end (not an error).
    pub(crate) fn is_orderly(&self) -> bool {
        matches!(
            self,
            SessionEnd::ClosedByPeer | SessionEnd::Shutdown | SessionEnd::Closed(_)
        )
    }
}
