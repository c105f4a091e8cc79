//! Routing falls through to the next candidate when the chosen agent's session ends before it
//! answers the dial. Two agent sessions run in process over in-memory pipes.

use std::net::SocketAddr;
use std::time::Duration;

use bridgehead_mux::Mux;
use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_server::routing::dial;
use bridgehead_server::routing::refusal::Refusal;
use bridgehead_server::routing::registry::{Registration, Registry};
use bridgehead_server::routing::router::Strategy;
use bridgehead_server::routing::router::Target;
use bridgehead_test_support::{bounded, MuxPair};
use tokio_util::sync::CancellationToken;

/// A connected pair of sessions; returns the server side.
async fn session(shutdown: &CancellationToken) -> (Mux, Mux) {
    let MuxPair { server, agent } = MuxPair::new(64 * 1024, shutdown);
    (server, agent)
}

fn registration(name: &str, identifiers: AgentIdentifiers, mux: Mux) -> Registration {
    Registration {
        name: name.to_owned(),
        identity: format!("certificate CN={name}"),
        identifiers,
        peer: peer(),
        mux,
    }
}

fn peer() -> SocketAddr {
    "127.0.0.1:1".parse().unwrap()
}

fn target() -> Target {
    Target::parse("10.0.0.5:10250").unwrap()
}

#[tokio::test]
async fn a_session_lost_before_the_answer_moves_the_dial_to_the_next_agent() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::Default], 100);
        let ids = AgentIdentifiers::default();

        // "doomed" carries no tunnel, so it is the first candidate; it dies on the first dial.
        let (doomed_server, doomed_agent) = session(&shutdown).await;
        registry
            .register(registration("doomed", ids.clone(), doomed_server))
            .unwrap();
        tokio::spawn(async move {
            let _dial = doomed_agent.accept().await;
            doomed_agent.close("agent crashed");
        });

        // "healthy" already carries one tunnel, so it comes second; it accepts every dial.
        let (healthy_server, healthy_agent) = session(&shutdown).await;
        registry
            .register(registration("healthy", ids, healthy_server.clone()))
            .unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(dial) = healthy_agent.accept().await {
                held.push(dial.accept().unwrap());
            }
        });
        let _busy = healthy_server
            .open("10.0.0.9", 1, Duration::from_secs(5))
            .await
            .unwrap();

        let target = target();
        let candidates = registry.route(&target.host).unwrap();
        let dialed = dial::dial(
            candidates,
            &target,
            dial::Deadline::after(Duration::from_secs(5)),
        )
        .await
        .unwrap();
        assert_eq!(dialed.agent, "healthy");
        assert!(dialed.via.is_none());
        drop(dialed);
        shutdown.cancel();
    })
    .await
}

#[tokio::test]
async fn every_candidate_lost_is_a_502_naming_the_agent() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::Default], 100);
        let (server, agent) = session(&shutdown).await;
        registry
            .register(registration("only", AgentIdentifiers::default(), server))
            .unwrap();
        tokio::spawn(async move {
            let _dial = agent.accept().await;
            agent.close("agent crashed");
        });
        let target = target();
        let candidates = registry.route(&target.host).unwrap();
        let error = dial::dial(
            candidates,
            &target,
            dial::Deadline::after(Duration::from_secs(5)),
        )
        .await
        .unwrap_err();
        assert!(matches!(error, Refusal::AgentLost { .. }), "{error}");
        assert_eq!(error.status(), http::StatusCode::BAD_GATEWAY);
        assert!(error.to_string().contains("only"), "{error}");
        shutdown.cancel();
    })
    .await
}
