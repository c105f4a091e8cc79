//! The multiplexer: runs a [`bridgehead_proto::session::Session`] over a WebSocket with tokio.
//!
//! A [`Mux`] is a cheap handle to one session. [`Mux::serve`] drives the WebSocket with one
//! reader, one writer and one timer until it ends, with the keepalive, shutdown and drain
//! handling a [`Serve`] describes; meanwhile the server side calls [`Mux::open`] to get a
//! [`MuxStream`] per tunnel and the agent side takes [`DialRequest`]s from [`Mux::accept`].
//! [`splice::splice`] copies bytes between a stream and a socket, with half-close and
//! per-stream flow control. A session's end is one [`SessionEnd`], which every stream and
//! waiting dial of it gets. [`memory`] owns what tunnels may hold: the budget, the sockets'
//! kernel buffers and what they earn, the largest window ([`memory::TunnelMemory`]).
//!
//! The modules, in the order a frame leaves: `splice` (a socket to a stream), `mux` (the
//! handle), `stream` (one tunnel's end), `driver` (the session's state, its reader, writer and
//! timer), `outbox` (the sending side, batching frames into messages), `websocket` (RFC 6455
//! framing). Beside them, used by those before: `slot` (per-stream wake-ups), `end` (why a
//! session ended) and `branches` (the driver's futures, each polled only when woken). No
//! module imports one before it in that order.
//!
//! Not here: TLS, HTTP, routing, metrics. Those belong to the server and the agent.

mod branches;
mod driver;
mod end;
pub mod memory;
mod mux;
mod outbox;
mod slot;
pub mod splice;
mod stream;
pub mod websocket;

pub use bridgehead_proto::session::Keepalive;
pub use driver::CLOSE_FLUSH;
pub use end::{SessionEnd, Violation};
pub use mux::{Mux, Serve};
pub use outbox::SESSION_TLS_BUFFER;
pub use stream::{DialRequest, MuxStream, OpenFailure, StreamEnd};
pub use websocket::{Role as WsRole, WebSocket, WsError, MAX_MESSAGE};
