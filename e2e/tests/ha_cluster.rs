//! A real cluster with three control-plane nodes behind one endpoint
//! ([`RealCluster::start_ha`]: a kube-apiserver per node, each with deploy/'s server as its
//! node's static pod on the Unix socket, the servers peering by their Leases, haproxy in front
//! of the kube-apiservers and of the servers' agent ports, the agents' DaemonSet) and two
//! workers. Last, the agents are installed again from deploy/agent-host-network, on their
//! nodes' network (`host_network`). Its own test binary: it is slow (minutes). Needs root,
//! haproxy, `scripts/k8s-build.sh` and `scripts/install-test-deps.sh`; skipped loudly
//! otherwise.

use std::path::Path;
use std::time::{Duration, Instant};

use bridgehead_e2e::kubernetes::real_cluster::{
    control_plane_name, metric_sum, RealCluster, POD_READY,
};
use bridgehead_e2e::kubernetes::{self, workload};
use bridgehead_e2e::netns;

#[path = "ha_cluster/host_network.rs"]
mod host_network;

/// The whole test, cluster start included.
const TIMEOUT: Duration = Duration::from_secs(900);
/// Control-plane nodes and workers.
const CONTROL_PLANES: usize = 3;
const WORKERS: u8 = 2;
/// The server's health port on each control-plane node (deploy/server-static-pod).
const HEALTH_PORT: u16 = 8134;
/// How long the servers may take to find each other by their Leases and the agents to hold a
/// session with every server (Lease sync and the agents' sync interval are a second or so).
const SETTLE: Duration = Duration::from_secs(60);
/// Each test pod: three log lines, then an HTTP server on 8080 (what the control-plane hosts
/// must not reach by themselves, and its own node does).
const SCRIPT: &str = "for i in 1 2 3; do echo log line $i; done; mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www";
/// What each test pod logs.
const LOG_LINES: &str = "log line 1\nlog line 2\nlog line 3\n";

#[test]
fn three_control_planes_behind_one_endpoint_reach_every_worker_only_through_bridgehead() {
    const TEST: &str =
        "three_control_planes_behind_one_endpoint_reach_every_worker_only_through_bridgehead";
    let Some(binaries) = kubernetes::require_ha(TEST) else {
        return;
    };
    // with_net only for its root check and timeout; the cluster makes its own hosts.
    netns::with_net(TEST, 1, TIMEOUT, move |_| {
        let started = Instant::now();
        let cluster = RealCluster::start_ha(&binaries, CONTROL_PLANES, WORKERS)
            .unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!("HA cluster up after {:?}", started.elapsed());

        kubeconfig_names_the_balancer(&cluster);
        control_plane_nodes_marked_as_kubeadm_marks_them(&cluster);
        every_apiserver_in_the_kubernetes_service(&cluster);
        no_route_from_any_control_plane_host(&cluster, &kubelets(&cluster));
        control_plane_kubelets_only_through_bridgehead(&cluster);
        servers_peer_and_hold(&cluster, CONTROL_PLANES + usize::from(WORKERS));

        let pods: Vec<(String, String)> = cluster
            .workers
            .iter()
            .enumerate()
            .map(|(i, worker)| (format!("shell-{}", i + 1), worker.name.clone()))
            .collect();
        let yaml = workload::busybox_pods(
            &pods
                .iter()
                .map(|(pod, node)| (pod.as_str(), node.as_str(), SCRIPT))
                .collect::<Vec<_>>(),
            false,
        );
        let cp = &cluster.control_plane;
        cp.apply(&yaml).unwrap();
        let mut wait = vec![
            "wait".to_owned(),
            "--for=condition=Ready".to_owned(),
            format!("--timeout={}s", POD_READY.as_secs()),
        ];
        wait.extend(pods.iter().map(|(pod, _)| format!("pod/{pod}")));
        let wait: Vec<&str> = wait.iter().map(String::as_str).collect();
        let ready = cp.kubectl(&wait).unwrap();
        assert!(
            ready.status.success(),
            "pods not Ready: {}\n{}",
            String::from_utf8_lossy(&ready.stderr),
            cluster.describe_pods("default")
        );
        let pod_ips: Vec<String> = pods
            .iter()
            .map(|(pod, _)| {
                let ip = cp
                    .kubectl_ok(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"])
                    .unwrap();
                format!("http://{ip}:8080/")
            })
            .collect();
        // The pods serve (their own node reaches them), and no control-plane host reaches them.
        for (worker, url) in cluster.workers.iter().zip(&pod_ips) {
            let out = worker
                .run(&["curl", "-sS", "--max-time", "10", url])
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "ok\n",
                "{} from its own node: {}",
                url,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        no_route_from_any_control_plane_host(&cluster, &pod_ips);
        services_and_dns_from_pods(&cluster, &pods);

        // Through each kube-apiserver on its own (its own server carries the tunnel, to the
        // agent or to the peer that holds it), then through the balancer.
        for (host, kubeconfig) in cluster.apiservers() {
            let before = carried(&cluster, host);
            for (pod, _) in &pods {
                logs_and_exec(&cluster, &kubeconfig, pod);
            }
            let after = carried(&cluster, host);
            assert!(
                after >= before + 2.0 * pods.len() as f64,
                "{}'s server carried {} tunnels for {} logs and execs",
                control_plane_name(host),
                after - before,
                2 * pods.len()
            );
        }
        for (pod, _) in &pods {
            logs_and_exec(&cluster, &cp.kubeconfig, pod);
        }
        forwarded_when_a_server_holds_no_agent(&cluster, &pods);
        host_network::agents_on_the_host_network(&cluster, &pods);
        eprintln!("HA cluster test done after {:?}", started.elapsed());
    });
}

/// kube-proxy and CoreDNS at work, as in a kubeadm cluster: from a pod on each worker, a
/// Service over the test pods answers at its ClusterIP and at its DNS name, and the
/// `kubernetes` Service's name resolves to its ClusterIP; no control-plane host reaches the
/// Service's ClusterIP (kube-proxy's rules there translate it to pods it has no route to).
fn services_and_dns_from_pods(cluster: &RealCluster, pods: &[(String, String)]) {
    let cp = &cluster.control_plane;
    cp.apply(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\nspec:\n  selector:\n    test: web\n  ports:\n  - port: 80\n    targetPort: 8080\n",
    )
    .unwrap();
    for (pod, _) in pods {
        cp.kubectl_ok(&["label", "pod", pod, "test=web"]).unwrap();
    }
    let cluster_ip = cp
        .kubectl_ok(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"])
        .unwrap();
    // Bounded polls: kube-proxy and CoreDNS see the new Service's endpoints within a second
    // or so, and nothing tells the test when.
    let eventually = |pod: &str, command: &[&str], holds: &dyn Fn(&str) -> bool| {
        let mut args = vec!["exec", pod, "--"];
        args.extend_from_slice(command);
        let started = Instant::now();
        loop {
            let out = cp.kubectl(&args).unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() && holds(&stdout) {
                return;
            }
            assert!(
                started.elapsed() < SETTLE,
                "{command:?} in {pod}: {stdout}{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                cluster.describe_pods("kube-system")
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    // busybox's nc: its wget crashes in an image with nothing but busybox (static glibc).
    let get = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {cluster_ip} 80");
    for (pod, _) in pods {
        // kube-proxy: the ClusterIP answers, from a pod on either worker.
        eventually(pod, &["sh", "-c", &get], &|out| {
            out.starts_with("HTTP/1.") && out.contains(" 200 ") && out.ends_with("\r\n\r\nok\n")
        });
        // CoreDNS (busybox's nslookup asks the resolv.conf kubelet wrote: kube-dns).
        eventually(
            pod,
            &["nslookup", "-type=a", "web.default.svc.cluster.local"],
            &|out| out.contains(&format!("Address: {cluster_ip}\n")),
        );
        eventually(
            pod,
            &[
                "nslookup",
                "-type=a",
                "kubernetes.default.svc.cluster.local",
            ],
            &|out| out.contains("Address: 10.96.0.1\n"),
        );
        let resolv = cp
            .kubectl_ok(&["exec", pod, "--", "cat", "/etc/resolv.conf"])
            .unwrap();
        assert!(resolv.contains("nameserver 10.96.0.10"), "{resolv}");
    }
    no_route_from_any_control_plane_host(cluster, &[format!("http://{cluster_ip}/")]);
}

/// A kube-apiserver whose own server holds no agent at all reaches every worker through that
/// server's peers: the last control-plane node's agent port is cut (connections to it reset, so
/// the agents' sessions there end and haproxy's check takes it out), and once that server
/// counts no agent, `kubectl logs` and `exec` through its kube-apiserver still work, each
/// tunnel forwarded (its `tunnels_forwarded_total`). Then the port is back and every agent
/// returns to it.
fn forwarded_when_a_server_holds_no_agent(cluster: &RealCluster, pods: &[(String, String)]) {
    let (host, kubeconfig) = cluster.apiservers().pop().unwrap();
    let cut = |action: &str| {
        cluster
            .net
            .run_in(
                host,
                &[
                    "iptables",
                    action,
                    "INPUT",
                    "-p",
                    "tcp",
                    "--dport",
                    "8132",
                    "-j",
                    "REJECT",
                    "--reject-with",
                    "tcp-reset",
                ],
            )
            .unwrap();
    };
    let agents_on = |want: f64| {
        let started = Instant::now();
        loop {
            let metrics = cluster.host_get(host, HEALTH_PORT, "/metrics").unwrap();
            let agents = metric_sum(&metrics, "bridgehead_server_agents_connected", &[]);
            if agents == want {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < SETTLE,
                "{}'s server holds {agents} agents, not {want}",
                control_plane_name(host)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    cut("-A");
    let emptied = agents_on(0.0);
    let forwarded =
        |metrics: &str| metric_sum(metrics, "bridgehead_server_tunnels_forwarded_total", &[]);
    let before = forwarded(&cluster.host_get(host, HEALTH_PORT, "/metrics").unwrap());
    for (pod, _) in pods {
        logs_and_exec(cluster, &kubeconfig, pod);
    }
    let after = forwarded(&cluster.host_get(host, HEALTH_PORT, "/metrics").unwrap());
    assert!(
        after >= before + 2.0 * pods.len() as f64,
        "{}'s server forwarded {} tunnels for {} logs and execs",
        control_plane_name(host),
        after - before,
        2 * pods.len()
    );
    cut("-D");
    let back = agents_on((CONTROL_PLANES + usize::from(WORKERS)) as f64);
    eprintln!(
        "{}: agents gone {emptied:?} after its agent port was cut, all back {back:?} after it returned",
        control_plane_name(host)
    );
}

/// Every worker's kubelet, as a URL.
fn kubelets(cluster: &RealCluster) -> Vec<String> {
    cluster
        .workers
        .iter()
        .map(|worker| format!("https://{}:10250/healthz", worker.node_ip))
        .collect()
}

/// No control-plane host reaches another control-plane node's kubelet by itself, while each
/// reaches its own (the kubelet serves); kube-apiserver reaches every one through Bridgehead
/// (the logs of each node's static pod, through the balancer).
fn control_plane_kubelets_only_through_bridgehead(cluster: &RealCluster) {
    let nodes = cluster.control_plane_nodes();
    for (host, _) in cluster.apiservers() {
        for (other, node) in nodes.iter().enumerate() {
            let url = format!("https://{}:10250/healthz", node.node_ip);
            let direct = cluster
                .net
                .run_in(host, &["curl", "-sk", "--max-time", "5", &url]);
            if other == host {
                assert!(direct.is_ok(), "{} its own kubelet: {direct:?}", node.name);
            } else {
                assert!(
                    direct.is_err(),
                    "{} reached {}'s kubelet directly: {direct:?}",
                    control_plane_name(host),
                    node.name
                );
            }
        }
    }
    for node in nodes {
        let pod = format!("konnectivity-server-{}", node.name);
        let logs = cluster
            .control_plane
            .kubectl(&["logs", "-n", "kube-system", &pod, "--tail=1"])
            .unwrap();
        assert!(
            logs.status.success() && !logs.stdout.is_empty(),
            "kubectl logs {pod}: {}",
            String::from_utf8_lossy(&logs.stderr)
        );
    }
}

/// The admin kubeconfig the cluster hands out names the load balancer, not a kube-apiserver.
fn kubeconfig_names_the_balancer(cluster: &RealCluster) {
    let endpoint = cluster.endpoint.as_ref().expect("an HA cluster's endpoint");
    let kubeconfig = std::fs::read_to_string(&cluster.control_plane.kubeconfig).unwrap();
    assert!(
        kubeconfig.contains(&format!("server: {}\n", endpoint.url)),
        "{kubeconfig}"
    );
    assert_eq!(cluster.control_plane.url, endpoint.url);
}

/// Each control-plane node has kubeadm's label and `NoSchedule` taint; the workers neither.
fn control_plane_nodes_marked_as_kubeadm_marks_them(cluster: &RealCluster) {
    let nodes = cluster
        .control_plane
        .kubectl_ok(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.node-role\\.kubernetes\\.io/control-plane} {.spec.taints[*].key}:{.spec.taints[*].effect}{\"\\n\"}{end}",
        ])
        .unwrap();
    let mut seen = Vec::new();
    for line in nodes.lines() {
        let name = line.split(' ').next().unwrap_or_default().to_owned();
        let taint = "node-role.kubernetes.io/control-plane:NoSchedule";
        if name.starts_with("control-plane-") {
            assert_eq!(line, format!("{name}  {taint}"), "{nodes}");
        } else {
            assert!(!line.contains("control-plane"), "{nodes}");
        }
        seen.push(name);
    }
    seen.sort();
    let mut expected: Vec<String> = (0..CONTROL_PLANES).map(control_plane_name).collect();
    expected.extend((1..=WORKERS).map(|i| format!("worker-{i}")));
    assert_eq!(seen, expected, "{nodes}");
}

/// Each kube-apiserver keeps its own address in the `kubernetes` Service's endpoints
/// (`--endpoint-reconciler-type=lease`): bounded poll, as each writes it when its Lease is up.
fn every_apiserver_in_the_kubernetes_service(cluster: &RealCluster) {
    let mut expected: Vec<String> = (0..CONTROL_PLANES)
        .map(|i| cluster.net.host(i).v4().to_string())
        .collect();
    expected.sort();
    let started = Instant::now();
    loop {
        let ips = cluster
            .control_plane
            .kubectl_ok(&[
                "get",
                "endpointslices",
                "-n",
                "default",
                "-l",
                "kubernetes.io/service-name=kubernetes",
                "-o",
                "jsonpath={.items[*].endpoints[*].addresses[*]}",
            ])
            .unwrap();
        let mut ips: Vec<String> = ips.split_whitespace().map(ToOwned::to_owned).collect();
        ips.sort();
        if ips == expected {
            return;
        }
        assert!(
            started.elapsed() < SETTLE,
            "the kubernetes Service's endpoints: {ips:?}, not {expected:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// No control-plane host, where kube-apiserver runs, reaches any of `urls` (workers' kubelets,
/// pods) by itself: only through Bridgehead.
fn no_route_from_any_control_plane_host(cluster: &RealCluster, urls: &[String]) {
    for host in 0..CONTROL_PLANES {
        for url in urls {
            let direct = cluster
                .net
                .run_in(host, &["curl", "-sk", "--max-time", "5", url]);
            assert!(
                direct.is_err(),
                "{} reached {url} directly: {direct:?}",
                control_plane_name(host)
            );
        }
    }
}

/// Each server sees the other two as peers (found by their Leases) and holds a session with
/// each of the `agents` (every node's: the agents count three Leases and reach all three
/// through the balancer): bounded poll, as both take a sync interval or so.
fn servers_peer_and_hold(cluster: &RealCluster, agents: usize) {
    let agents = agents as f64;
    let peers = (CONTROL_PLANES - 1) as f64;
    let started = Instant::now();
    loop {
        let seen: Vec<(f64, f64)> = (0..CONTROL_PLANES)
            .map(|host| {
                let metrics = cluster.host_get(host, HEALTH_PORT, "/metrics").unwrap();
                (
                    metric_sum(&metrics, "bridgehead_server_peers_connected", &[]),
                    metric_sum(&metrics, "bridgehead_server_agents_connected", &[]),
                )
            })
            .collect();
        if seen.iter().all(|&(p, a)| p == peers && a == agents) {
            return;
        }
        assert!(
            started.elapsed() < SETTLE,
            "servers (peers, agents): {seen:?}, want ({peers}, {agents}) each\n{}",
            cluster.describe_pods("kube-system")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Tunnels control-plane host `host`'s server opened: to its own agents, and forwarded to its
/// peers.
fn carried(cluster: &RealCluster, host: usize) -> f64 {
    let metrics = cluster.host_get(host, HEALTH_PORT, "/metrics").unwrap();
    metric_sum(
        &metrics,
        "bridgehead_server_dials_total",
        &["result=\"ok\""],
    ) + metric_sum(&metrics, "bridgehead_server_tunnels_forwarded_total", &[])
}

/// `kubectl logs` and `kubectl exec` into `pod` with `kubeconfig`: the logs as the pod printed
/// them, the exec's output naming the pod.
fn logs_and_exec(cluster: &RealCluster, kubeconfig: &Path, pod: &str) {
    let cp = &cluster.control_plane;
    let logs = cp.kubectl_as(kubeconfig, &["logs", pod], None).unwrap();
    assert!(
        logs.status.success(),
        "kubectl logs {pod} ({}): {}",
        kubeconfig.display(),
        String::from_utf8_lossy(&logs.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&logs.stdout), LOG_LINES, "{pod}");
    let exec = cp
        .kubectl_as(
            kubeconfig,
            &["exec", pod, "--", "sh", "-c", "echo on $(hostname)"],
            None,
        )
        .unwrap();
    assert!(
        exec.status.success(),
        "kubectl exec {pod} ({}): {}",
        kubeconfig.display(),
        String::from_utf8_lossy(&exec.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&exec.stdout), format!("on {pod}\n"));
}
