//! Drills on the HA cluster (issue 50 item 2), one after another on one cluster
//! ([`RealCluster::start_ha`]: three control-plane nodes behind haproxy, two workers), each under
//! the client loop of [`drill::Loop`] through the load balancer (`kubectl exec -i`, `logs`,
//! `logs -f`, `port-forward` bulk into a pod on each worker), which counts every request:
//!
//! - a quiet minute's worth first: the loop alone fails nothing (the control);
//! - a rolling restart of kube-apiserver on every control-plane node in turn, as a Kubernetes
//!   patch upgrade does it: drained from the balancer, the requests already on it finished,
//!   SIGTERM, started again with the same flags, ready at its own address, back in the
//!   balancer. No request fails; `logs -f` streams the restarted kube-apiserver carried end,
//!   loudly (kubectl cannot resume a stream), none silently;
//! - a control-plane node lost: its kube-apiserver, its kubelet and its server SIGKILLed
//!   together. Only requests in flight at that moment may fail, and followed streams end only
//!   loudly; the node comes back (kubelet, which starts its server again, and kube-apiserver),
//!   its server peers again and every agent is back on it;
//! - a worker cut from the control plane for 30 s (its link dropping everything) and healed:
//!   requests into the other worker's pod never fail, nor does its followed stream end; the
//!   cut pod's followed stream ends within the keepalive bound (kubectl may see that end as a
//!   clean one: kube-apiserver's doing, see `worker_cut_off`); requests into the cut pod that
//!   start [`RECOVER`] after the heal work;
//! - a worker's kubelet and containerd restarted (both killed, started again): its pods keep
//!   running; requests into the other worker's pod never fail; requests into its pod fail only
//!   while it is down, and those that start [`KEEPALIVE_BOUND`] after its kubelet answers again
//!   work;
//! - a rolling upgrade of Bridgehead to the next version (its release image built with
//!   `scripts/release.sh --version` while the drills above run), docs/operations.md's
//!   "Upgrading Bridgehead" step by step: each control-plane node drained from both of the
//!   balancer's frontends, its server's static pod manifest pointed at the new image, the new
//!   server reporting the new version and peered, the node back in the balancer and every agent
//!   on its server; then the agents' DaemonSet rolled with surge. No request fails; followed
//!   streams end only with a server or agent they ran through, at most once each.
//!
//! Each drill prints its counts and times (docs/testing.md records them). Its own test binary:
//! it is slow (minutes). `BRIDGEHEAD_DRILLS=worker-cut,upgrade` (a comma-separated list of
//! `apiserver-restart`, `node-lost`, `worker-cut`, `kubelet-restart`, `upgrade`) runs only
//! those after the control run, for work on one drill. Needs root, haproxy,
//! `scripts/k8s-build.sh`, `scripts/coredns-build.sh` and `scripts/install-test-deps.sh`;
//! skipped loudly otherwise.

use std::time::{Duration, Instant};

use bridgehead_e2e::haproxy::ServerState;
use bridgehead_e2e::kubernetes::drill::{self, Kind, Report};
use bridgehead_e2e::kubernetes::real_cluster::{
    control_plane_name, next_version, RealCluster, ReleaseImage, POD_READY,
};
use bridgehead_e2e::kubernetes::{self, workload};
use bridgehead_e2e::netns;

// A test file is a crate root: its modules' files are named.
#[path = "ha_drills/kubelet.rs"]
mod kubelet;
#[path = "ha_drills/upgrade.rs"]
mod upgrade;

/// The whole test, cluster start included.
const TIMEOUT: Duration = Duration::from_secs(1800);
const CONTROL_PLANES: usize = 3;
const WORKERS: u8 = 2;
/// How long the servers may take to find each other and the agents to hold every server.
const SETTLE: Duration = Duration::from_secs(60);
/// How long the control run lasts.
const QUIET: Duration = Duration::from_secs(20);
/// How long requests already on a drained kube-apiserver may take to finish.
const DRAIN: Duration = Duration::from_secs(60);
/// kube-apiserver's termination grace (kubeadm's static pod leaves kubelet's default, 30 s).
const GRACE: Duration = Duration::from_secs(30);
/// How long a lost control-plane node stays away (several of haproxy's checks, several
/// rounds of every request kind).
const AWAY: Duration = Duration::from_secs(15);
/// How long a worker stays cut from the control plane (issue 50).
const CUT: Duration = Duration::from_secs(30);
/// How soon after a cut heals requests into the worker's pod must work again: the agent's
/// dead sessions given up (three 5 s keepalives) and found again (`--sync-interval-cap`,
/// 10 s, jittered), with room for a request in progress.
const RECOVER: Duration = Duration::from_secs(40);
/// How soon a cut worker's open streams must end: the server gives a silent agent up after
/// three 5 s keepalives, with room for a loaded machine.
const KEEPALIVE_BOUND: Duration = Duration::from_secs(25);

#[test]
fn drills_under_a_client_loop_through_the_balancer() {
    const TEST: &str = "drills_under_a_client_loop_through_the_balancer";
    let Some(binaries) = kubernetes::require_ha(TEST) else {
        return;
    };
    // with_net only for its root check and timeout; the cluster makes its own hosts.
    netns::with_net(TEST, 1, TIMEOUT, move |_| {
        let started = Instant::now();
        let mut cluster = RealCluster::start_ha(&binaries, CONTROL_PLANES, WORKERS)
            .unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!("HA cluster up after {:?}", started.elapsed());
        let pods = drill_pods(&cluster);
        cluster.wait_servers_settled(SETTLE).unwrap();

        let quiet = {
            let run = start_loop(&cluster, &pods);
            std::thread::sleep(QUIET); // the length of the control run, not a wait for anything
            run.stop()
        };
        eprintln!("drill: control run: {quiet}");
        assert_every_kind_ran(&quiet);
        assert_eq!(quiet.failed(), 0, "the loop alone failed: {quiet}");
        assert_eq!(quiet.of(Kind::Follow).ended_loudly, 0, "{quiet}");
        assert_eq!(quiet.of(Kind::Follow).ended_silently, 0, "{quiet}");

        // The next version's image builds while the drills before the upgrade run (it
        // relinks Bridgehead's crates, minutes of CPU): after the cluster's own image, which
        // the same target folder holds.
        let next = chosen("upgrade").then(|| {
            let version = next_version(&cluster.version);
            std::thread::spawn(move || ReleaseImage::build(&version))
        });

        if chosen("apiserver-restart") {
            rolling_restart_of_kube_apiserver(&mut cluster, &pods);
        }
        if chosen("node-lost") {
            control_plane_node_lost(&mut cluster, &pods);
        }
        if chosen("worker-cut") {
            worker_cut_off(&cluster, &pods);
        }
        if chosen("kubelet-restart") {
            kubelet::kubelet_and_containerd_restarted(&mut cluster, &pods);
        }
        if let Some(next) = next {
            let waited = Instant::now();
            let image = next
                .join()
                .expect("the release build panicked")
                .unwrap_or_else(|e| panic!("{e:#}"));
            eprintln!(
                "drill: release image {} built in {:?} (waited {:?} for it after the other drills)",
                image.version,
                image.took,
                waited.elapsed()
            );
            upgrade::rolling_upgrade_of_bridgehead(&mut cluster, &pods, &image);
        }
        eprintln!("HA drills done after {:?}", started.elapsed());
    });
}

/// Every kube-apiserver in turn: drained, stopped (SIGTERM), started, ready, back; no request
/// of the loop fails.
fn rolling_restart_of_kube_apiserver(cluster: &mut RealCluster, pods: &[String]) {
    let run = start_loop(cluster, pods);
    let started = Instant::now();
    for host in 0..CONTROL_PLANES {
        let name = control_plane_name(host);
        let drained = Instant::now();
        cluster.balance_apiserver(host, ServerState::Drain).unwrap();
        run.wait_started_before(drained, DRAIN).unwrap();
        let finished = drained.elapsed();
        let exited = cluster.stop_apiserver_of(host, GRACE).unwrap();
        let stopped = Instant::now();
        cluster
            .start_apiserver_of(host)
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let ready = stopped.elapsed();
        cluster.balance_apiserver(host, ServerState::Ready).unwrap();
        eprintln!(
            "drill: {name}: requests on it done {finished:?} after the drain, exited {exited:?} after SIGTERM, ready {ready:?} after starting, out of the balancer {:?}",
            drained.elapsed()
        );
    }
    let took = started.elapsed();
    let report = run.stop();
    eprintln!("drill: rolling restart of kube-apiserver ({took:?}): {report}");
    assert_every_kind_ran(&report);
    assert_eq!(
        report.failed(),
        0,
        "a rolling restart failed requests: {report}"
    );
    assert_eq!(
        report.of(Kind::Follow).ended_silently,
        0,
        "a followed stream ended silently: {report}"
    );
}

/// The last control-plane node lost at once (not the first: its host also runs the shared
/// etcd and the balancer, another drill's loss) and brought back.
fn control_plane_node_lost(cluster: &mut RealCluster, pods: &[String]) {
    let host = CONTROL_PLANES - 1;
    let name = control_plane_name(host);
    let run = start_loop(cluster, pods);
    // A few rounds of every kind first, so that some are in flight at the loss.
    std::thread::sleep(Duration::from_secs(5)); // the loop's lead, not a wait for anything
    let lost_at = run.now();
    let lost = Instant::now();
    cluster.lose_control_plane_node(host).unwrap();
    std::thread::sleep(AWAY); // how long the node stays away: the drill's own length
    let back_at = run.now();
    let back = Instant::now();
    cluster
        .bring_back_control_plane_node(host)
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let apiserver_ready = back.elapsed();
    let rejoined = cluster.wait_servers_settled(SETTLE).unwrap();
    let report = run.stop();
    eprintln!(
        "drill: {name} lost for {:?}, kube-apiserver ready {apiserver_ready:?} after its return, its server peering and holding every agent {rejoined:?} later: {report}",
        back.duration_since(lost)
    );
    assert_every_kind_ran(&report);
    // Only what was in flight at the loss may fail: a request that started later went to a
    // kube-apiserver that was there (haproxy retries a refused connection elsewhere, its
    // check takes the lost one out within a few hundred milliseconds).
    let late: Vec<_> = report
        .failures
        .iter()
        .filter(|failure| failure.kind != Kind::Follow && failure.started >= lost_at)
        .collect();
    assert!(
        late.is_empty(),
        "requests that started after the loss failed ({} while away, from {:.1} s; back at {:.1} s): {late:#?}\n{report}",
        late.iter().filter(|f| f.started < back_at).count(),
        lost_at.as_secs_f64(),
        back_at.as_secs_f64(),
    );
    let follow = report.of(Kind::Follow);
    assert_eq!(
        follow.ended_silently, 0,
        "a followed stream ended silently: {report}"
    );
    assert_eq!(follow.failed, 0, "{report}");
}

/// The first worker cut off for [`CUT`] and healed.
fn worker_cut_off(cluster: &RealCluster, pods: &[String]) {
    let (cut_pod, other_pod) = (&pods[0], &pods[1]);
    let run = start_loop(cluster, pods);
    std::thread::sleep(Duration::from_secs(5)); // the loop's lead, not a wait for anything
    let cut_at = run.now();
    cluster.cut_worker(0, true).unwrap();
    std::thread::sleep(CUT); // the cut's length: the drill's own
    cluster.cut_worker(0, false).unwrap();
    let healed_at = run.now();
    // Long enough after the heal for RECOVER to have passed and a few rounds to run.
    std::thread::sleep(RECOVER + Duration::from_secs(10)); // the drill's length after the heal
    let report = run.stop();
    let last_failure = report
        .failures
        .iter()
        .filter(|failure| &failure.pod == cut_pod && failure.kind != Kind::Follow)
        .map(|failure| failure.at)
        .max();
    eprintln!(
        "drill: {} cut off from {:.1} s to {:.1} s; its pod's last failed request ended {:?} s: {report}",
        cluster.workers[0].name,
        cut_at.as_secs_f64(),
        healed_at.as_secs_f64(),
        last_failure.map(|at| at.as_secs_f64()),
    );
    assert_every_kind_ran(&report);
    let other: Vec<_> = report
        .failures
        .iter()
        .filter(|failure| &failure.pod == other_pod)
        .collect();
    assert!(
        other.is_empty(),
        "the other worker's pod failed: {other:#?}\n{report}"
    );
    let late: Vec<_> = report
        .failures
        .iter()
        .filter(|failure| failure.kind != Kind::Follow && failure.started > healed_at + RECOVER)
        .collect();
    assert!(
        late.is_empty(),
        "requests {RECOVER:?} after the heal failed: {late:#?}\n{report}"
    );
    // The cut pod's followed stream ends once the server gives its agent up (the keepalive),
    // not later. kubectl may see that end as a clean one (exit 0): kube-apiserver streams
    // logs with an `io.Copy` whose error it drops (k8s.io/apiserver `StreamObject`), so a
    // broken kubelet stream ends its response normally, however the tunnel ended.
    let first_end = report
        .failures
        .iter()
        .filter(|failure| &failure.pod == cut_pod && failure.kind == Kind::Follow)
        .map(|failure| failure.at)
        .min()
        .expect("the cut pod's followed stream never ended");
    assert!(
        first_end > cut_at && first_end < cut_at + KEEPALIVE_BOUND,
        "the cut pod's followed stream ended at {first_end:?}, cut at {cut_at:?}: {report}"
    );
    assert_eq!(report.of(Kind::Follow).failed, 0, "{report}");
}

/// Whether drill `name` runs: all of them, unless `BRIDGEHEAD_DRILLS` lists some.
fn chosen(name: &str) -> bool {
    std::env::var("BRIDGEHEAD_DRILLS").map_or(true, |list| {
        list.split(',').any(|chosen| chosen.trim() == name)
    })
}

/// The client loop through the balancer's kubeconfig.
fn start_loop(cluster: &RealCluster, pods: &[String]) -> drill::Loop {
    drill::Loop::start(
        &cluster.control_plane.binaries.kubectl,
        &cluster.control_plane.kubeconfig,
        pods,
    )
}

/// Every request kind succeeded at least once: the loop really ran.
fn assert_every_kind_ran(report: &Report) {
    for kind in [Kind::Exec, Kind::Logs, Kind::PortForward] {
        assert!(report.of(kind).ok > 0, "no {kind} succeeded: {report}");
    }
    let follow = report.of(Kind::Follow);
    assert!(
        follow.ok + follow.ended_loudly + follow.ended_silently > 0,
        "no followed stream: {report}"
    );
}

/// A drill pod on each worker, Ready; their names.
fn drill_pods(cluster: &RealCluster) -> Vec<String> {
    let pods: Vec<(String, String)> = cluster
        .workers
        .iter()
        .enumerate()
        .map(|(i, worker)| (format!("drill-{}", i + 1), worker.name.clone()))
        .collect();
    let cp = &cluster.control_plane;
    cp.apply(&workload::busybox_pods(
        &pods
            .iter()
            .map(|(pod, node)| (pod.as_str(), node.as_str(), drill::POD_SCRIPT))
            .collect::<Vec<_>>(),
        false,
    ))
    .unwrap();
    for (pod, _) in &pods {
        let ready = cp
            .kubectl(&[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{pod}"),
                &format!("--timeout={}s", POD_READY.as_secs()),
            ])
            .unwrap();
        assert!(
            ready.status.success(),
            "{pod} not Ready: {}\n{}",
            String::from_utf8_lossy(&ready.stderr),
            cluster.describe_pods("default")
        );
        // Ready once its container started; ticking (its httpd up) a moment later, which
        // only its log tells: bounded poll.
        let started = Instant::now();
        while !cp
            .kubectl_ok(&["logs", "--tail=3", pod])
            .is_ok_and(|logs| logs.matches("tick ").count() == 3)
        {
            assert!(started.elapsed() < POD_READY, "{pod} does not tick");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    pods.into_iter().map(|(pod, _)| pod).collect()
}
