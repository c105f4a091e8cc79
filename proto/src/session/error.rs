//! Why the session refused a local operation or gave up on the peer.

use super::Role;
use crate::frame::StreamId;

/// Why a local operation on a stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("stream {0} does not exist")]
    Gone(StreamId),
    #[error("stream {0} is not open yet")]
    NotOpen(StreamId),
    #[error("stream {0} already finished sending")]
    Finished(StreamId),
}

/// Why the server could not open a stream on this session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("the agent is draining")]
    Draining,
    #[error("the session carries its limit of {0} streams")]
    TooManyStreams(usize),
    #[error("the session used every stream id")]
    IdsExhausted,
    #[error("only the server opens streams")]
    NotServer,
}

/// A frame that breaks the session's rules: the session must be closed (WebSocket close code
/// 1002, protocol error) and every stream fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("decoding a frame: {0}")]
    Decode(#[from] crate::DecodeError),
    #[error("a {0} frame is not allowed towards the {1:?}")]
    WrongDirection(&'static str, Role),
    #[error("frame for stream {0}, which was never opened")]
    UnknownStream(StreamId),
    #[error("DIAL for stream {0}, not above the last stream id {1}")]
    StreamIdReused(StreamId, StreamId),
}
