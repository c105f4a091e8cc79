//! A rolling upgrade of Bridgehead under the loop (see the test's doc).

use std::time::{Duration, Instant};

use bridgehead_e2e::haproxy::ServerState;
use bridgehead_e2e::kubernetes::drill::Kind;
use bridgehead_e2e::kubernetes::real_cluster::{control_plane_name, RealCluster, ReleaseImage};

use super::{assert_every_kind_ran, start_loop, CONTROL_PLANES, DRAIN, SETTLE};

/// How long a server's replacement may take, from the manifest's edit to the new server peered:
/// kubelet stops the old one (which lets open tunnels finish for up to its 30 s
/// `--shutdown-grace-period`, within the pod's 40 s), then starts the new one.
const SERVER_REPLACED: Duration = Duration::from_secs(120);
/// How long the agents' rollout may take (five nodes, one at a time).
const AGENT_ROLLOUT: Duration = Duration::from_secs(300);

/// The rolling upgrade of Bridgehead to `image`'s version, as docs/operations.md's "Upgrading
/// Bridgehead" gives it, under the loop: no request fails.
pub(super) fn rolling_upgrade_of_bridgehead(
    cluster: &mut RealCluster,
    pods: &[String],
    image: &ReleaseImage,
) {
    let version = &image.version;
    let before = cluster.server_versions();
    assert!(
        before.iter().all(|v| v == &cluster.version),
        "servers before the upgrade: {before:?}"
    );
    cluster.publish_release(image).unwrap();
    let run = start_loop(cluster, pods);
    let started = Instant::now();
    for host in 0..CONTROL_PLANES {
        let name = control_plane_name(host);
        let drained = Instant::now();
        cluster.balance_apiserver(host, ServerState::Drain).unwrap();
        cluster
            .balance_agent_port(host, ServerState::Drain)
            .unwrap();
        run.wait_started_before(drained, DRAIN).unwrap();
        let finished = drained.elapsed();
        cluster.upgrade_server_of(host, version).unwrap();
        let peered = cluster
            .wait_server_upgraded(host, version, SERVER_REPLACED)
            .unwrap_or_else(|e| panic!("{e:#}"));
        cluster.balance_apiserver(host, ServerState::Ready).unwrap();
        cluster
            .balance_agent_port(host, ServerState::Ready)
            .unwrap();
        let settled = cluster.wait_servers_settled(SETTLE).unwrap();
        eprintln!(
            "drill: {name}: requests on it done {finished:?} after the drain; its server on {version} and peered {peered:?} after the manifest's edit; every agent on it {settled:?} after the undrain; {:?} in all",
            drained.elapsed()
        );
    }
    let servers = started.elapsed();
    let rolled = Instant::now();
    cluster
        .roll_agents_to(version, AGENT_ROLLOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let rollout = rolled.elapsed();
    // The old agents gone (each drains its tunnels first): every server holds exactly one
    // session per node again.
    let settled = cluster.wait_servers_settled(SETTLE).unwrap();
    let report = run.stop();
    cluster.version.clone_from(version);
    let agents = cluster.agent_versions().unwrap();
    let servers_now = cluster.server_versions();
    eprintln!(
        "drill: rolling upgrade to {version}: servers {servers:?}, agents' rollout {rollout:?} and their old sessions gone {settled:?} later; servers on {servers_now:?}, agents on {agents:?}: {report}"
    );
    assert!(
        servers_now.iter().all(|v| v == version),
        "servers on {servers_now:?}"
    );
    assert_eq!(
        agents.len(),
        CONTROL_PLANES + cluster.workers.len(),
        "{agents:?}"
    );
    assert!(
        agents.iter().all(|(_, v)| v == version),
        "agents on {agents:?}"
    );
    assert_every_kind_ran(&report);
    assert_eq!(report.failed(), 0, "the upgrade failed requests: {report}");
    // A followed stream ends when a server or agent it runs through is replaced (kubectl
    // cannot resume it), and starts again: each stream at most once per server replaced and
    // once for its worker's agent.
    let follow = report.of(Kind::Follow);
    assert_eq!(follow.failed, 0, "{report}");
    let bound = pods.len() as u64 * (CONTROL_PLANES as u64 + 1);
    assert!(
        follow.ended_loudly + follow.ended_silently <= bound,
        "followed streams ended more than {bound} times: {report}"
    );
}
