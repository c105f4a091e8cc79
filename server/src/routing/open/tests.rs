//! The opener as each of its callers asks it: what a CONNECT client's tunnel may use that a
//! peer's forwarded tunnel may not (a peer's agents, the wait for the first round of peers,
//! the fallback proxy), whose deadline a dial has, what is counted, and that a requester who
//! leaves cancels the dial. Sessions are in-process pairs behind a real registry.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bridgehead_mux::{DialRequest, Mux};
use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_test_support::{bounded, MuxPair};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::routing::fallback::{Fallback, FallbackConfig, FallbackDestinations};
use crate::routing::registry::Registration;
use crate::test_util::{metric, test_context};

const PEER: Origin = Origin::Peer {
    timeout: Duration::from_secs(30),
};

fn client() -> ClientKey {
    ClientKey::from(&b"test client"[..])
}

fn target() -> Target {
    Target::parse("node-1:10250").unwrap()
}

/// A context whose `--dial-timeout` is `dial_timeout`, changed by `change` before it is
/// shared.
fn context(dial_timeout: Duration, change: impl FnOnce(&mut Context)) -> Arc<Context> {
    let mut ctx = test_context();
    let inner = Arc::get_mut(&mut ctx).unwrap();
    inner.config.routing.dial_timeout = dial_timeout;
    change(inner);
    ctx
}

/// Registers `mux` as this server's agent `agent-1`, taking every target.
fn register_own(ctx: &Context, mux: Mux) {
    ctx.registry
        .register(Registration {
            name: "agent-1".to_owned(),
            identity: "agent-1".to_owned(),
            identifiers: AgentIdentifiers::default(),
            peer: SocketAddr::from(([127, 0, 0, 1], 1)),
            mux,
        })
        .unwrap();
}

/// Adds peer server `s2` over `mux`, holding one agent (`far`) that takes every target.
fn add_peer(ctx: &Context, mux: Mux) {
    let (session, _) = ctx.registry.add_peer("s2", mux);
    let far = AgentIdentifiers::parse("id=far").unwrap();
    ctx.registry.set_peer_agent("s2", session, 7, &far, false);
}

async fn next_dial(agent: &Mux) -> DialRequest {
    agent.accept().await.expect("a dial request")
}

fn dials(ctx: &Context, result: &str) -> f64 {
    metric(
        ctx,
        &format!("bridgehead_server_dials_total{{result=\"{result}\"}}"),
    )
}

/// Opens for `origin`, with a requester that never leaves.
async fn open_for(ctx: &Context, origin: Origin) -> Result<Opened, Unopened> {
    let target = target();
    let request = Request {
        origin,
        target: &target,
        client: client(),
    };
    open(ctx, &request, std::pin::pin!(std::future::pending())).await
}

fn refusal(opened: Result<Opened, Unopened>) -> Refusal {
    match opened {
        Err(Unopened::Refused(refusal)) => refusal,
        other => panic!("not refused: {other:?}"),
    }
}

/// A client's tunnel goes to a peer's agent when this server has none; a peer's forwarded
/// tunnel never does (it would be forwarded a second time), and takes this server's own.
#[tokio::test]
async fn a_forwarded_tunnel_is_never_forwarded_again() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let ctx = context(Duration::from_secs(30), |_| {});
        let MuxPair { server, agent } = MuxPair::new(64 * 1024, &shutdown);
        add_peer(&ctx, server);

        let peer_side = tokio::spawn(async move {
            let request = next_dial(&agent).await;
            (request.accept().unwrap(), agent)
        });
        let opened = open_for(&ctx, Origin::Client).await.unwrap();
        assert_eq!(
            (opened.agent.as_str(), opened.forwarded.as_deref()),
            ("far", Some("s2"))
        );
        let _stream = peer_side.await.unwrap();

        let refused = refusal(open_for(&ctx, PEER).await);
        assert!(matches!(refused, Refusal::NoAgent(_)), "{refused}");

        let MuxPair { server, agent } = MuxPair::new(64 * 1024, &shutdown);
        register_own(&ctx, server);
        let own_side = tokio::spawn(async move { next_dial(&agent).await.accept().unwrap() });
        let opened = open_for(&ctx, PEER).await.unwrap();
        assert_eq!((opened.agent.as_str(), opened.forwarded), ("agent-1", None));
        let _stream = own_side.await.unwrap();
        shutdown.cancel();
    })
    .await
}

/// A server that has not yet heard from its peers holds a client's tunnel that finds no
/// agent, and relays it to `--fallback-proxy` in the end; a peer's forwarded tunnel, which may
/// use neither, is refused at once (its forwarding server answers its client). The paused
/// clock shows "at once": any wait would have moved it.
#[tokio::test(start_paused = true)]
async fn a_forwarded_tunnel_waits_for_no_peers_and_never_falls_back() {
    bounded(async {
        let (settle, settled) = crate::routing::settled::Settled::new();
        let dial_timeout = Duration::from_secs(10);
        let ctx = context(dial_timeout, |ctx| {
            ctx.peers_settled = settled;
            let nowhere = FallbackConfig::Unix("/nonexistent/fallback.sock".into());
            let fallback = Fallback::new(nowhere, &FallbackDestinations::default());
            ctx.fallback = Some(fallback.unwrap());
        });

        let started = Instant::now();
        let refused = refusal(open_for(&ctx, PEER).await);
        assert!(matches!(refused, Refusal::NoAgent(_)), "{refused}");
        assert_eq!(started.elapsed(), Duration::ZERO);

        let refused = refusal(open_for(&ctx, Origin::Client).await);
        assert!(matches!(refused, Refusal::Fallback(_)), "{refused}");
        assert_eq!(started.elapsed(), dial_timeout, "waited for the peers");
        drop(settle);
    })
    .await
}

/// A peer's dial ends at the forwarding server's deadline or at this server's
/// `--dial-timeout`, whichever comes first, and its refusal names the one that ended it.
#[tokio::test(start_paused = true)]
async fn a_forwarded_dial_has_the_sooner_of_both_servers_deadlines() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let ctx = context(Duration::from_secs(10), |_| {});
        let MuxPair { server, agent } = MuxPair::new(64 * 1024, &shutdown);
        register_own(&ctx, server);
        let silent = tokio::spawn(async move {
            for _ in 0..2 {
                next_dial(&agent).await.cancelled().await;
            }
            agent
        });
        for (forwarding, ended) in [(3, 3), (60, 10)] {
            let origin = Origin::Peer {
                timeout: Duration::from_secs(forwarding),
            };
            let ended = Duration::from_secs(ended);
            let started = Instant::now();
            let refused = refusal(open_for(&ctx, origin).await);
            assert!(
                matches!(refused, Refusal::TimedOut { timeout, .. } if timeout == ended),
                "{refused}"
            );
            assert_eq!(started.elapsed(), ended);
        }
        let _agent = silent.await.unwrap();
        shutdown.cancel();
    })
    .await
}

/// A CONNECT is counted by the server its client reached: a client's tunnels, opened or
/// refused, count among the dials; a peer's forwarded ones do not (its forwarding server
/// counts them).
#[tokio::test]
async fn only_a_clients_tunnels_count_as_dials() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let ctx = context(Duration::from_secs(30), |_| {});
        let _ = refusal(open_for(&ctx, Origin::Client).await);
        let _ = refusal(open_for(&ctx, PEER).await);
        assert_eq!(dials(&ctx, "no_agent"), 1.0);

        let MuxPair { server, agent } = MuxPair::new(64 * 1024, &shutdown);
        register_own(&ctx, server);
        let accepting = tokio::spawn(async move {
            let first = next_dial(&agent).await.accept().unwrap();
            let second = next_dial(&agent).await.accept().unwrap();
            (first, second, agent)
        });
        let _client = open_for(&ctx, Origin::Client).await.unwrap();
        let _peer = open_for(&ctx, PEER).await.unwrap();
        let _streams = accepting.await.unwrap();
        assert_eq!(dials(&ctx, "ok"), 1.0);
        shutdown.cancel();
    })
    .await
}

/// A requester that leaves while its dial is pending cancels it (the agent hears it) and
/// frees its admission slot, whoever it is.
#[tokio::test]
async fn a_requester_that_leaves_cancels_its_dial() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let ctx = context(Duration::from_secs(30), |_| {});
        let MuxPair { server, agent } = MuxPair::new(64 * 1024, &shutdown);
        register_own(&ctx, server);
        for origin in [Origin::Client, PEER] {
            let (leave, left) = tokio::sync::oneshot::channel::<()>();
            let gone = std::pin::pin!(async {
                let _ = left.await;
            });
            let target = target();
            let request = Request {
                origin,
                target: &target,
                client: client(),
            };
            let opening = open(&ctx, &request, gone);
            let cancelled = async {
                let dial = next_dial(&agent).await;
                assert_eq!(metric(&ctx, "bridgehead_server_dials_pending"), 1.0);
                drop(leave);
                dial.cancelled().await;
            };
            let (opened, ()) = tokio::join!(opening, cancelled);
            assert!(matches!(opened, Err(Unopened::Gone)), "{origin:?}");
            assert_eq!(metric(&ctx, "bridgehead_server_dials_pending"), 0.0);
        }
        shutdown.cancel();
    })
    .await
}
