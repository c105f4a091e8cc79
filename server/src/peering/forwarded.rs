//! One tunnel a peer forwarded to this server: routed among this server's own agents (never
//! forwarded again), dialed within the forwarding server's deadline, answered as this server
//! would answer a CONNECT, then pumped stream to stream under both streams' flow control.

use std::sync::Arc;

use bridgehead_mux::{DialRequest, MuxStream, StreamEnd};
use bridgehead_proto::ErrorCode;
use tracing::debug;

use crate::admission::ClientKey;
use crate::context::Context;
use crate::dial;
use crate::refusal::Refusal;
use crate::router::Target;

/// One forwarded tunnel: routed among this server's own agents (never forwarded again),
/// dialed within the forwarding server's deadline, answered, then pumped.
pub(super) async fn forwarded(
    request: DialRequest,
    ctx: Arc<Context>,
    client: ClientKey,
    _tunnel: tokio_util::task::task_tracker::TaskTrackerToken,
) {
    let admitted = if ctx.memory.budget.admit() {
        ctx.admission.admit(&client)
    } else {
        Err(Refusal::MemoryBudget {
            buffered: ctx.memory.budget.buffered(),
            limit: ctx.memory.budget.limit(),
        })
    };
    // Held while the dial is pending, as a CONNECT's is.
    let slot = match admitted {
        Ok(slot) => slot,
        Err(refusal) => {
            let (code, message) = answer(&refusal);
            return request.reject(code, &message);
        }
    };
    let authority = bridgehead_proto::host::HostPort(&request.host, request.port).to_string();
    let dialed = match Target::parse(&authority) {
        Ok(target) => match ctx.registry.route_local(&target.host) {
            Ok(candidates) => {
                let timeout = request.timeout.min(ctx.config.routing.dial_timeout);
                tokio::select! {
                    dialed = dial::dial(candidates, &target, timeout) => dialed,
                    () = request.cancelled() => return debug!("the forwarding server gave up"),
                }
            }
            Err(error) => Err(Refusal::from(error)),
        },
        Err(bad) => Err(Refusal::BadTarget(bad)),
    };
    drop(slot);
    let agent = match dialed {
        Ok(dialed) => dialed.stream,
        Err(refusal) => {
            let (code, message) = answer(&refusal);
            debug!(%refusal, "forwarded dial failed");
            return request.reject(code, &message);
        }
    };
    let Ok(peer) = request.accept() else {
        return debug!("the forwarding server gave up before the dial finished");
    };
    pump(&peer, &agent).await;
}

/// The code and message a failed forwarded dial answers with, so that the forwarding server
/// answers its client what this server would have.
fn answer(refusal: &Refusal) -> (ErrorCode, String) {
    let code = match refusal {
        Refusal::Dial { code, .. } => *code,
        Refusal::TimedOut { .. } => ErrorCode::TimedOut,
        Refusal::AgentLost { .. } => ErrorCode::ConnectionReset,
        Refusal::Overloaded(_) | Refusal::ClientOverloaded(_) | Refusal::MemoryBudget { .. } => {
            ErrorCode::Overloaded
        }
        // No agent (or none with room) here any more: the view is a moment behind.
        _ => ErrorCode::Draining,
    };
    let message = match refusal {
        Refusal::Dial { message, .. } => message.clone(),
        other => other.to_string(),
    };
    (code, message)
}

/// Both directions between two streams, each under its own streams' flow control: a chunk is
/// read only once the previous one was written, so a slow reader on one side holds back only
/// this tunnel. An end passes through as it came: FIN as FIN, a reset as a reset.
async fn pump(a: &MuxStream, b: &MuxStream) {
    let (up, down) = tokio::join!(one_way(a, b), one_way(b, a));
    if let Err(end) = up.and(down) {
        a.reset(end.code, &end.reason);
        b.reset(end.code, &end.reason);
    }
}

async fn one_way(from: &MuxStream, to: &MuxStream) -> Result<(), StreamEnd> {
    loop {
        match from.read().await {
            Ok(Some(chunk)) => {
                if let Err(end) = to.write(chunk).await {
                    from.reset(end.code, &end.reason);
                    return Err(end);
                }
            }
            Ok(None) => return to.finish(),
            Err(end) => {
                to.reset(end.code, &end.reason);
                return Err(end);
            }
        }
    }
}
