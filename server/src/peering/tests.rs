//! What a peer may make this server hold, on both ends of a peer session, with a hostile peer
//! on the other end of an in-memory session: the view a dialed peer sends is bounded
//! ([`super::dialed::follow`]), and a peer that dials this server gets one view stream, the
//! first ([`super::accepted::accept_loop`]).

use bridgehead_test_support::{bounded, MuxPair, TEST_TIMEOUT};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::view::{ViewLimits, VIEW_STREAM};
use crate::test_util::test_context;
use bridgehead_mux::OpenFailure;
use bridgehead_proto::ErrorCode;

/// A dialed peer that sends `lines` on its view stream and keeps it open: what following it
/// ends with, and how many of its agents the registry then holds. The bytes its view held
/// are no longer counted once following ended.
async fn follow_lines(lines: String, limits: ViewLimits) -> (Result<(), String>, usize) {
    let ctx = test_context();
    let shutdown = CancellationToken::new();
    let MuxPair { server, agent } = MuxPair::new(1 << 20, &shutdown);
    let (session, _) = ctx.registry.add_peer("hostile", server.clone());
    let open = shutdown.clone();
    tokio::spawn(async move {
        let view = agent.accept().await.expect("the view stream").accept();
        let view = view.expect("accepted");
        // All of it, then the stream's end: following ends there, unless a line ended it.
        let _ = view.write(lines.into()).await;
        let _ = view.finish();
        open.cancelled().await;
    });
    let (synced, _) = oneshot::channel();
    let followed = super::dialed::follow(&server, "hostile", session, &ctx, synced, limits).await;
    assert_eq!(
        ctx.metrics.peering.peer_view_bytes.get(),
        0,
        "counted after the view ended"
    );
    shutdown.cancel();
    (followed, ctx.registry.peer_agent_count())
}

fn agents(keys: std::ops::Range<u64>) -> String {
    keys.map(|key| {
        format!(
            "agent {key} active id=a{key}&ipv4=10.0.{}.{}\n",
            key / 256,
            key % 256
        )
    })
    .collect()
}

/// Issue 49, finding 3: a peer's view was taken whole (200,000 announced agents, +140 MiB).
/// Now the agents past the bound end the session, and those before it are all it left.
#[tokio::test]
async fn a_peer_announcing_more_agents_than_the_bound_loses_its_session() {
    bounded(async {
        let limits = ViewLimits {
            agents: 3,
            ..ViewLimits::default()
        };
        let (followed, held) = follow_lines(agents(0..10), limits).await;
        let error = followed.unwrap_err();
        assert!(error.contains("more than 3 agents"), "{error}");
        assert_eq!(held, 3);
        // Within the bound, an agent announced again counted once, one gone making room:
        // followed to the stream's end.
        let again = agents(0..3) + &agents(1..3) + "gone 0\n" + &agents(5..6) + "synced\n";
        let (followed, held) = follow_lines(again, limits).await;
        assert_eq!(followed, Ok(()));
        assert_eq!(held, 3);
    })
    .await
}

/// The bytes of a peer's agents together are bounded too, and an agent's identifiers as an
/// agent's own (875 on one line were taken; an agent may announce 256).
#[tokio::test]
async fn a_peers_view_is_bounded_in_bytes_and_identifiers_per_agent() {
    bounded(async {
        // Keys 0 to 9 make lines of one length.
        let line = agents(0..1).len() - 1;
        let limits = ViewLimits {
            bytes: 3 * line + 1,
            ..ViewLimits::default()
        };
        let (followed, held) = follow_lines(agents(0..10), limits).await;
        let error = followed.unwrap_err();
        assert!(
            error.contains(&format!("more than {} bytes", 3 * line + 1)),
            "{error}"
        );
        assert_eq!(held, 3);
        let many: Vec<String> = (0..875)
            .map(|i| format!("ipv4=10.1.{}.{}", i / 256, i % 256))
            .collect();
        let line = format!("agent 1 active id=a&{}\n", many.join("&"));
        let (followed, held) = follow_lines(line, ViewLimits::default()).await;
        let error = followed.unwrap_err();
        assert!(error.contains("875 identifiers"), "{error}");
        assert_eq!(held, 0);
    })
    .await
}

/// Issue 49, findings 3 and 7: the view was a DIAL to a sentinel host that the answering
/// server treated as special, and one session opened 2,000 of them, each holding a copy of the
/// view. Now the view is the session's first stream, by its id: every later stream is a
/// tunnel, whatever it names, so a session has one view.
#[tokio::test]
async fn the_view_is_the_first_stream_and_the_only_one() {
    bounded(async {
        let ctx = test_context();
        let shutdown = CancellationToken::new();
        // `server` is the peer that dialed this server; `agent` is this server's end.
        let MuxPair { server, agent } = MuxPair::new(1 << 20, &shutdown);
        tokio::spawn(async move {
            let streams = TaskTracker::new();
            super::accepted::accept_loop(&agent, &ctx, "hostile", &streams).await;
        });
        let first = server.open("anything", 7, TEST_TIMEOUT).await;
        let first = first.expect("the view stream");
        assert_eq!(first.id(), VIEW_STREAM);
        let told = first.read().await.expect("the view").expect("lines");
        assert_eq!(&told[..], super::view::SYNCED, "no agents, then synced");
        for _ in 0..3 {
            // The old sentinel is a tunnel's target like any other: no agent here has it.
            let again = server
                .open("agents.bridgehead.invalid", 1, TEST_TIMEOUT)
                .await;
            match again {
                Err(OpenFailure::Dial { code, .. }) => assert_eq!(code, ErrorCode::Draining),
                other => panic!("a second view, or no answer: {other:?}"),
            }
        }
        // The session and its view live on.
        assert_eq!(server.open_streams(), 1);
        shutdown.cancel();
    })
    .await
}
