//! From "a tunnel to `host:port`, please" to a dialed stream: the one tunnel opener the
//! frontend and forwarded tunnels share ([`open`]), the bound on dials in flight
//! ([`admission`]), the registry of own and peers' agents ([`registry`]) over the pure router
//! ([`router`]), the dial ([`dial`]), the proxy CONNECTs no agent matches go to ([`fallback`]),
//! every way a CONNECT is turned down ([`refusal`]), and whether the first round of dialing
//! the peers is over ([`settled`]).
//!
//! Uses only [`crate::process`] (and the shared [`crate::context::Context`], in [`open`]).

pub mod admission;
pub mod dial;
pub mod fallback;
pub mod open;
pub mod refusal;
pub mod registry;
pub mod router;
pub mod settled;
