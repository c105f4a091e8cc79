//! Table tests of the router's public API: every strategy, their order, ranking, draining,
//! canonical forms, removal and readiness.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};

use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_server::routing::router::{
    parse_strategies, AgentKey, NoRoute, Route, RouteTable, Strategy, StrategyError, TargetHost,
    MAX_CANDIDATES, SAMPLE, VALID_STRATEGIES,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

use Strategy::{Default, DefaultRoute, DestCidr, DestHost};

const ALL: [Strategy; 4] = [DestHost, DestCidr, DefaultRoute, Default];

/// Identifiers from a compact spec: `host:NAME`, `ipv4:A`, `ipv6:A`, `cidr:NET`, `default-route`.
fn ids(spec: &[&str]) -> AgentIdentifiers {
    let mut ids = AgentIdentifiers::default();
    for item in spec {
        match item.split_once(':') {
            Some(("host", v)) => ids.hosts.push(v.to_owned()),
            Some(("ipv4", v)) => ids.ipv4.push(v.parse().unwrap()),
            Some(("ipv6", v)) => ids.ipv6.push(v.parse().unwrap()),
            Some(("cidr", v)) => ids.cidrs.push(v.parse::<ipnet::IpNet>().unwrap().trunc()),
            None if *item == "default-route" => ids.default_route = true,
            _ => panic!("bad spec {item}"),
        }
    }
    ids
}

fn table(strategies: &[Strategy], agents: &[(AgentKey, &[&str])]) -> RouteTable {
    let mut table = RouteTable::new(strategies.to_vec());
    for (key, spec) in agents {
        table.insert(*key, &ids(spec));
    }
    table
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(0x5eed)
}

/// Routes with every agent idle.
fn route(table: &RouteTable, target: &str) -> Result<Route, NoRoute> {
    table.route(&TargetHost::parse(target), |_| 0, &mut rng())
}

/// The winning strategy and the set of candidates, or None for no route.
fn hit(table: &RouteTable, target: &str) -> Option<(Strategy, BTreeSet<AgentKey>)> {
    route(table, target)
        .ok()
        .map(|r| (r.strategy, r.candidates.into_iter().collect()))
}

fn set<const N: usize>(agents: [AgentKey; N]) -> BTreeSet<AgentKey> {
    agents.into_iter().collect()
}

/// Each target routes by the given strategy to the one agent given, or not at all.
fn assert_hits(table: &RouteTable, cases: &[(&str, Option<(Strategy, AgentKey)>)]) {
    for (target, want) in cases {
        assert_eq!(
            hit(table, target),
            want.map(|(s, a)| (s, set([a]))),
            "{target}"
        );
    }
}

/// [`assert_hits`] with one strategy for every case.
fn assert_hits_by(table: &RouteTable, strategy: Strategy, cases: &[(&str, Option<AgentKey>)]) {
    let cases: Vec<_> = cases
        .iter()
        .map(|(target, want)| (*target, want.map(|a| (strategy, a))))
        .collect();
    assert_hits(table, &cases);
}

// ---------------------------------------------------------------- strategy parsing

#[test]
fn parse_strategies_accepts() {
    let cases: &[(&str, &[Strategy])] = &[
        ("default", &[Default]),
        ("destHost,default", &[DestHost, Default]),
        ("destHost,", &[DestHost]),
        (",default,,", &[Default]),
        (
            " destHost , destCIDR ,\tdefaultRoute",
            &[DestHost, DestCidr, DefaultRoute],
        ),
        ("DESTHOST,destcidr", &[DestHost, DestCidr]),
        ("default,destHost", &[Default, DestHost]),
        ("destHost,destCIDR,defaultRoute,default", &ALL),
    ];
    for (input, want) in cases {
        assert_eq!(parse_strategies(input).as_deref(), Ok(*want), "{input:?}");
    }
}

#[test]
fn parse_strategies_rejects() {
    let cases = [
        ("", StrategyError::Empty),
        (" , ,", StrategyError::Empty),
        ("foo", StrategyError::Unknown("foo".into())),
        ("destHost,foo", StrategyError::Unknown("foo".into())),
        ("dest Host", StrategyError::Unknown("dest Host".into())),
        (
            "destHost;default",
            StrategyError::Unknown("destHost;default".into()),
        ),
        ("destHost,desthost", StrategyError::Duplicate(DestHost)),
        (
            "default,destCIDR,default",
            StrategyError::Duplicate(Default),
        ),
    ];
    for (input, want) in cases {
        assert_eq!(parse_strategies(input), Err(want), "{input:?}");
    }
}

#[test]
fn strategy_error_messages() {
    assert_eq!(
        parse_strategies("destHost,foo").unwrap_err().to_string(),
        r#"unknown proxy strategy "foo" (valid: destHost, destCIDR, defaultRoute, default)"#
    );
    assert_eq!(
        parse_strategies("").unwrap_err().to_string(),
        "no proxy strategy given (valid: destHost, destCIDR, defaultRoute, default)"
    );
    assert_eq!(
        parse_strategies("default,default").unwrap_err().to_string(),
        r#"proxy strategy "default" is listed more than once"#
    );
    assert_eq!(
        VALID_STRATEGIES,
        "destHost, destCIDR, defaultRoute, default"
    );
}

#[test]
fn strategy_names_are_canonical() {
    let names: Vec<String> = ALL.iter().map(ToString::to_string).collect();
    assert_eq!(names, ["destHost", "destCIDR", "defaultRoute", "default"]);
    assert_eq!("DefaultRoute".parse::<Strategy>(), Ok(DefaultRoute));
}

// ---------------------------------------------------------------- target parsing

#[test]
fn target_host_canonical_forms() {
    let v4 = |a, b, c, d| TargetHost::Ip(IpAddr::V4(Ipv4Addr::new(a, b, c, d)));
    let cases = [
        ("10.0.0.5", v4(10, 0, 0, 5)),
        ("::ffff:10.0.0.5", v4(10, 0, 0, 5)),
        (
            "fd00:0:0:0:0:0:0:a",
            TargetHost::Ip("fd00::a".parse().unwrap()),
        ),
        ("FD00::A", TargetHost::Ip("fd00::a".parse().unwrap())),
        ("Node-1.Example.", TargetHost::Name("node-1.example".into())),
        ("fd00--a", TargetHost::Name("fd00--a".into())),
    ];
    for (input, want) in cases {
        assert_eq!(TargetHost::parse(input), want, "{input:?}");
    }
}

// ---------------------------------------------------------------- each strategy

#[test]
fn dest_host_names_fold_case_and_trailing_dot() {
    let t = table(
        &[DestHost],
        &[(1, &["host:Node1.Example.com."]), (2, &["host:node2"])],
    );
    for target in [
        "node1.example.com",
        "NODE1.EXAMPLE.COM",
        "node1.example.com.",
        "Node1.Example.Com.",
    ] {
        assert_eq!(hit(&t, target), Some((DestHost, set([1]))), "{target}");
    }
    assert_eq!(hit(&t, "node2."), Some((DestHost, set([2]))));
    assert_eq!(hit(&t, "node1"), None);
    assert_eq!(hit(&t, "node3"), None);
    assert_eq!(hit(&t, "10.0.0.1"), None);
}

#[test]
fn dest_host_ips_compare_as_addresses() {
    let t = table(
        &[DestHost],
        &[
            (1, &["ipv4:10.0.0.5"]),
            (2, &["ipv6:fd00:0:0:0:0:0:0:a"]),
            (3, &["host:FD00::B"]),
            (4, &["host:::ffff:10.0.0.6"]),
            (5, &["ipv6:::ffff:10.0.0.7"]),
            (6, &["host:10.0.0.8"]),
        ],
    );
    let cases: &[(&str, Option<AgentKey>)] = &[
        ("10.0.0.5", Some(1)),
        ("::ffff:10.0.0.5", Some(1)),
        ("::ffff:a00:5", Some(1)),
        ("fd00::a", Some(2)),
        ("fd00:0000:0000::000a", Some(2)),
        ("FD00::A", Some(2)),
        ("fd00::b", Some(3)),
        ("fd00:0:0:0:0:0:0:b", Some(3)),
        ("10.0.0.6", Some(4)),
        ("10.0.0.7", Some(5)),
        ("::ffff:10.0.0.8", Some(6)),
        ("::10.0.0.5", None),
        ("10.0.0.9", None),
    ];
    assert_hits_by(&t, DestHost, cases);
}

#[test]
fn dest_host_keys_by_kind_never_collide() {
    // "fd00--a" is how some tools spell fd00::a in a DNS label; it is a name, not that address.
    let t = table(
        &[DestHost],
        &[
            (1, &["host:fd00--a"]),
            (2, &["ipv6:fd00::a"]),
            (3, &["host:10-0-0-5"]),
        ],
    );
    assert_eq!(hit(&t, "fd00--a"), Some((DestHost, set([1]))));
    assert_eq!(hit(&t, "fd00::a"), Some((DestHost, set([2]))));
    assert_eq!(hit(&t, "10.0.0.5"), None);
    // A host= that is an IP literal is that address: it shares the key with ipv4=.
    let t = table(
        &[DestHost],
        &[(1, &["host:10.0.0.5"]), (2, &["ipv4:10.0.0.5"])],
    );
    assert_eq!(hit(&t, "10.0.0.5"), Some((DestHost, set([1, 2]))));
    // "10.0.0.5." is not an IP literal: it is a name, and no agent holds that name.
    assert_eq!(hit(&t, "10.0.0.5."), None);
}

#[test]
fn dest_host_one_agent_many_keys() {
    let t = table(
        &[DestHost],
        &[(
            1,
            &[
                "host:node1",
                "host:node1.cluster.local",
                "ipv4:10.0.0.5",
                "ipv6:fd00::5",
                "host:10.0.0.5",
            ],
        )],
    );
    for target in ["node1", "node1.cluster.local", "10.0.0.5", "fd00::5"] {
        assert_eq!(hit(&t, target), Some((DestHost, set([1]))), "{target}");
    }
}

#[test]
fn dest_cidr_longest_prefix_wins() {
    let t = table(
        &[DestCidr],
        &[
            (8, &["cidr:10.0.0.0/8"]),
            (16, &["cidr:10.1.0.0/16"]),
            (24, &["cidr:10.1.2.0/24", "cidr:fd00:1:2::/48"]),
            (32, &["cidr:10.1.2.3/32"]),
            (106, &["cidr:fd00::/16"]),
            (132, &["cidr:fd00:1::/32"]),
            (0, &["cidr:0.0.0.0/0"]),
        ],
    );
    let cases: &[(&str, Option<AgentKey>)] = &[
        ("10.1.2.3", Some(32)),
        ("10.1.2.4", Some(24)),
        ("::ffff:10.1.2.4", Some(24)),
        ("10.1.3.4", Some(16)),
        ("10.2.3.4", Some(8)),
        ("192.168.1.1", Some(0)),
        ("fd00:1:2::99", Some(24)),
        ("fd00:1:3::99", Some(132)),
        ("fd00:2::99", Some(106)),
        ("fe80::1", None),
        ("node1", None),
        ("10.1.2.3.example", None),
    ];
    assert_hits_by(&t, DestCidr, cases);
}

#[test]
fn dest_cidr_longest_prefix_beats_lower_load() {
    let t = table(
        &[DestCidr],
        &[(1, &["cidr:10.0.0.0/8"]), (2, &["cidr:10.1.0.0/16"])],
    );
    let loads = HashMap::from([(1, 0), (2, 1_000)]);
    let r = t
        .route(&TargetHost::parse("10.1.0.1"), |a| loads[&a], &mut rng())
        .unwrap();
    assert_eq!(r.candidates, vec![2]);
}

#[test]
fn dest_cidr_draining_falls_back_to_shorter_prefix() {
    let mut t = table(
        &[DestCidr],
        &[
            (1, &["cidr:10.0.0.0/8"]),
            (2, &["cidr:10.1.0.0/16"]),
            (3, &["cidr:10.1.0.0/16"]),
            (6, &["cidr:fd00::/16"]),
            (7, &["cidr:fd00:1::/32"]),
        ],
    );
    assert_eq!(hit(&t, "10.1.0.1"), Some((DestCidr, set([2, 3]))));
    t.set_draining(2, true);
    assert_eq!(hit(&t, "10.1.0.1"), Some((DestCidr, set([3]))));
    t.set_draining(3, true);
    assert_eq!(hit(&t, "10.1.0.1"), Some((DestCidr, set([1]))));
    t.set_draining(1, true);
    assert_eq!(hit(&t, "10.1.0.1"), None);
    t.set_draining(3, false);
    assert_eq!(hit(&t, "10.1.0.1"), Some((DestCidr, set([3]))));
    t.set_draining(7, true);
    assert_eq!(hit(&t, "fd00:1::1"), Some((DestCidr, set([6]))));
}

#[test]
fn default_route_only_announcing_agents() {
    let t = table(
        &[DefaultRoute],
        &[
            (1, &["host:node1"]),
            (2, &["default-route"]),
            (3, &["default-route", "cidr:10.0.0.0/8"]),
        ],
    );
    for target in ["anything.example", "192.168.0.1", "node1", "fd00::1"] {
        assert_eq!(
            hit(&t, target),
            Some((DefaultRoute, set([2, 3]))),
            "{target}"
        );
    }
    let t = table(&[DefaultRoute], &[(1, &["host:node1"])]);
    assert_eq!(hit(&t, "node1"), None);
}

#[test]
fn default_is_any_agent() {
    let t = table(
        &[Default],
        &[(1, &[]), (2, &["host:node2"]), (3, &["default-route"])],
    );
    assert_eq!(hit(&t, "whatever"), Some((Default, set([1, 2, 3]))));
    assert_eq!(hit(&table(&[Default], &[]), "whatever"), None);
}

// ---------------------------------------------------------------- order and fallthrough

#[test]
fn strategies_tried_in_order() {
    let agents: &[(AgentKey, &[&str])] = &[
        (1, &["host:node1", "ipv4:10.0.0.1"]),
        (2, &["cidr:10.0.0.0/24"]),
        (3, &["default-route"]),
        (4, &[]),
    ];
    let t = table(&ALL, agents);
    let cases: &[(&str, Option<(Strategy, AgentKey)>)] = &[
        ("node1", Some((DestHost, 1))),
        ("10.0.0.1", Some((DestHost, 1))),
        ("10.0.0.2", Some((DestCidr, 2))),
        ("node2", Some((DefaultRoute, 3))),
        ("10.0.1.1", Some((DefaultRoute, 3))),
    ];
    assert_hits(&t, cases);
    // The order is the list's, not a fixed precedence.
    let t = table(&[DestCidr, DestHost], agents);
    assert_eq!(hit(&t, "10.0.0.1"), Some((DestCidr, set([2]))));
    // default matches everything, so what comes after it is never tried.
    let t = table(&[Default, DestHost], agents);
    assert_eq!(route(&t, "node1").map(|r| r.strategy), Ok(Default));
}

#[test]
fn no_route_names_the_strategies_tried() {
    let t = table(
        &[DestHost, DestCidr],
        &[(1, &["host:node1", "default-route"])],
    );
    let err = route(&t, "node2").unwrap_err();
    assert_eq!(err.tried, vec![DestHost, DestCidr]);
    assert_eq!(
        err.to_string(),
        "no agent matches (tried destHost, destCIDR)"
    );
    let _: &dyn std::error::Error = &err;
}

#[test]
fn strategies_not_listed_are_not_used() {
    // The agent announces default-route and a CIDR, but only destHost is configured.
    let t = table(&[DestHost], &[(1, &["default-route", "cidr:10.0.0.0/8"])]);
    assert_eq!(hit(&t, "10.0.0.1"), None);
}

// ---------------------------------------------------------------- ranking

#[test]
fn least_loaded_wins_and_candidates_are_ordered() {
    let t = table(
        &[Default],
        &[(1, &[]), (2, &[]), (3, &[]), (4, &[]), (5, &[])],
    );
    let loads = HashMap::from([(1, 7), (2, 3), (3, 9), (4, 0), (5, 5)]);
    for seed in 0..50 {
        let r = t
            .route(
                &TargetHost::parse("x"),
                |a| loads[&a],
                &mut StdRng::seed_from_u64(seed),
            )
            .unwrap();
        assert_eq!(r.candidates, vec![4, 2, 5]);
    }
    assert_eq!(MAX_CANDIDATES, 3);
}

#[test]
fn fewer_matches_than_max_candidates() {
    let t = table(
        &[DestHost],
        &[(1, &["host:a"]), (2, &["host:a"]), (3, &["host:b"])],
    );
    let loads = HashMap::from([(1, 4), (2, 1), (3, 0)]);
    let r = t
        .route(&TargetHost::parse("a"), |a| loads[&a], &mut rng())
        .unwrap();
    assert_eq!(r.candidates, vec![2, 1]);
}

#[test]
fn ties_are_broken_at_random() {
    let t = table(&[Default], &[(1, &[]), (2, &[]), (3, &[])]);
    let loads = HashMap::from([(1, 2), (2, 2), (3, 5)]);
    let mut firsts = HashMap::new();
    for seed in 0..200 {
        let r = t
            .route(
                &TargetHost::parse("x"),
                |a| loads[&a],
                &mut StdRng::seed_from_u64(seed),
            )
            .unwrap();
        assert_eq!(r.candidates.len(), 3);
        assert_eq!(r.candidates[2], 3, "the loaded agent is always last");
        *firsts.entry(r.candidates[0]).or_insert(0) += 1;
    }
    assert_eq!(firsts.len(), 2, "{firsts:?}");
    assert!(firsts[&1] > 60 && firsts[&2] > 60, "{firsts:?}");
}

#[test]
fn sampling_ranks_a_sample_and_spreads() {
    const N: AgentKey = 1_000;
    let mut t = RouteTable::new(vec![Default]);
    for a in 0..N {
        t.insert(a, &AgentIdentifiers::default());
    }
    let mut rng = rng();
    let target = TargetHost::parse("x");

    // Load = key: the first candidate is the least loaded of a sample of 8, never one of the 7
    // most loaded agents, and on average near N/9 (the expected minimum of 8 uniform draws).
    let mut sum = 0;
    for _ in 0..5_000 {
        let r = t.route(&target, |a| a as usize, &mut rng).unwrap();
        assert_eq!(r.candidates.len(), MAX_CANDIDATES);
        assert!(
            r.candidates.windows(2).all(|w| w[0] < w[1]),
            "{:?}",
            r.candidates
        );
        assert!(r.candidates[0] < N - (SAMPLE as AgentKey - 1));
        sum += r.candidates[0];
    }
    let mean = sum / 5_000;
    assert!((80..150).contains(&mean), "mean first candidate {mean}");

    // Equal load: every agent gets chosen over many routes.
    let mut chosen = vec![0_u32; N as usize];
    for _ in 0..30_000 {
        let r = t.route(&target, |_| 0, &mut rng).unwrap();
        chosen[r.candidates[0] as usize] += 1;
    }
    assert!(chosen.iter().all(|&c| c > 0), "some agent never chosen");

    // Sampling draws from usable agents only: with 990 draining, the 10 others are found.
    for a in 10..N {
        t.set_draining(a, true);
    }
    for _ in 0..200 {
        let r = t.route(&target, |_| 0, &mut rng).unwrap();
        assert!(r.candidates.iter().all(|&a| a < 10), "{:?}", r.candidates);
    }
}

// ---------------------------------------------------------------- draining, removal, replacement

#[test]
fn draining_agents_are_skipped_and_strategies_fall_through() {
    let mut t = table(
        &ALL,
        &[
            (1, &["host:node1"]),
            (2, &["host:node1"]),
            (3, &["default-route"]),
        ],
    );
    assert_eq!(hit(&t, "node1"), Some((DestHost, set([1, 2]))));
    t.set_draining(1, true);
    assert_eq!(hit(&t, "node1"), Some((DestHost, set([2]))));
    t.set_draining(2, true);
    assert_eq!(hit(&t, "node1"), Some((DefaultRoute, set([3]))));
    t.set_draining(3, true);
    assert_eq!(hit(&t, "node1"), None);
    assert_eq!(t.len(), 3, "draining agents stay registered");
    t.set_draining(1, false);
    assert_eq!(hit(&t, "node1"), Some((DestHost, set([1]))));
    assert_eq!(hit(&t, "other"), Some((Default, set([1]))));
    t.set_draining(99, true); // unknown agent: no-op
}

#[test]
fn remove_clears_every_storage() {
    let spec: &[&str] = &[
        "host:node1",
        "ipv4:10.0.0.1",
        "ipv6:fd00::1",
        "cidr:10.0.0.0/24",
        "cidr:fd00::/64",
        "default-route",
    ];
    let mut t = table(&ALL, &[(1, spec), (2, &[])]);
    t.remove(1);
    for target in [
        "node1",
        "10.0.0.1",
        "fd00::1",
        "10.0.0.2",
        "fd00::2",
        "elsewhere",
    ] {
        assert_eq!(hit(&t, target), Some((Default, set([2]))), "{target}");
    }
    t.remove(2);
    t.remove(2);
    assert!(t.is_empty());
    assert!(route(&t, "node1").is_err());
    assert!(t.ready().is_err());
    // Re-adding after removal works.
    t.insert(1, &ids(spec));
    assert_eq!(hit(&t, "10.0.0.2"), Some((DestCidr, set([1]))));
}

#[test]
fn insert_twice_replaces_identifiers() {
    let mut t = table(
        &ALL,
        &[(1, &["host:node1", "cidr:10.0.0.0/24", "default-route"])],
    );
    t.insert(1, &ids(&["host:node2"]));
    assert_eq!(t.len(), 1);
    assert_eq!(hit(&t, "node2"), Some((DestHost, set([1]))));
    assert_eq!(hit(&t, "node1"), Some((Default, set([1]))));
    assert_eq!(hit(&t, "10.0.0.1"), Some((Default, set([1]))));
    // A draining agent stays draining when its identifiers are replaced.
    t.set_draining(1, true);
    t.insert(1, &ids(&["host:node3"]));
    assert_eq!(hit(&t, "node3"), None);
    t.set_draining(1, false);
    assert_eq!(hit(&t, "node3"), Some((DestHost, set([1]))));
}

#[test]
fn duplicate_identifiers_count_once() {
    let t = table(
        &[DestHost, DestCidr],
        &[(
            1,
            &[
                "host:node1",
                "host:NODE1.",
                "ipv4:10.0.0.1",
                "host:10.0.0.1",
                "cidr:10.0.0.0/8",
                "cidr:10.0.0.0/8",
            ],
        )],
    );
    assert_eq!(route(&t, "node1").unwrap().candidates, vec![1]);
    assert_eq!(route(&t, "10.0.0.1").unwrap().candidates, vec![1]);
    assert_eq!(route(&t, "10.0.0.2").unwrap().candidates, vec![1]);
}

// ---------------------------------------------------------------- readiness

#[test]
fn ready_follows_the_first_strategy() {
    let mut t = RouteTable::new(vec![DestHost, Default]);
    assert_eq!(t.strategies(), [DestHost, Default]);
    assert_eq!(
        t.ready(),
        Err("no agent registered for strategy destHost".into())
    );
    t.insert(1, &ids(&["default-route"]));
    assert_eq!(
        t.ready(),
        Err("no agent registered for strategy destHost".into()),
        "an agent without host identifiers does not make destHost ready"
    );
    t.insert(2, &ids(&["host:node2"]));
    assert_eq!(t.ready(), Ok(()));
    t.set_draining(2, true);
    assert_eq!(
        t.ready(),
        Err("every agent for strategy destHost is draining".into())
    );
    t.remove(2);
    assert_eq!(
        t.ready(),
        Err("no agent registered for strategy destHost".into())
    );

    let mut t = RouteTable::new(vec![Default]);
    assert_eq!(
        t.ready(),
        Err("no agent registered for strategy default".into())
    );
    t.insert(1, &AgentIdentifiers::default());
    assert_eq!(t.ready(), Ok(()));

    let mut t = RouteTable::new(vec![DestCidr]);
    t.insert(1, &ids(&["host:node1"]));
    assert!(t.ready().is_err());
    t.insert(2, &ids(&["cidr:fd00::/64"]));
    assert_eq!(t.ready(), Ok(()));

    let mut t = RouteTable::new(vec![DefaultRoute]);
    t.insert(1, &ids(&["host:node1"]));
    assert!(t.ready().is_err());
    t.insert(2, &ids(&["default-route"]));
    assert_eq!(t.ready(), Ok(()));
}

#[test]
fn len_counts_registered_agents() {
    let mut t = RouteTable::new(vec![DestHost]);
    assert!(t.is_empty());
    t.insert(1, &ids(&["host:a"]));
    t.insert(2, &ids(&[]));
    t.insert(2, &ids(&["host:b"]));
    assert_eq!(t.len(), 2);
    assert!(!t.is_empty());
}
