//! The agents' side of the server: the agent port's accept loop and sessions ([`endpoint`]),
//! the handshake admission in front of them ([`admission`], the peer port's too), the
//! WebSocket upgrade both ports take ([`upgrade`]), who an agent is and what it may announce
//! ([`auth`]), and the end of sessions whose token turned invalid ([`revocation`]).
//!
//! Uses [`crate::routing`] (an agent's session is registered there) and [`crate::process`];
//! never the frontend or peering, which come before it.

pub mod admission;
pub mod auth;
pub mod endpoint;
pub mod revocation;
pub mod upgrade;
