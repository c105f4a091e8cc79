//! The Bridgehead wire protocol, with no I/O: no tokio, no sockets, no clock.
//!
//! - [`budget`]: the memory budget for buffered tunnel data and the window policy under it.
//! - [`frame`]: the frames carried in WebSocket binary messages, their encoding and decoding.
//! - [`ErrorCode`]: why a dial failed or a stream was reset.
//! - [`host`]: host names and `host:port` (one DNS-name check, IPv6 brackets).
//! - [`ident`]: agent identifiers, the query string an agent announces itself with.
//! - [`servers`]: the headers that let an agent hold one session per server behind one
//!   address.
//! - [`text`]: peer-supplied text made safe for logs and answers.
//! - [`session`]: the per-session stream state machine with credit-based flow control; the
//!   async crates feed it received frames and local events and carry out what it returns.
//!
//! The byte-level specification is `docs/protocol.md`. Time is passed in by the caller as
//! milliseconds on any monotonic clock.

pub mod budget;
pub mod error_code;
pub mod frame;
pub mod host;
pub mod ident;
pub mod servers;
pub mod session;
pub mod text;

pub use error_code::ErrorCode;
pub use frame::{DecodeError, Frame, StreamId};

/// The WebSocket subprotocol naming this version of the protocol.
pub const SUBPROTOCOL: &str = "bridgehead.v1";

/// The WebSocket subprotocol servers speak to each other on the peer port: this version's
/// frames and streams, with stream [`VIEW_STREAM`] reserved (docs/protocol.md §1.2). Agents
/// never speak it; a server's agent port refuses it and its peer port refuses
/// [`SUBPROTOCOL`].
pub const PEER_SUBPROTOCOL: &str = "bridgehead-peer.v1";

/// In a [`PEER_SUBPROTOCOL`] session, the first stream the dialing server opens: the answering
/// server's view of its agents, whatever its DIAL names. Every other stream is a tunnel.
pub const VIEW_STREAM: StreamId = 1;
