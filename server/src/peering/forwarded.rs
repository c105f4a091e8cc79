//! One tunnel a peer forwarded to this server: its dial request parsed, the tunnel opened by
//! the opener the frontend uses too ([`crate::routing::open`], as [`Origin::Peer`]: this server's own
//! agents only, never forwarded again, within the forwarding server's deadline), answered as
//! this server would answer a CONNECT, then pumped stream to stream under both streams' flow
//! control.

use std::sync::Arc;

use bridgehead_mux::{DialRequest, MuxStream, StreamEnd};
use bridgehead_proto::ErrorCode;
use tracing::debug;

use crate::context::Context;
use crate::routing::admission::ClientKey;
use crate::routing::open::{self, Opened, Origin, Request, Unopened, Via};
use crate::routing::refusal::Refusal;
use crate::routing::router::Target;

/// One forwarded tunnel: parsed, opened, answered, then pumped.
pub(super) async fn forwarded(
    request: DialRequest,
    ctx: Arc<Context>,
    client: ClientKey,
    _tunnel: tokio_util::task::task_tracker::TaskTrackerToken,
) {
    let origin = Origin::Peer {
        timeout: request.timeout,
    };
    let authority = bridgehead_proto::host::HostPort(&request.host, request.port).to_string();
    let target = match Target::parse(&authority) {
        Ok(target) => target,
        Err(bad) => {
            let refusal = Refusal::BadTarget(bad);
            open::report(&ctx, origin, &refusal);
            return reject(request, &refusal);
        }
    };
    let asked = Request {
        origin,
        target: &target,
        client,
    };
    let opened = open::open(&ctx, &asked, std::pin::pin!(request.cancelled())).await;
    let agent = match opened {
        Ok(Opened {
            via: Via::Agent(stream),
            ..
        }) => stream,
        // The opener relays only a CONNECT client's tunnel to the fallback proxy.
        Ok(Opened {
            via: via @ Via::Fallback(_),
            ..
        }) => {
            via.reset("a forwarded tunnel has no fallback");
            return request.reject(ErrorCode::Internal, "a forwarded tunnel has no fallback");
        }
        Err(Unopened::Refused(refusal)) => return reject(request, &refusal),
        Err(Unopened::Gone) => return,
    };
    let Ok(peer) = request.accept() else {
        return debug!("the forwarding server gave up before the dial finished");
    };
    pump(&peer, &agent).await;
}

/// Rejects the forwarded dial with `refusal`'s code and message.
fn reject(request: DialRequest, refusal: &Refusal) {
    let (code, message) = answer(refusal);
    request.reject(code, &message);
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
