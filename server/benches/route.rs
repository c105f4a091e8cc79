//! `RouteTable::route` with 10,000 agents with mixed identifiers, one benchmark per strategy.
//!
//! Run: `cargo bench -p bridgehead-server --bench route -- --warm-up-time 1 --measurement-time 3`
//!
//! Agent `i` announces `host=node<i>`, `ipv4=10.<i/256>.<i%256>.1`, `cidr=10.64.0.0/10 + i*256
//! /24`; every 100th agent also a /16 (so destCIDR probes two lengths), every 10th
//! `default-route=true`, every 2nd `ipv6=fd00::<i>`. Loads are random per agent.

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_server::routing::router::{AgentKey, RouteTable, Strategy, TargetHost};
use criterion::{criterion_group, criterion_main, Criterion};
use ipnet::{IpNet, Ipv4Net};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const AGENTS: u32 = 10_000;

fn agent_ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, (i / 256) as u8, (i % 256) as u8, 1)
}

fn agent_net(i: u32, len: u8) -> IpNet {
    let base = u32::from(Ipv4Addr::new(10, 64, 0, 0)) + (i << 8);
    IpNet::V4(
        Ipv4Net::new(Ipv4Addr::from(base), len)
            .unwrap_or_default()
            .trunc(),
    )
}

fn identifiers(i: u32, default_route: bool) -> AgentIdentifiers {
    let mut ids = AgentIdentifiers {
        hosts: vec![format!("node{i}")],
        ipv4: vec![agent_ip(i)],
        cidrs: vec![agent_net(i, 24)],
        default_route: default_route && i % 10 == 0,
        ..AgentIdentifiers::default()
    };
    if i % 100 == 0 {
        ids.cidrs.push(agent_net(i, 16));
    }
    if i % 2 == 0 {
        ids.ipv6
            .push(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i as u16));
    }
    ids
}

fn table(strategies: &[Strategy], default_route: bool) -> RouteTable {
    let mut table = RouteTable::new(strategies.to_vec());
    for i in 0..AGENTS {
        table.insert(AgentKey::from(i), &identifiers(i, default_route));
    }
    table
}

fn route(c: &mut Criterion) {
    use Strategy::{Default, DefaultRoute, DestCidr, DestHost};
    let mut rng = StdRng::seed_from_u64(42);
    let loads: Vec<usize> = (0..AGENTS).map(|_| rng.random_range(0..100)).collect();
    let load = |a: AgentKey| loads.get(a as usize).copied().unwrap_or(0);

    let cases: [(&str, &[Strategy], bool, TargetHost); 7] = [
        (
            "destHost name",
            &[DestHost, Default],
            true,
            TargetHost::parse("Node4242."),
        ),
        (
            "destHost ipv4",
            &[DestHost, Default],
            true,
            TargetHost::parse(&agent_ip(4242).to_string()),
        ),
        (
            "destHost ipv6",
            &[DestHost, Default],
            true,
            TargetHost::parse("fd00::1092"),
        ),
        (
            "destCIDR",
            &[DestCidr, Default],
            true,
            TargetHost::parse("10.64.66.7"),
        ),
        (
            "defaultRoute (1,000 agents)",
            &[DefaultRoute, Default],
            true,
            TargetHost::parse("example.com"),
        ),
        (
            "default (10,000 agents)",
            &[Default],
            true,
            TargetHost::parse("example.com"),
        ),
        (
            "miss destHost,destCIDR,defaultRoute",
            &[DestHost, DestCidr, DefaultRoute],
            false,
            TargetHost::parse("192.168.1.1"),
        ),
    ];
    let mut group = c.benchmark_group("route");
    for (name, strategies, default_route, target) in cases {
        let table = table(strategies, default_route);
        group.bench_function(name, |b| {
            b.iter(|| black_box(table.route(black_box(&target), load, &mut rng)))
        });
    }
    group.finish();

    let mut table = table(&[DestHost, DestCidr, DefaultRoute, Default], true);
    let ids = identifiers(AGENTS, true);
    c.bench_function("insert+remove one agent (all storages)", |b| {
        b.iter(|| {
            table.insert(AgentKey::from(AGENTS), black_box(&ids));
            table.remove(AgentKey::from(AGENTS));
        })
    });
}

criterion_group!(benches, route);
criterion_main!(benches);
