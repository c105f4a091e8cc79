//! The registry over live in-process sessions: keys, routing through the table, full and
//! draining agents, and what `GET /agents` shows.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use bridgehead_mux::{Mux, MuxStream};
use tokio_util::sync::CancellationToken;

use super::*;

use bridgehead_test_support::{bounded, MuxPair};

/// One agent's session: the server's end (what the registry holds) and the agent's, which
/// accepts every dial and keeps the streams until the session ends.
async fn session(shutdown: &CancellationToken) -> (Mux, Mux) {
    let (server, agent) = silent_session(shutdown).await;
    let accepting = agent.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(dial) = accepting.accept().await {
            held.push(dial.accept());
        }
    });
    (server, agent)
}

/// [`session`], but the agent never answers a dial.
async fn silent_session(shutdown: &CancellationToken) -> (Mux, Mux) {
    let MuxPair { server, agent } = MuxPair::new(64 * 1024, shutdown);
    (server, agent)
}

fn ids(query: &str) -> AgentIdentifiers {
    AgentIdentifiers::parse(query).unwrap()
}

/// Registers `mux` as agent `name` (its identity too) announcing `query`, from port `port`.
fn register(registry: &Registry, name: &str, query: &str, port: u16, mux: Mux) -> AgentKey {
    let registration = Registration {
        name: name.to_owned(),
        identity: name.to_owned(),
        identifiers: ids(query),
        peer: peer(port),
        mux,
    };
    let (key, replaced) = registry.register(registration).unwrap();
    assert!(replaced.is_none());
    key
}

fn peer(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn target(host: &str) -> TargetHost {
    TargetHost::parse(host)
}

/// The names of the agents a route chose, in order.
fn names(candidates: &Candidates) -> Vec<&str> {
    candidates
        .agents
        .iter()
        .map(|candidate| candidate.agent.as_str())
        .collect()
}

/// A tunnel on `mux`, held open by the caller.
async fn tunnel(mux: &Mux) -> MuxStream {
    mux.open("10.0.0.9", 1, Duration::from_secs(5))
        .await
        .unwrap()
}

#[tokio::test]
async fn agents_get_keys_in_order_and_are_routed_until_they_leave() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::DestHost, Strategy::Default], 10);
        let (a, _) = session(&shutdown).await;
        let (b, _) = session(&shutdown).await;
        let key_a = register(&registry, "a", "host=node1", 1, a);
        let key_b = register(&registry, "b", "", 2, b);
        assert_eq!((key_a, key_b), (1, 2));
        assert_eq!(registry.sessions().len(), 2);

        let route = registry.route(&target("node1")).unwrap();
        assert_eq!(
            (route.strategy, names(&route)),
            (Strategy::DestHost, vec!["a"])
        );
        assert_eq!(route.agents[0].key, key_a);
        let route = registry.route(&target("node2")).unwrap();
        assert_eq!(route.strategy, Strategy::Default);

        registry.unregister(key_a);
        let route = registry.route(&target("node1")).unwrap();
        assert_eq!(
            (route.strategy, names(&route)),
            (Strategy::Default, vec!["b"])
        );
        registry.unregister(key_b);
        assert!(matches!(
            registry.route(&target("node1")),
            Err(RouteError::NoRoute(_))
        ));
        assert!(registry.sessions().is_empty() && registry.views().is_empty());
        // Keys are never reused.
        let (c, _) = session(&shutdown).await;
        assert_eq!(register(&registry, "c", "", 3, c), 3);
        shutdown.cancel();
    })
    .await
}

#[tokio::test]
async fn a_draining_agent_gets_no_tunnel_and_readiness_says_so() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::Default], 10);
        assert!(registry.ready().is_err());
        let (a, _) = session(&shutdown).await;
        let key = register(&registry, "a", "", 1, a);
        assert_eq!(registry.ready(), Ok(()));
        registry.set_draining(key);
        assert!(matches!(
            registry.route(&target("x")),
            Err(RouteError::NoRoute(_))
        ));
        assert_eq!(
            registry.ready(),
            Err("every agent for strategy default is draining".to_owned())
        );
        assert!(registry.views()[0].draining);
        shutdown.cancel();
    })
    .await
}

/// With three of four agents at `--max-tunnels-per-agent`, every route picks the fourth, however
/// the random sample falls; once it is full too, the route is refused as full.
#[tokio::test]
async fn full_agents_are_passed_over_and_then_refused() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::Default], 2);
        assert_eq!(registry.max_tunnels_per_agent(), 2);
        let mut held = Vec::new();
        let mut free = None;
        for name in ["full1", "full2", "full3", "free"] {
            let (mux, _) = session(&shutdown).await;
            register(&registry, name, "", 1, mux.clone());
            if name == "free" {
                free = Some(mux);
            } else {
                held.push(tunnel(&mux).await);
                held.push(tunnel(&mux).await);
            }
        }
        for _ in 0..50 {
            let route = registry.route(&target("x")).unwrap();
            assert_eq!(names(&route), ["free"]);
        }
        let free = free.unwrap();
        held.push(tunnel(&free).await);
        assert_eq!(names(&registry.route(&target("x")).unwrap()), ["free"]);
        held.push(tunnel(&free).await);
        assert!(matches!(
            registry.route(&target("x")),
            Err(RouteError::Full(2))
        ));
        shutdown.cancel();
    })
    .await
}

#[tokio::test]
async fn views_show_every_agent_in_connection_order() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::Default], 10);
        let before = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut agents = Vec::new();
        for i in 0..8u16 {
            let (server, agent) = session(&shutdown).await;
            let query = format!(
                "host=node{i}&ipv4=10.0.0.{i}&ipv6=fd00::{}&cidr=10.{i}.0.0/16&default-route={}",
                i + 1,
                i % 2 == 0
            );
            register(
                &registry,
                &format!("agent{i}"),
                &query,
                1000 + i,
                server.clone(),
            );
            agents.push((server, agent));
        }
        let _tunnel = tunnel(&agents[3].0).await;
        // One drains by announcing it (its session says so), one by the registry's mark.
        agents[5].1.drain();
        agents[5].0.peer_drained().await;
        registry.set_draining(7);

        let views = registry.views();
        assert_eq!(views.len(), 8);
        for (i, view) in views.iter().enumerate() {
            assert_eq!(view.key, i as u64 + 1);
            assert_eq!(view.id, format!("agent{i}"));
            assert_eq!(view.peer, format!("127.0.0.1:{}", 1000 + i));
            assert!(view.connected_unix >= before, "{}", view.connected_unix);
            let shown = &view.identifiers;
            assert_eq!(shown.host, [format!("node{i}")]);
            assert_eq!(shown.ipv4, [format!("10.0.0.{i}")]);
            assert_eq!(shown.ipv6, [format!("fd00::{}", i + 1)]);
            assert_eq!(shown.cidr, [format!("10.{i}.0.0/16")]);
            assert_eq!(shown.default_route, i % 2 == 0);
            assert_eq!(view.open_tunnels, usize::from(i == 3), "agent{i}");
            assert_eq!(view.draining, i == 5 || i == 6, "agent{i}");
        }
        shutdown.cancel();
    })
    .await
}

/// With `--max-pending-dials-per-agent` 1, an agent whose dial is pending is passed over for
/// one with none, and refused as busy (not full) when it is the only one.
#[tokio::test]
async fn an_agent_with_its_limit_of_dials_pending_is_passed_over_then_refused_as_busy() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::with_limits(vec![Strategy::Default], 10, usize::MAX, 1);
        let (stuck, _) = silent_session(&shutdown).await;
        register(&registry, "stuck", "", 1, stuck.clone());
        // One poll sends the DIAL; the agent never answers it.
        let mut pending = pin!(stuck.open("10.0.0.9", 1, Duration::from_secs(60)));
        poll_fn(|cx| {
            assert!(pending.as_mut().poll(cx).is_pending());
            Poll::Ready(())
        })
        .await;
        assert_eq!(stuck.load(), (1, 1));
        assert!(matches!(
            registry.route(&target("x")),
            Err(RouteError::Busy(1))
        ));
        let (free, _) = session(&shutdown).await;
        register(&registry, "free", "", 2, free);
        for _ in 0..50 {
            assert_eq!(names(&registry.route(&target("x")).unwrap()), ["free"]);
        }
        shutdown.cancel();
    })
    .await
}

/// A session replaced by its agent's new one may end late: it takes nothing of the new
/// session with it, not even the id's guard against impostors.
#[tokio::test]
async fn the_end_of_a_replaced_session_leaves_the_new_one_registered() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::Default], 10);
        let registration = |identity: &str, mux: Mux| Registration {
            name: "node-a".into(),
            identity: identity.into(),
            identifiers: AgentIdentifiers::default(),
            peer: peer(1),
            mux,
        };
        let (old, _) = session(&shutdown).await;
        let (new, _) = session(&shutdown).await;
        let (first, _) = registry.register(registration("cert A", old)).unwrap();
        let (second, replaced) = registry.register(registration("cert A", new)).unwrap();
        assert!(replaced.is_some());
        registry.unregister(first);
        let (impostor, _) = session(&shutdown).await;
        assert!(matches!(
            registry.register(registration("cert B", impostor)),
            Err(RegisterError::IdTaken { .. })
        ));
        assert_eq!(registry.views()[0].key, second);
        shutdown.cancel();
    })
    .await
}

/// A new session of a live agent (a DaemonSet's surge pod, same id, same identity) takes every
/// new tunnel; the one it replaced stays, draining, with its tunnel, until it ends. Where the
/// identity's cap leaves no room for both, the replaced one is handed back to be closed.
#[tokio::test]
async fn a_replaced_session_drains_with_its_tunnels_while_the_cap_leaves_room() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::with_limits(vec![Strategy::DestHost], 10, 2, 10);
        let registration = |mux: Mux| Registration {
            name: "node-a".into(),
            identity: "cert A".into(),
            identifiers: ids("host=node-a"),
            peer: peer(1),
            mux,
        };
        let (old, _) = session(&shutdown).await;
        let (first, _) = registry.register(registration(old.clone())).unwrap();
        let held = tunnel(&old).await;
        let (new, _) = session(&shutdown).await;
        let (second, replaced) = registry.register(registration(new)).unwrap();
        assert!(matches!(replaced, Some(Replaced::Draining)), "{replaced:?}");
        let route = registry.route(&target("node-a")).unwrap();
        assert_eq!(
            route.agents.iter().map(|c| c.key).collect::<Vec<_>>(),
            vec![second]
        );
        let views = registry.views();
        assert_eq!(
            views
                .iter()
                .map(|v| (v.key, v.draining, v.open_tunnels))
                .collect::<Vec<_>>(),
            vec![(first, true, 1), (second, false, 0)]
        );
        // The cap (2) holds both: a third session of the same agent closes its predecessor
        // rather than be refused.
        let (third, _) = session(&shutdown).await;
        let (third, replaced) = registry.register(registration(third)).unwrap();
        assert!(matches!(replaced, Some(Replaced::Close(_))), "{replaced:?}");
        let draining = |registry: &Registry| -> Vec<(AgentKey, bool)> {
            registry
                .views()
                .iter()
                .map(|v| (v.key, v.draining))
                .collect()
        };
        assert_eq!(draining(&registry), vec![(first, true), (third, false)]);
        // The drained session's end leaves the newest registered under the id.
        drop(held);
        registry.unregister(first);
        assert_eq!(draining(&registry), vec![(third, false)]);
        assert_eq!(
            names(&registry.route(&target("node-a")).unwrap()),
            vec!["node-a"]
        );
        shutdown.cancel();
    })
    .await
}

/// A peer's agents: routed strategy by strategy after this server's own (so a peer's
/// `destHost` match beats an own agent that only `default` finds, and an own agent beats a
/// peer's for the same strategy), never for a peer's forwarded tunnel, kept current by the
/// view's updates, and forgotten with the peer's session but not with an older one.
#[tokio::test]
async fn a_peers_agents_are_routed_after_the_own_for_each_strategy() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::DestHost, Strategy::Default], 10);
        let (own, _) = session(&shutdown).await;
        register(&registry, "own", "host=node-own", 1, own);
        let (peer_mux, _) = session(&shutdown).await;
        let (old, replaced) = registry.add_peer("s2", peer_mux.clone());
        assert!(replaced.is_none());
        registry.set_peer_agent("s2", old, 7, &ids("id=far&host=node-far"), false);
        // A newer session with the same peer replaces the old one and its agents.
        let (session_2, replaced) = registry.add_peer("s2", peer_mux.clone());
        assert!(replaced.is_some());
        assert!(matches!(
            registry.route(&target("node-far")).unwrap().strategy,
            Strategy::Default
        ));
        registry.set_peer_agent("s2", old, 7, &ids("id=far&host=node-far"), false);
        assert_eq!(
            registry.peer_agent_count(),
            0,
            "an update of the old session"
        );
        registry.set_peer_agent("s2", session_2, 7, &ids("id=far&host=node-far"), false);
        assert_eq!(registry.peers(), vec![("s2".to_owned(), 1)]);

        let route = registry.route(&target("node-far")).unwrap();
        assert_eq!(
            (route.strategy, names(&route)),
            (Strategy::DestHost, vec!["far"])
        );
        assert_eq!(route.agents[0].via.as_deref(), Some("s2"));
        let route = registry.route(&target("node-own")).unwrap();
        assert_eq!(
            (names(&route), route.agents[0].via.is_none()),
            (vec!["own"], true)
        );
        let route = registry.route(&target("elsewhere")).unwrap();
        assert_eq!(
            (route.strategy, names(&route)),
            (Strategy::Default, vec!["own"])
        );
        // A forwarded tunnel never goes on to another peer.
        let route = registry.route_local(&target("node-far")).unwrap();
        assert_eq!(
            (route.strategy, names(&route)),
            (Strategy::Default, vec!["own"])
        );

        // Draining, then gone.
        registry.set_peer_agent("s2", session_2, 7, &ids("id=far&host=node-far"), true);
        assert_eq!(
            registry.route(&target("node-far")).unwrap().strategy,
            Strategy::Default
        );
        registry.set_peer_agent("s2", session_2, 7, &ids("id=far&host=node-far"), false);
        registry.remove_peer_agent("s2", session_2, 7);
        assert_eq!(
            registry.route(&target("node-far")).unwrap().strategy,
            Strategy::Default
        );
        registry.set_peer_agent("s2", session_2, 8, &ids("id=far&host=node-far"), false);
        registry.remove_peer("s2", old);
        assert_eq!(
            registry.peer_agent_count(),
            1,
            "the end of an older session"
        );
        registry.remove_peer("s2", session_2);
        assert_eq!(registry.peer_agent_count(), 0);
        assert!(registry.peers().is_empty());
        shutdown.cancel();
    })
    .await
}

/// Readiness counts a peer's agents: a server just started with none of its own is ready
/// once its peers' are known.
#[tokio::test]
async fn a_peers_agents_make_the_server_ready() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::Default], 10);
        assert!(registry.ready().is_err());
        let (peer_mux, _) = session(&shutdown).await;
        let (session, _) = registry.add_peer("s2", peer_mux);
        registry.set_peer_agent("s2", session, 1, &ids("id=far"), false);
        assert!(registry.ready().is_ok());
        assert_eq!(registry.ready_backends(), vec![(Strategy::Default, 1)]);
        shutdown.cancel();
    })
    .await
}
