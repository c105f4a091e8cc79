//! The tunnel opener: the one path from "a tunnel to `host:port`, please" to a dialed stream,
//! for both who ask — a CONNECT client of this server's frontend ([`Origin::Client`]) and a
//! peer server forwarding its client's tunnel to one of this server's agents
//! ([`Origin::Peer`]).
//!
//! It owns, in this order: the memory budget and the pending-dial admission, the route, the
//! wait for the first round of peers, the dial (or `--fallback-proxy`), one deadline over all
//! of these, each wait raced with the requester leaving, and reporting the outcome (the
//! metrics of a CONNECT, the log line of a refusal). The callers own their socket and their
//! answer: the frontend reads and parses the CONNECT head, answers `200` or the refusal's
//! status and reason, and splices; a forwarded tunnel parses the peer's dial request, answers
//! the stream accepted or rejected with a code, and pumps.
//!
//! What differs by [`Origin`], each a difference of the requester, not of the path:
//! - Routing: a client's tunnel may go to a peer's agent; a peer's only to this server's own,
//!   so that no tunnel is forwarded twice (no loops between servers).
//! - The first round of peers: a server that just started knows its peers' agents a moment
//!   later, so a client's tunnel that finds no agent waits for it; a peer's, which may not use
//!   peers' agents, has nothing to wait for.
//! - The deadline: `--dial-timeout`; for a peer also no later than the forwarding server's own
//!   deadline, which its dial request carries.
//! - The fallback proxy: a client's only. A peer forwarded the tunnel for an agent of this
//!   server's; if there is none any more, the forwarding server answers its client.
//! - Counting: a CONNECT is counted (dials by result, dial duration, ANP's dial failures,
//!   forwarded tunnels, fallback dials) once, by the server its client reached; a forwarded
//!   tunnel is counted as a peer's tunnel where it is accepted, and its refusals are logged at
//!   debug, since the forwarding server reports them to its client and its operator.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bridgehead_mux::MuxStream;
use bridgehead_proto::ErrorCode;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::context::Context;
use crate::process::metrics::DialResult;
use crate::routing::admission::ClientKey;
use crate::routing::dial::{self, Deadline};
use crate::routing::fallback::Relayed;
use crate::routing::refusal::Refusal;
use crate::routing::registry::RouteError;
use crate::routing::router::Target;

#[cfg(test)]
mod tests;

/// Who asks for a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A CONNECT client of this server's frontend.
    Client,
    /// A peer server forwarding a tunnel, which it waits for `timeout` from its request.
    Peer { timeout: Duration },
}

impl Origin {
    /// Whether the tunnel may go to a peer's agent, and so waits for the first round of peers.
    fn may_forward(self) -> bool {
        self == Origin::Client
    }

    /// Whether the tunnel may go to `--fallback-proxy` when no agent takes it.
    fn may_fall_back(self) -> bool {
        self == Origin::Client
    }

    /// Whether this server counts the tunnel as a CONNECT.
    fn counted_here(self) -> bool {
        self == Origin::Client
    }

    /// How long the tunnel may take to open, with `--dial-timeout` `dial_timeout`.
    fn timeout(self, dial_timeout: Duration) -> Duration {
        match self {
            Origin::Client => dial_timeout,
            Origin::Peer { timeout } => timeout.min(dial_timeout),
        }
    }
}

/// A dialed tunnel, not answered yet.
#[derive(Debug)]
pub struct Opened {
    pub via: Via,
    /// The agent that dialed it (or the fallback proxy).
    pub agent: String,
    /// The peer server that carried it to the agent, when the agent is not this server's.
    pub forwarded: Option<Arc<str>>,
}

/// What carries a tunnel.
#[derive(Debug)]
pub enum Via {
    /// A stream on an agent's session.
    Agent(MuxStream),
    /// `--fallback-proxy`, when no agent matched (a client's tunnel only).
    Fallback(Relayed),
}

impl Via {
    /// Fails the tunnel: the agent's stream is reset; the fallback's connection is closed.
    pub fn reset(self, why: &'static str) {
        if let Via::Agent(stream) = self {
            stream.reset(ErrorCode::ConnectionReset, why);
        }
    }
}

/// Why no tunnel was opened: already counted and logged; the caller only answers.
#[derive(Debug)]
pub enum Unopened {
    /// Turned down: the caller answers with it.
    Refused(Refusal),
    /// The requester left while a step waited: there is nobody to answer.
    Gone,
}

/// The waits the requester may leave during.
#[derive(Debug, Clone, Copy)]
enum Wait {
    Peers,
    Dial,
    Fallback,
}

/// A tunnel asked for. The opener borrows it: an async fn holds each argument it takes by
/// value for its whole life.
#[derive(Debug)]
pub struct Request<'a> {
    pub origin: Origin,
    pub target: &'a Target,
    /// The key its pending dials count under.
    pub client: ClientKey,
}

/// Opens the tunnel `request` asks for, or says why not. `gone` resolves when the requester
/// leaves (the client closes its connection, the forwarding server resets its stream); every
/// wait is raced with it. The caller pins it, and it may borrow the caller's socket: taken by
/// value, it would be held twice in this future's state (as argument and as pinned local).
pub async fn open<G: Future<Output = ()>>(
    ctx: &Context,
    request: &Request<'_>,
    gone: Pin<&mut G>,
) -> Result<Opened, Unopened> {
    let origin = request.origin;
    let span = tracing::Span::current();
    span.record("target", tracing::field::display(request.target));
    let opened = admit_and_dial(ctx, request, gone).await;
    match &opened {
        Ok(opened) => {
            span.record("agent", tracing::field::display(&opened.agent));
            if origin.counted_here() {
                ctx.metrics.routing.dial(DialResult::Ok);
            }
        }
        Err(Unopened::Refused(refusal)) => report(ctx, origin, refusal),
        Err(Unopened::Gone) => {}
    }
    opened
}

/// Counts and logs a refusal of a tunnel `origin` asked for, wherever it arose (the opener's
/// steps, or the caller's parsing of the request).
pub fn report(ctx: &Context, origin: Origin, refusal: &Refusal) {
    if !origin.counted_here() {
        return debug!(error = %refusal, "forwarded tunnel refused");
    }
    ctx.metrics.routing.dial(refusal.result());
    let status = refusal.status();
    if status.is_server_error() {
        info!(%status, error = %refusal, "CONNECT failed");
    } else {
        debug!(%status, error = %refusal, "CONNECT refused");
    }
}

/// The steps: budget, admission, route (after the first round of peers when that may help),
/// dial or fallback. The admission slot is held until the dial is answered.
async fn admit_and_dial<G: Future<Output = ()>>(
    ctx: &Context,
    request: &Request<'_>,
    mut gone: Pin<&mut G>,
) -> Result<Opened, Unopened> {
    let Request {
        origin,
        target,
        ref client,
    } = *request;
    let deadline = Deadline::after(origin.timeout(ctx.config.routing.dial_timeout));
    if !ctx.memory.budget.admit() {
        return Err(Unopened::Refused(Refusal::MemoryBudget {
            buffered: ctx.memory.budget.buffered(),
            limit: ctx.memory.budget.limit(),
        }));
    }
    let _slot = ctx.admission.admit(client).map_err(Unopened::Refused)?;
    let started = Instant::now();
    let route = |target: &Target| {
        if origin.may_forward() {
            ctx.registry.route(&target.host)
        } else {
            ctx.registry.route_local(&target.host)
        }
    };
    let mut routed = route(target);
    if origin.may_forward()
        && matches!(routed, Err(RouteError::NoRoute(_)))
        && !ctx.peers_settled.is_settled()
    {
        tokio::select! {
            _ = ctx.peers_settled.wait(deadline.remaining()) => {}
            () = gone.as_mut() => return Err(left(ctx, origin, Wait::Peers)),
        }
        routed = route(target);
    }
    let opened = match routed {
        Ok(candidates) => {
            let dialed = tokio::select! {
                dialed = dial::dial(candidates, target, deadline) => dialed,
                () = gone.as_mut() => return Err(left(ctx, origin, Wait::Dial)),
            };
            let dialed = dialed.map_err(Unopened::Refused)?;
            if let Some(peer) = dialed.via.as_deref().filter(|_| origin.counted_here()) {
                ctx.metrics.peering.forwarded(peer);
            }
            Opened {
                via: Via::Agent(dialed.stream),
                agent: dialed.agent,
                forwarded: dialed.via,
            }
        }
        Err(no_agent) => {
            let Some(fallback) = ctx.fallback.as_ref().filter(|_| origin.may_fall_back()) else {
                return Err(Unopened::Refused(Refusal::from(no_agent)));
            };
            let relayed = tokio::select! {
                relayed = fallback.relay(target, deadline) => relayed,
                () = gone.as_mut() => return Err(left(ctx, origin, Wait::Fallback)),
            };
            let relayed = relayed
                .inspect_err(|error| ctx.metrics.routing.fallback_dial(error.label()))
                .map_err(|error| Unopened::Refused(error.into()))?;
            ctx.metrics.routing.fallback_dial("ok");
            Opened {
                via: Via::Fallback(relayed),
                agent: format!("fallback {}", fallback.url()),
                forwarded: None,
            }
        }
    };
    if origin.counted_here() {
        ctx.metrics.routing.dialed(started.elapsed().as_secs_f64());
    }
    Ok(opened)
}

/// The requester left during `wait`: logged, and for a client whose dial was pending counted
/// as ANP counts it. Dropping the dial resets its stream (the agent stops dialing) and frees
/// the admission slot at once.
fn left(ctx: &Context, origin: Origin, wait: Wait) -> Unopened {
    let during = match wait {
        Wait::Peers => "while the server learned its peers' agents",
        Wait::Dial => "while its dial was pending",
        Wait::Fallback => "while the fallback proxy dialed",
    };
    if !origin.counted_here() {
        debug!("the forwarding server gave up {during}");
        return Unopened::Gone;
    }
    if let Wait::Dial = wait {
        ctx.metrics.routing.anp_dial_failure("frontend_close");
    }
    debug!("client left {during}");
    Unopened::Gone
}
