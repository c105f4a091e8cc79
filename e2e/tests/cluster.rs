//! A real cluster on one machine ([`RealCluster`]): kubelet, containerd and runc on node
//! hosts, bridgehead-server run by the control-plane node's kubelet from deploy/'s static pod
//! manifest, the agents from deploy/'s DaemonSet, both from the release's image
//! (`scripts/image.sh`).
//! kube-apiserver's namespace has no route to a worker node; everything kubectl does with a
//! pod there goes through Bridgehead, and the test checks what kubectl hands back byte for
//! byte. Needs root, `scripts/k8s-build.sh` and `scripts/install-test-deps.sh`; skipped loudly
//! otherwise.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bridgehead_e2e::kubernetes::real_cluster::{RealCluster, CONTROL_PLANE_HOST, POD_READY};
use bridgehead_e2e::kubernetes::workload::{self, TestServer, API_GROUP, DENIAL, SERVICE};
use bridgehead_e2e::kubernetes::{self};
use bridgehead_e2e::netns;

/// The whole test, cluster start included.
const TIMEOUT: Duration = Duration::from_secs(600);

/// The test's pods: on each worker a shell that prints five lines and waits, on worker-1 an
/// echo server (busybox nc running cat for every connection), on worker-2 a ticker printing a
/// numbered line every 100 ms.
fn pods() -> String {
    workload::busybox_pods(
        &[
            (
                "shell-1",
                "worker-1",
                "for i in 1 2 3 4 5; do echo log line $i; done; exec sleep 3600",
            ),
            (
                "shell-2",
                "worker-2",
                "for i in 1 2 3 4 5; do echo log line $i; done; exec sleep 3600",
            ),
            ("echo", "worker-1", "exec nc -ll -p 7000 -e cat"),
            ("attached", "worker-1", "exec cat"),
            (
                "ticker",
                "worker-2",
                "i=0; while true; do echo tick $i; i=$((i+1)); usleep 100000; done",
            ),
        ],
        true,
    )
}

#[test]
fn kubectl_reaches_real_pods_on_two_nodes_through_bridgehead_installed_from_deploy() {
    const TEST: &str =
        "kubectl_reaches_real_pods_on_two_nodes_through_bridgehead_installed_from_deploy";
    let Some(binaries) = kubernetes::require_nodes(TEST) else {
        return;
    };
    // with_net only for its root check and timeout; the cluster makes its own hosts.
    netns::with_net(TEST, 1, TIMEOUT, move |_| {
        let mut cluster = RealCluster::start(&binaries, 2).unwrap_or_else(|e| panic!("{e:#}"));

        // kube-apiserver's namespace cannot reach a worker's kubelet by itself.
        for worker in &cluster.workers {
            let direct = cluster.net.run_in(
                CONTROL_PLANE_HOST,
                &[
                    "curl",
                    "-sk",
                    "--max-time",
                    "5",
                    &format!("https://{}:10250/healthz", worker.node_ip),
                ],
            );
            assert!(
                direct.is_err(),
                "the control plane reached {}'s kubelet directly: {direct:?}",
                worker.name
            );
            // And the kubelet serves only clients kube-apiserver vouches for: what kubectl
            // gets from it below came with kube-apiserver's client certificate, end to end
            // through the tunnel.
            let anonymous = worker
                .run(&[
                    "curl",
                    "-sk",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    &format!("https://{}:10250/pods", worker.node_ip),
                ])
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&anonymous.stdout), "401");
        }

        servers_counted_by_leases(&cluster);
        cluster.control_plane.apply(&pods()).unwrap();
        let ready = cluster
            .control_plane
            .kubectl(&[
                "wait",
                "--for=condition=Ready",
                "pod/shell-1",
                "pod/shell-2",
                "pod/echo",
                "pod/ticker",
                "pod/attached",
                &format!("--timeout={}s", POD_READY.as_secs()),
            ])
            .unwrap();
        assert!(
            ready.status.success(),
            "pods not Ready: {}\n{}",
            String::from_utf8_lossy(&ready.stderr),
            cluster.describe_pods("default"),
        );

        let tunnels_before = tunnels(&cluster);
        let scratch = tempfile::tempdir().unwrap();
        for pod in ["shell-1", "shell-2"] {
            logs(&cluster, pod);
            exec_stdin_and_status(&cluster, pod);
        }
        exec_with_tty(&cluster, "shell-1");
        follow_logs(&cluster);
        copy_both_ways(&cluster, "shell-1", scratch.path());
        port_forward(&cluster);
        attach(&cluster);
        through_services(&cluster);
        byte_counters_agree(&cluster);

        // All of it went through the server: it counted the tunnels.
        let tunnels_after = tunnels(&cluster);
        assert!(
            tunnels_after >= tunnels_before + 11.0,
            "tunnels before {tunnels_before}, after {tunnels_after}"
        );

        kubelet_restarted(&mut cluster);
        agent_replaced(&cluster);
        agents_rolled(&cluster);
        server_replaced(&cluster);

        // A node host removed: the server loses its agent (and no other), the other worker
        // still answers, and the host leaves nothing behind: no Node object, no cgroup.
        let agents = |cluster: &RealCluster| {
            metric(
                &cluster.server_health("/metrics").unwrap(),
                "bridgehead_server_agents_connected",
            )
        };
        // Every agent back with the new server first (bounded).
        let back = Instant::now();
        while agents(&cluster) != 3.0 {
            assert!(
                back.elapsed() < Duration::from_secs(60),
                "the server counts {} agents, not 3",
                agents(&cluster)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let worker = cluster.workers.pop().unwrap();
        let (name, cgroup) = (worker.name.clone(), worker.cgroup_root().to_owned());
        let removed = Instant::now();
        drop(worker);
        // Bounded: the server learns of a vanished agent from its session, within keepalive.
        while agents(&cluster) != 2.0 {
            assert!(
                removed.elapsed() < Duration::from_secs(60),
                "the server still counts {} agents 60 s after {name} went",
                agents(&cluster)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = writeln!(
            std::io::stderr(),
            "{name} removed: its agent gone from the server after {:?}",
            removed.elapsed()
        );
        let exec = cluster
            .control_plane
            .kubectl_ok(&["exec", "shell-1", "--", "echo", "still"])
            .unwrap();
        assert_eq!(exec, "still\n");
        let node = cluster
            .control_plane
            .kubectl(&["get", "node", &name])
            .unwrap();
        assert!(
            String::from_utf8_lossy(&node.stderr).contains("NotFound"),
            "{name} still exists: {node:?}"
        );
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            let left = hierarchy.path().join(&cgroup);
            assert!(!left.exists(), "{} left behind", left.display());
        }
    });
}

/// `kubectl logs`: the kubelet's containerLogs, through the pod's node's agent.
fn logs(cluster: &RealCluster, pod: &str) {
    let logs = cluster.control_plane.kubectl_ok(&["logs", pod]).unwrap();
    assert_eq!(
        logs, "log line 1\nlog line 2\nlog line 3\nlog line 4\nlog line 5\n",
        "{pod}"
    );
}

/// `kubectl exec -i`: 1 MiB of every byte value through cat and back, and the command's exit
/// status carried back as kubectl's.
fn exec_stdin_and_status(cluster: &RealCluster, pod: &str) {
    let input = pattern(1 << 20, pod.len() as u32);
    let mut exec = kubectl(
        cluster,
        &["exec", "-i", pod, "--", "sh", "-c", "cat; exit 3"],
    );
    let mut stdin = exec.stdin.take().unwrap();
    let feed = {
        let input = input.clone();
        std::thread::spawn(move || stdin.write_all(&input).unwrap())
    };
    let output = exec.wait_with_output().unwrap();
    feed.join().unwrap();
    assert_eq!(
        output.status.code(),
        Some(3),
        "kubectl exec {pod}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.stdout == input,
        "exec in {pod}: {} bytes back of {}",
        output.stdout.len(),
        input.len()
    );
}

/// `kubectl exec -it` from a terminal (util-linux `script` gives kubectl a pseudo-terminal):
/// the command in the pod has a terminal too, and its exit status comes back.
fn exec_with_tty(cluster: &RealCluster, pod: &str) {
    let command = format!(
        "{} --kubeconfig={} exec -it {pod} -- sh -c 'tty; exit 5'",
        cluster.control_plane.binaries.kubectl.display(),
        cluster.control_plane.kubeconfig.display()
    );
    let output = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("running script (util-linux)");
    let text = String::from_utf8_lossy(&output.stdout).replace('\r', "");
    assert_eq!(output.status.code(), Some(5), "exec -it {pod}: {text}");
    assert!(text.contains("/dev/pts/"), "no terminal in {pod}: {text:?}");
}

/// `kubectl logs -f`: the ticker's lines arrive in order while they are written, not at the
/// end (twenty lines written 100 ms apart cannot arrive in one burst).
fn follow_logs(cluster: &RealCluster) {
    let mut follow = kubectl(cluster, &["logs", "-f", "--tail=1", "ticker"]);
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let first: u64 = lines
        .next()
        .expect("kubectl logs -f ended")
        .unwrap()
        .strip_prefix("tick ")
        .expect("a tick line")
        .parse()
        .unwrap();
    let started = Instant::now();
    for n in first + 1..=first + 20 {
        let line = lines.next().expect("kubectl logs -f ended").unwrap();
        assert_eq!(line, format!("tick {n}"));
    }
    let took = started.elapsed();
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(
        took >= Duration::from_millis(1500),
        "twenty lines in {took:?}"
    );
}

/// `kubectl cp` into the pod (its sha256 there is the file's) and out of it again (the same
/// bytes), 4 MiB each way.
fn copy_both_ways(cluster: &RealCluster, pod: &str, scratch: &Path) {
    let data = pattern(4 << 20, 7);
    let local = scratch.join("up.bin");
    std::fs::write(&local, &data).unwrap();
    cluster
        .control_plane
        .kubectl_ok(&[
            "cp",
            &local.to_string_lossy(),
            &format!("{pod}:/tmp/up.bin"),
        ])
        .unwrap();
    let digest = ring::digest::digest(&ring::digest::SHA256, &data);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let remote = cluster
        .control_plane
        .kubectl_ok(&["exec", pod, "--", "sha256sum", "/tmp/up.bin"])
        .unwrap();
    assert_eq!(remote.split_whitespace().next(), Some(hex.as_str()));
    let back = scratch.join("down.bin");
    cluster
        .control_plane
        .kubectl_ok(&["cp", &format!("{pod}:/tmp/up.bin"), &back.to_string_lossy()])
        .unwrap();
    assert!(
        std::fs::read(&back).unwrap() == data,
        "kubectl cp out of {pod}"
    );
}

/// `kubectl port-forward` to the echo pod: four connections at once, 1 MiB echoed on each.
fn port_forward(cluster: &RealCluster) {
    let mut forward = kubectl(cluster, &["port-forward", "pod/echo", ":7000"]);
    let mut lines = BufReader::new(forward.stdout.take().unwrap()).lines();
    let line = lines
        .next()
        .expect("kubectl port-forward printed nothing")
        .unwrap();
    // "Forwarding from 127.0.0.1:PORT -> 7000"
    let port: u16 = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("kubectl port-forward said {line:?}"))
        .parse()
        .unwrap();
    let connections: Vec<_> = (0..4u32)
        .map(|i| {
            std::thread::spawn(move || {
                let data = pattern(1 << 20, i);
                let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
                let mut writer = stream.try_clone().unwrap();
                let sent = data.clone();
                let feed = std::thread::spawn(move || writer.write_all(&sent).unwrap());
                let mut back = vec![0; data.len()];
                stream.read_exact(&mut back).unwrap();
                feed.join().unwrap();
                assert!(back == data, "connection {i}: echo differs");
            })
        })
        .collect();
    for connection in connections {
        connection.join().unwrap();
    }
    let _ = forward.kill();
    let _ = forward.wait();
}

/// `kubectl attach -i` to a container running `cat`: what goes in comes out.
fn attach(cluster: &RealCluster) {
    let input = pattern(256 << 10, 3);
    let mut attach = kubectl(cluster, &["attach", "-i", "attached"]);
    let mut stdin = attach.stdin.take().unwrap();
    let mut stdout = attach.stdout.take().unwrap();
    let feed = {
        let input = input.clone();
        std::thread::spawn(move || {
            stdin.write_all(&input).unwrap();
            // Held open: closing it would end cat (and the pod's container) for good.
            stdin
        })
    };
    let mut back = vec![0; input.len()];
    stdout.read_exact(&mut back).unwrap();
    let _stdin = feed.join().unwrap();
    assert!(back == input, "attach: the bytes differ");
    let _ = attach.kill();
    let _ = attach.wait();
}

/// What kube-apiserver reaches at pods behind a Service, each through the egress selector and
/// so through Bridgehead (the server counts a tunnel for each; kube-apiserver's namespace has
/// no route of its own to a worker's pods, which is checked first): `kubectl get --raw` to
/// each pod's proxy subresource and to the Service's (1 MiB checked byte for byte, and the
/// Service's endpoints on both nodes answering), a validating webhook with `failurePolicy:
/// Fail` (a denial carrying the answering pod's node, an allowed write stored), an aggregated
/// API (the APIService Available, a list served by a pod). The webhook and the APIService are
/// removed at the end, so the drills that follow touch neither.
fn through_services(cluster: &RealCluster) {
    let workers: Vec<&str> = cluster.workers.iter().map(|w| w.name.as_str()).collect();
    let server = TestServer::start(&cluster.control_plane, &workers)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.describe_pods("default")));
    let cp = &cluster.control_plane;
    for pod in &server.pods {
        let ip = cp
            .kubectl_ok(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"])
            .unwrap();
        let direct = cluster.net.run_in(
            CONTROL_PLANE_HOST,
            &[
                "curl",
                "-sS",
                "--max-time",
                "5",
                &format!("http://{ip}:8080/"),
            ],
        );
        assert!(
            direct.is_err(),
            "the control plane reached {pod} at {ip} directly: {direct:?}"
        );
    }
    // kube-apiserver keeps connections alive (a tunnel may carry several requests), so each
    // kind of request shows as at least one new tunnel.
    let carried = |what: &str, before: f64| {
        let after = tunnels(cluster);
        assert!(
            after > before,
            "{what}: no tunnel counted ({before} before and after)"
        );
        after
    };
    let mut before = tunnels(cluster);
    let first = before;
    let expected: Vec<u8> = (0..1u32 << 20).map(workload::pattern_byte).collect();
    let raw = |path: &str| -> Vec<u8> {
        let out = cp.kubectl(&["get", "--raw", path]).unwrap();
        assert!(
            out.status.success(),
            "kubectl get --raw {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    for (pod, node) in server.pods.iter().zip(&workers) {
        let proxy = format!("/api/v1/namespaces/default/pods/{pod}:8080/proxy");
        assert!(
            raw(&format!("{proxy}/bytes?n={}", expected.len())) == expected,
            "pod proxy to {pod}: the bytes differ"
        );
        assert_eq!(
            String::from_utf8_lossy(&raw(&format!("{proxy}/hello"))),
            format!("testserver {node}: /hello\n")
        );
    }
    let proxy = format!("/api/v1/namespaces/default/services/{SERVICE}:http/proxy");
    assert!(
        raw(&format!("{proxy}/bytes?n={}", expected.len())) == expected,
        "service proxy: the bytes differ"
    );
    // The service proxy picks an endpoint at random: both nodes' pods answer within a few
    // tries (40 tries all on one of two endpoints: 2^-39).
    let mut answered = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let answer = String::from_utf8_lossy(&raw(&format!("{proxy}/hello"))).into_owned();
        let node = answer
            .strip_prefix("testserver ")
            .and_then(|rest| rest.strip_suffix(": /hello\n"))
            .unwrap_or_else(|| panic!("service proxy answered {answer:?}"))
            .to_owned();
        answered.insert(node);
        if answered.len() == workers.len() {
            break;
        }
    }
    assert_eq!(answered.len(), workers.len(), "answered: {answered:?}");
    // Pod and service proxy share kube-apiserver's proxy transport (and its idle connections).
    before = carried("pod and service proxy", before);

    // The webhook: kube-apiserver picks the configuration up shortly after it is stored
    // (bounded poll), then every guarded write goes to a pod of the Service.
    cp.apply(&server.webhook_yaml("bridgehead-test")).unwrap();
    let mut denied_by = std::collections::BTreeSet::new();
    let started = Instant::now();
    for attempt in 0.. {
        let name = format!("denied-{attempt}");
        let out = cp
            .kubectl_as(
                &cp.kubeconfig,
                &["create", "-f", "-"],
                Some(&TestServer::guarded_configmap_yaml(&name)),
            )
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some((_, node)) = stderr.split_once(DENIAL) {
            denied_by.insert(node.trim().to_owned());
            if denied_by.len() == workers.len() {
                break;
            }
        } else {
            assert!(
                started.elapsed() < Duration::from_secs(30) && attempt < 200,
                "the webhook did not answer for {name}: {stderr}"
            );
            if out.status.success() {
                // Stored before the configuration took effect.
                cp.kubectl_ok(&["delete", "configmap", &name]).unwrap();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    cp.apply(&TestServer::guarded_configmap_yaml("allowed"))
        .unwrap();
    before = carried("webhook", before);
    assert_eq!(
        cp.kubectl_ok(&[
            "get",
            "configmap",
            "allowed",
            "-o",
            "jsonpath={.data.written}"
        ])
        .unwrap(),
        "allowed"
    );

    // The aggregated API: the availability check (discovery through a tunnel) marks it
    // Available (bounded poll: nothing announces it), then lists come from the pods.
    cp.apply(&server.api_service_yaml()).unwrap();
    let available = Instant::now();
    loop {
        let status = cp
            .kubectl_ok(&[
                "get",
                "apiservice",
                &format!("v1.{API_GROUP}"),
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
            ])
            .unwrap_or_default();
        if status.trim() == "True" {
            break;
        }
        assert!(
            available.elapsed() < Duration::from_secs(60),
            "the APIService is not Available: {}",
            cp.kubectl_ok(&[
                "get",
                "apiservice",
                &format!("v1.{API_GROUP}"),
                "-o",
                "yaml"
            ])
            .unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let greetings =
        String::from_utf8_lossy(&raw(&format!("/apis/{API_GROUP}/v1/greetings"))).into_owned();
    assert!(
        workers
            .iter()
            .any(|node| greetings.contains(&format!("\"hello-from-{node}\""))),
        "{greetings}"
    );

    let after = carried("aggregated API", before);
    cp.kubectl_ok(&[
        "delete",
        "validatingwebhookconfiguration",
        "bridgehead-test",
    ])
    .unwrap();
    cp.kubectl_ok(&["delete", "apiservice", &format!("v1.{API_GROUP}")])
        .unwrap();
    let _ = writeln!(
        std::io::stderr(),
        "pod and service proxy, webhook (denied by {denied_by:?}) and aggregated API: {} tunnels",
        after - first
    );
}

/// The server's byte counters agree with the sums of the agents' (each agent's metrics scraped
/// on its health port, from inside its node): every byte of every tunnel is counted on each
/// side. Not to the byte: a tunnel cut while its target still writes (a `kubectl logs -f`
/// killed while the ticker prints) leaves a few bytes the agent read and sent after the
/// server's client had gone, so they agree within one stream window (64 KiB), the agents' count
/// never below the server's for what came from targets. Polled (bounded) until a tunnel still
/// winding down has counted its last bytes.
fn byte_counters_agree(cluster: &RealCluster) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut summed = [0.0; 2];
        for (_, metrics) in agent_metrics(cluster) {
            for (i, direction) in ["to_target", "from_target"].iter().enumerate() {
                summed[i] += metric(
                    &metrics,
                    &format!("bridgehead_agent_bytes_total{{direction=\"{direction}\"}}"),
                );
            }
        }
        let server = cluster.server_health("/metrics").unwrap();
        let served = ["to_target", "from_target"].map(|direction| {
            metric(
                &server,
                &format!("bridgehead_server_bytes_total{{direction=\"{direction}\"}}"),
            )
        });
        // At least the 4 MiB copied each way and the 4 MiB echoed through port-forward.
        assert!(served[0] > (8 << 20) as f64, "server counted {served:?}");
        const WINDOW: f64 = (64 << 10) as f64;
        if (served[0] - summed[0]).abs() <= WINDOW
            && summed[1] >= served[1]
            && summed[1] - served[1] <= WINDOW
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "byte counters disagree: server {served:?}, agents {summed:?} (to, from target)"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Each agent's metrics (with its node's name), scraped on its health port from inside its
/// node.
fn agent_metrics(cluster: &RealCluster) -> Vec<(String, String)> {
    let agents = cluster
        .control_plane
        .kubectl_ok(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "app.kubernetes.io/name=bridgehead-agent",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.status.podIP}{\"\\n\"}{end}",
        ])
        .unwrap();
    agents
        .lines()
        .map(|line| {
            let (node, ip) = line.split_once(' ').unwrap();
            let host = std::iter::once(&cluster.control_plane_node)
                .chain(&cluster.workers)
                .find(|host| host.name == node)
                .unwrap_or_else(|| panic!("no node {node}"));
            let out = host
                .run(&[
                    "curl",
                    "-sS",
                    "--max-time",
                    "5",
                    &format!("http://{ip}:8134/metrics"),
                ])
                .unwrap();
            (
                node.to_owned(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        })
        .collect()
}

/// Lease counting as deploy/ sets it up: the server (`--enable-lease-controller`) holds its
/// Lease, and the agents (`--count-server-leases`, in-cluster configuration through the
/// `kubernetes` Service) count the valid Leases: one more valid Lease of a server that does
/// not exist makes every agent look for two servers, and its removal for one again.
fn servers_counted_by_leases(cluster: &RealCluster) {
    const SELECTOR: &str = "k8s-app=konnectivity-server";
    let cp = &cluster.control_plane;
    let holders = cp
        .kubectl_ok(&[
            "get",
            "leases",
            "-n",
            "kube-system",
            "-l",
            SELECTOR,
            "-o",
            "jsonpath={.items[*].spec.holderIdentity}",
        ])
        .unwrap();
    assert_eq!(
        holders.split_whitespace().count(),
        1,
        "the server's Lease: {holders:?}"
    );
    let counted = |servers: f64| {
        let started = Instant::now();
        loop {
            let counts: Vec<(String, f64)> = agent_metrics(cluster)
                .into_iter()
                .map(|(node, text)| (node, metric(&text, "bridgehead_agent_known_servers")))
                .collect();
            if counts.len() == 3 && counts.iter().all(|(_, n)| *n == servers) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "agents count {counts:?} servers, not {servers}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    counted(1.0);
    let now = utc_now();
    cp.apply(&format!(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: bridgehead-test-absent-server\n  namespace: kube-system\n  labels:\n    k8s-app: konnectivity-server\nspec:\n  holderIdentity: absent-server\n  leaseDurationSeconds: 3600\n  renewTime: \"{now}\"\n"
    ))
    .unwrap();
    let up = counted(2.0);
    cp.kubectl_ok(&[
        "delete",
        "lease",
        "-n",
        "kube-system",
        "bridgehead-test-absent-server",
    ])
    .unwrap();
    let down = counted(1.0);
    let _ = writeln!(
        std::io::stderr(),
        "Lease counting: a second valid Lease counted by every agent after {up:?}, its removal after {down:?}"
    );
}

/// Now as a Lease's `renewTime` (RFC 3339 with microseconds, UTC).
fn utc_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%S.%6NZ"])
        .output()
        .expect("running date");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The value of `series` (its full name with labels) in Prometheus text, 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The drill of a kubelet restarted (worker-2's, killed and started again): a `kubectl logs -f`
/// through it ends, `kubectl exec` into its node works again within seconds, and its pods kept
/// running meanwhile.
fn kubelet_restarted(cluster: &mut RealCluster) {
    let (mut follow, lines_rx) = ticker_lines(cluster);
    let restarted = Instant::now();
    cluster.workers[1].restart_kubelet().unwrap();
    // The stream through the old kubelet ends: kubectl's output closes.
    wait_for_the_end(
        &lines_rx,
        Duration::from_secs(30),
        "kubectl logs -f still open 30 s after its kubelet was killed",
    );
    let ended = restarted.elapsed();
    let _ = follow.kill();
    let _ = follow.wait();
    let failures = exec_until_it_works(
        cluster,
        "shell-2",
        restarted,
        Duration::from_secs(60),
        || {
            format!(
                "no exec into worker-2 within 60 s of its kubelet's restart\n{}",
                cluster.workers[1].kubelet_log()
            )
        },
    );
    let recovered = restarted.elapsed();
    // The pods ran on: the shell's container is the one that started with the node.
    let restarts = cluster
        .control_plane
        .kubectl_ok(&[
            "get",
            "pod",
            "shell-2",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ])
        .unwrap();
    assert_eq!(restarts, "0");
    let _ = writeln!(
        std::io::stderr(),
        "kubelet on worker-2 restarted: logs -f through it ended after {ended:?}, exec worked again after {recovered:?} ({failures} failed tries)"
    );
}

/// The drill of an agent pod deleted: the DaemonSet replaces it, `kubectl exec` into its node
/// works again within seconds, and a `kubectl logs -f` on another node loses no line.
fn agent_replaced(cluster: &RealCluster) {
    let mut follow = kubectl(cluster, &["logs", "-f", "--tail=1", "ticker"]);
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let tick = |line: Option<std::io::Result<String>>| -> u64 {
        let line = line.expect("kubectl logs -f ended").unwrap();
        line.strip_prefix("tick ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("not a tick: {line:?}"))
    };
    let mut last = tick(lines.next());
    let agent = cluster
        .control_plane
        .kubectl_ok(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "app.kubernetes.io/name=bridgehead-agent",
            "--field-selector=spec.nodeName=worker-1",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ])
        .unwrap();
    let deleted = Instant::now();
    cluster
        .control_plane
        .kubectl_ok(&["delete", "pod", "-n", "kube-system", &agent, "--wait=false"])
        .unwrap();
    // Bounded: the replacement announces nothing the test can wait on but a working exec.
    let failures =
        exec_until_it_works(cluster, "shell-1", deleted, Duration::from_secs(90), || {
            format!(
                "no exec into worker-1 within 90 s of its agent's deletion\n{}",
                cluster.describe_pods("kube-system")
            )
        });
    let recovered = deleted.elapsed();
    // Meanwhile on worker-2: every tick, in order.
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        let next = tick(lines.next());
        assert_eq!(next, last + 1, "kubectl logs -f on worker-2 lost lines");
        last = next;
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let _ = writeln!(
        std::io::stderr(),
        "agent on worker-1 deleted: exec into worker-1 worked again after {recovered:?} ({failures} failed tries)"
    );
}

/// The agents' DaemonSet rolled to a new image (the same image under a new tag on every node,
/// as a registry would serve a new release): the rollout completes, every agent runs the new
/// image, and exec reaches both workers through the new agents.
fn agents_rolled(cluster: &RealCluster) {
    const ROLLED: &str = "docker.io/library/bridgehead:0.1.0-rolled";
    for host in std::iter::once(&cluster.control_plane_node).chain(&cluster.workers) {
        let out = host
            .ctr(&[
                "images",
                "tag",
                "docker.io/library/bridgehead:0.1.0",
                ROLLED,
            ])
            .unwrap();
        assert!(
            out.status.success(),
            "tagging on {}: {}",
            host.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A log stream through the agents while they roll: shorter than their drain grace
    // period, so even the one whose own node's agent is replaced meanwhile must end cleanly,
    // every line in order.
    let (countdown, countdown_lines) = countdown(cluster);
    let started = Instant::now();
    cluster
        .control_plane
        .kubectl_ok(&[
            "set",
            "image",
            "-n",
            "kube-system",
            "daemonset/bridgehead-agent",
            "agent=bridgehead:0.1.0-rolled",
        ])
        .unwrap();
    cluster
        .rollout("bridgehead-agent", Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let rolled = started.elapsed();
    let followed = countdown.wait_with_output().unwrap();
    let lines = countdown_lines.join().unwrap();
    assert!(
        followed.status.success(),
        "kubectl logs -f through the rollout failed: {}",
        String::from_utf8_lossy(&followed.stderr)
    );
    let expected: Vec<String> = (0..COUNTDOWN_LINES).map(|i| format!("left {i}")).collect();
    assert_eq!(lines, expected, "the log stream through the rollout");
    cluster
        .control_plane
        .kubectl_ok(&["delete", "pod", "countdown", "--wait=false"])
        .unwrap();
    let images = cluster
        .control_plane
        .kubectl_ok(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "app.kubernetes.io/name=bridgehead-agent",
            "-o",
            "jsonpath={.items[*].spec.containers[0].image}",
        ])
        .unwrap();
    assert_eq!(
        images.split_whitespace().collect::<Vec<_>>(),
        ["bridgehead:0.1.0-rolled"; 3],
        "{images}"
    );
    for pod in ["shell-1", "shell-2"] {
        exec_until_it_works(
            cluster,
            pod,
            Instant::now(),
            Duration::from_secs(30),
            || format!("no exec into {pod} within 30 s of the rollout"),
        );
    }
    let _ = writeln!(
        std::io::stderr(),
        "agents' DaemonSet rolled to a new image in {rolled:?}"
    );
}

/// The drill of the server's static pod replaced (its manifest changed, as an upgrade does): a
/// `kubectl logs -f` through the old server ends within its shutdown grace period and kubelet's,
/// and `kubectl exec` works again once the new server runs and the agents are back.
fn server_replaced(cluster: &RealCluster) {
    let (mut follow, lines_rx) = ticker_lines(cluster);
    // A new revision of the manifest, written beside it and renamed over it (kubelet skips
    // dot files), as a configuration tool would.
    let manifests = cluster.etc_kubernetes().join("manifests");
    let manifest = manifests.join("konnectivity-server.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let revised = text.replacen(
        "\n  labels:\n",
        "\n  annotations:\n    bridgehead.test/revision: \"2\"\n  labels:\n",
        1,
    );
    assert_ne!(
        revised, text,
        "the manifest has no metadata.labels to revise beside"
    );
    std::fs::write(manifests.join(".konnectivity-server.yaml.new"), revised).unwrap();
    let replaced = Instant::now();
    std::fs::rename(manifests.join(".konnectivity-server.yaml.new"), &manifest).unwrap();
    wait_for_the_end(
        &lines_rx,
        Duration::from_secs(90),
        "kubectl logs -f still open 90 s after the server's manifest changed",
    );
    let cut = replaced.elapsed();
    let _ = follow.kill();
    let _ = follow.wait();
    let failures = exec_until_it_works(
        cluster,
        "shell-2",
        replaced,
        Duration::from_secs(150),
        || {
            format!(
                "no exec within 150 s of the server's replacement\n{}",
                cluster.describe_pods("kube-system")
            )
        },
    );
    let recovered = replaced.elapsed();
    let _ = writeln!(
        std::io::stderr(),
        "server's static pod replaced: logs -f through it cut after {cut:?}, exec worked again after {recovered:?} ({failures} failed tries)"
    );
}

/// `kubectl logs -f` of the ticker, its lines on a channel (closed when the stream ends), once
/// its first line came.
/// Lines the countdown pod prints, one every 0.1 s: about 20 s, within the agents' 30 s
/// drain grace period.
const COUNTDOWN_LINES: usize = 200;

/// A pod on worker-2 that prints [`COUNTDOWN_LINES`] lines and exits, once Running, and a
/// `kubectl logs -f` of it from its first line; the lines it read come back from the thread.
fn countdown(cluster: &RealCluster) -> (Child, std::thread::JoinHandle<Vec<String>>) {
    let script = format!(
        "i=0; while [ $i -lt {COUNTDOWN_LINES} ]; do echo left $i; i=$((i+1)); usleep 100000; done"
    );
    cluster
        .control_plane
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: countdown\n  namespace: default\nspec:\n  nodeName: worker-2\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: bridgehead.invalid/busybox:1\n    imagePullPolicy: Never\n    command: [sh, -c, '{script}']\n"
        ))
        .unwrap();
    let ready = cluster
        .control_plane
        .kubectl(&[
            "wait",
            "--for=condition=Ready",
            "pod/countdown",
            &format!("--timeout={}s", POD_READY.as_secs()),
        ])
        .unwrap();
    assert!(
        ready.status.success(),
        "countdown not Ready: {}",
        String::from_utf8_lossy(&ready.stderr)
    );
    let mut follow = kubectl(cluster, &["logs", "-f", "countdown"]);
    let stdout = follow.stdout.take().unwrap();
    let lines = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect()
    });
    (follow, lines)
}

fn ticker_lines(
    cluster: &RealCluster,
) -> (Child, std::sync::mpsc::Receiver<std::io::Result<String>>) {
    let mut follow = kubectl(cluster, &["logs", "-f", "--tail=1", "ticker"]);
    let stdout = follow.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    lines_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("kubectl logs -f printed nothing")
        .unwrap();
    (follow, lines_rx)
}

/// Runs `kubectl exec POD -- echo back` until it works, within `within` of `since`; panics
/// with `context()` and the last error past that. Returns how many tries failed first.
fn exec_until_it_works(
    cluster: &RealCluster,
    pod: &str,
    since: Instant,
    within: Duration,
    context: impl Fn() -> String,
) -> usize {
    let mut failures = 0;
    loop {
        let exec = cluster
            .control_plane
            .kubectl(&["exec", pod, "--", "echo", "back"])
            .unwrap();
        if exec.status.success() && exec.stdout == b"back\n" {
            return failures;
        }
        failures += 1;
        assert!(
            since.elapsed() < within,
            "{}: {}",
            context(),
            String::from_utf8_lossy(&exec.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the stream feeding `lines` ends (kubectl's output closed), every line before
/// taken; panics with `what` when it is still open after `within` without a line.
fn wait_for_the_end<T>(lines: &std::sync::mpsc::Receiver<T>, within: Duration, what: &str) {
    loop {
        match lines.recv_timeout(within) {
            Ok(_) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}"),
        }
    }
}

/// `kubectl ARGS` with the admin kubeconfig as a child, stdin, stdout and stderr piped.
fn kubectl(cluster: &RealCluster, args: &[&str]) -> Child {
    Command::new(&cluster.control_plane.binaries.kubectl)
        .arg(format!(
            "--kubeconfig={}",
            cluster.control_plane.kubeconfig.display()
        ))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `len` bytes of a pattern that takes every byte value, different for each `seed`.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// The tunnels the server has opened so far (`bridgehead_server_dials_total{result="ok"}`).
fn tunnels(cluster: &RealCluster) -> f64 {
    let metrics = cluster.server_health("/metrics").unwrap();
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("bridgehead_server_dials_total{") && line.contains("result=\"ok\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
