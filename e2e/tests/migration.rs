//! docs/migrating.md's path "Without a failed request", step by step, on a real cluster
//! ([`RealCluster`] started on konnectivity, `Install::Konnectivity`): konnectivity's own
//! server (a static pod in `grpc` mode, kubernetes.io's, on the Unix socket kube-apiserver's
//! egress selector names) and agents (a DaemonSet), built from their Go module into an image
//! built as ours is, carry the workloads first. Then, while a client loop runs `kubectl exec`
//! into both workers, `kubectl logs -f` of a pod, and writes that a validating webhook
//! (`failurePolicy: Fail`, served by a pod on each worker behind a Service) guards: step 0
//! (konnectivity to `http-connect`), Bridgehead's
//! server beside konnectivity's with `--fallback-proxy` at konnectivity's socket, Bridgehead's
//! agents, kube-apiserver's egress moved to Bridgehead's socket, konnectivity's agents out,
//! konnectivity's server out. Zero failed requests from start to end, and at the end no tunnel
//! through konnectivity: its metrics and Bridgehead's agree.
//!
//! One control-plane node: the kube-apiserver restarts of steps 0 and 3 are outages of the API
//! itself (on several control-plane nodes the others serve meanwhile), step 0's until
//! konnectivity's agents are back. The loop pauses across them, as a client of a load balancer
//! would be sent elsewhere, and counts every other request.
//! Needs root, `scripts/k8s-build.sh`, `scripts/install-test-deps.sh` and Go (konnectivity
//! from its module); skipped loudly otherwise.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bridgehead_e2e::kubernetes::konnectivity::Mode;
use bridgehead_e2e::kubernetes::real_cluster::{
    deploy, metric_sum, Install, RealCluster, POD_READY,
};
use bridgehead_e2e::kubernetes::workload::{self, TestServer, DENIAL};
use bridgehead_e2e::kubernetes::{self, Egress};
use bridgehead_e2e::netns;

/// The whole test, cluster start included.
const TIMEOUT: Duration = Duration::from_secs(600);
/// konnectivity's health port (its metrics too), as kubernetes.io's manifest sets it.
const KONNECTIVITY_HEALTH: u16 = 8134;
/// Bridgehead's health port beside konnectivity's, as docs/migrating.md step 1 sets it.
const BRIDGEHEAD_HEALTH: u16 = 8144;
/// konnectivity's socket, under /etc/kubernetes (kubernetes.io's and deploy/'s).
const KONNECTIVITY_SOCKET: &str = "konnectivity-server/konnectivity-server.socket";
/// Bridgehead's socket beside konnectivity's (docs/migrating.md), under /etc/kubernetes.
const BRIDGEHEAD_SOCKET: &str = "bridgehead/bridgehead.sock";
/// Successful rounds each client makes after a step before the next one starts.
const ROUNDS: usize = 3;

/// The pods the loop uses: a shell on each worker, a ticker on worker-2.
fn pods() -> String {
    workload::busybox_pods(
        &[
            ("shell-1", "worker-1", "exec sleep 3600"),
            ("shell-2", "worker-2", "exec sleep 3600"),
            (
                "ticker",
                "worker-2",
                "i=0; while true; do echo tick $i; i=$((i+1)); usleep 100000; done",
            ),
        ],
        false,
    )
}

#[test]
fn from_konnectivity_to_bridgehead_without_a_failed_request() {
    const TEST: &str = "from_konnectivity_to_bridgehead_without_a_failed_request";
    let Some(binaries) = kubernetes::require_nodes(TEST) else {
        return;
    };
    netns::with_net(TEST, 1, TIMEOUT, move |_| {
        let mut cluster = RealCluster::start_with(&binaries, 2, Install::Konnectivity(Mode::Grpc))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let konnectivity = |cluster: &RealCluster| {
            cluster
                .control_plane_get(KONNECTIVITY_HEALTH, "/metrics")
                .unwrap_or_default()
        };
        let bridgehead = |cluster: &RealCluster| {
            cluster
                .control_plane_get(BRIDGEHEAD_HEALTH, "/metrics")
                .unwrap_or_default()
        };
        until(
            Duration::from_secs(60),
            "konnectivity's three agents",
            || {
                metric_sum(
                    &konnectivity(&cluster),
                    "konnectivity_network_proxy_server_ready_backend_connections",
                    &[],
                ) == 3.0
            },
        );

        // The workloads, on konnectivity.
        cluster.control_plane.apply(&pods()).unwrap();
        cluster
            .control_plane
            .kubectl_ok(&[
                "wait",
                "--for=condition=Ready",
                "pod/shell-1",
                "pod/shell-2",
                "pod/ticker",
                &format!("--timeout={}s", POD_READY.as_secs()),
            ])
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.describe_pods("default")));
        let server = TestServer::start(&cluster.control_plane, &["worker-1", "worker-2"])
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.describe_pods("default")));
        cluster
            .control_plane
            .apply(&server.webhook_yaml("guard"))
            .unwrap();
        // The webhook in force (kube-apiserver picks the configuration up shortly after it
        // is stored): a denied- write is denied by a pod, through konnectivity.
        let cp = &cluster.control_plane;
        let mut attempt = 0;
        until(Duration::from_secs(30), "the webhook in force", || {
            attempt += 1;
            let name = format!("denied-{attempt}");
            let out = cp
                .kubectl_as(
                    &cp.kubeconfig,
                    &["create", "-f", "-"],
                    Some(&TestServer::guarded_configmap_yaml(&name)),
                )
                .unwrap();
            if out.status.success() {
                cp.kubectl_ok(&["delete", "configmap", &name]).unwrap();
            }
            String::from_utf8_lossy(&out.stderr).contains(DENIAL)
        });
        let carried_by_konnectivity = konnectivity_dials(&konnectivity(&cluster));
        assert!(
            carried_by_konnectivity > 0.0,
            "konnectivity dialed nothing:\n{}",
            konnectivity(&cluster)
        );

        let clients = Clients::start(&cluster);
        clients.progress(ROUNDS);
        let started = Instant::now();

        // Step 0: konnectivity's server to http-connect, with kube-apiserver stopped (the loop
        // paused: with one control-plane node the API is out until the agents are back).
        let manifests = cluster.etc_kubernetes().join("manifests");
        let step_0 = {
            let _paused = clients.gate.write().unwrap();
            let stopped = Instant::now();
            let old_start = metric_sum(&konnectivity(&cluster), "process_start_time_seconds", &[]);
            cluster.control_plane.stop_apiserver();
            // docs/migrating.md step 0: its --mode, and nothing else.
            let manifest = manifests.join("konnectivity-server.yaml");
            let grpc = std::fs::read_to_string(&manifest).unwrap();
            assert!(grpc.contains("- --mode=grpc\n"), "{grpc}");
            write_atomically(
                &manifest,
                &grpc.replace("- --mode=grpc\n", "- --mode=http-connect\n"),
            );
            until(
                Duration::from_secs(60),
                "konnectivity's server restarted in http-connect mode",
                || {
                    let now = konnectivity(&cluster);
                    let started = metric_sum(&now, "process_start_time_seconds", &[]);
                    started > 0.0 && started != old_start
                },
            );
            cluster
                .control_plane
                .start_apiserver(&Egress::Uds(
                    cluster.etc_kubernetes().join(KONNECTIVITY_SOCKET),
                ))
                .unwrap();
            // Its agents authenticate by TokenReview: back only once kube-apiserver is.
            let api_back = stopped.elapsed();
            until(
                Duration::from_secs(90),
                "konnectivity's agents back",
                || {
                    metric_sum(
                        &konnectivity(&cluster),
                        "konnectivity_network_proxy_server_ready_backend_connections",
                        &[],
                    ) == 3.0
                },
            );
            (api_back, stopped.elapsed())
        };
        clients.progress(ROUNDS);
        log(&format!(
            "step 0: konnectivity in http-connect mode; kube-apiserver back after {:?}, konnectivity's agents after {:?}",
            step_0.0, step_0.1
        ));

        let fallback_ok = |cluster: &RealCluster| {
            metric_sum(
                &bridgehead(cluster),
                "bridgehead_server_fallback_dials_total",
                &["result=\"ok\""],
            )
        };

        // Step 1: Bridgehead's server beside konnectivity's, its fallback konnectivity's
        // socket.
        write_atomically(
            &manifests.join("bridgehead-server.yaml"),
            &bridgehead_beside_konnectivity(&cluster),
        );
        until(Duration::from_secs(60), "Bridgehead's /healthz", || {
            cluster
                .control_plane_get(BRIDGEHEAD_HEALTH, "/healthz")
                .is_ok_and(|body| body.trim() == "ok")
        });
        clients.progress(ROUNDS);
        log(&format!(
            "step 1: Bridgehead's server beside konnectivity's after {:?}",
            started.elapsed()
        ));

        // Step 2: Bridgehead's agents, on port 8142.
        cluster
            .install_agents(&["--proxy-server-port=8142"])
            .unwrap_or_else(|e| panic!("{e:#}"));
        until(Duration::from_secs(60), "Bridgehead's three agents", || {
            metric_sum(
                &bridgehead(&cluster),
                "bridgehead_server_agents_connected",
                &[],
            ) == 3.0
        });
        clients.progress(ROUNDS);
        log(&format!(
            "step 2: Bridgehead's agents in after {:?}",
            started.elapsed()
        ));

        // Step 3: kube-apiserver's egress to Bridgehead's socket (a restart, the loop paused).
        let socket = cluster.etc_kubernetes().join(BRIDGEHEAD_SOCKET);
        let restart = {
            let _paused = clients.gate.write().unwrap();
            let restarted = Instant::now();
            cluster
                .control_plane
                .restart_apiserver(&Egress::Uds(socket))
                .unwrap();
            restarted.elapsed()
        };
        let konnectivity_after_step_3 = konnectivity_dials(&konnectivity(&cluster));
        let fallback_after_step_3 = fallback_ok(&cluster);
        clients.progress(ROUNDS);
        log(&format!(
            "step 3: kube-apiserver's egress to Bridgehead after {:?} ({restart:?} of restart)",
            started.elapsed()
        ));

        // Step 4: once konnectivity carries no tunnel, its agents out.
        let quiet = Instant::now();
        until(
            Duration::from_secs(120),
            "no tunnel through konnectivity",
            || {
                let old = konnectivity(&cluster);
                metric_sum(
                    &old,
                    "konnectivity_network_proxy_server_established_connections",
                    &[],
                ) == 0.0
                    && metric_sum(
                        &bridgehead(&cluster),
                        "bridgehead_server_fallback_tunnels_open",
                        &[],
                    ) == 0.0
            },
        );
        let quiet_after = quiet.elapsed();
        cluster
            .control_plane
            .kubectl_ok(&[
                "delete",
                "daemonset",
                "-n",
                "kube-system",
                "konnectivity-agent",
                "--wait=false",
            ])
            .unwrap();
        // Bounded poll. kube-controller-manager's garbage collector deletes the pods: seen, they
        // stayed Running some 40 s after the DaemonSet went (shortly after kube-apiserver's
        // restart), then Terminating for up to their grace period (30 s); 110 s in all.
        until(
            Duration::from_secs(240),
            "konnectivity's agents gone",
            || {
                cluster
                    .control_plane
                    .kubectl_ok(&[
                        "get",
                        "pods",
                        "-n",
                        "kube-system",
                        "-l",
                        "k8s-app=konnectivity-agent",
                        "-o",
                        "name",
                    ])
                    .is_ok_and(|pods| pods.trim().is_empty())
            },
        );
        clients.progress(ROUNDS);
        log(&format!(
            "step 4: konnectivity's agents out after {:?} (its last tunnel ended {:?} after step 3)",
            started.elapsed(),
            quiet_after,
        ));

        // Both sides agree: konnectivity carries no tunnel and dialed nothing since
        // kube-apiserver left it; Bridgehead relayed it nothing since.
        let old = konnectivity(&cluster);
        assert_eq!(
            metric_sum(
                &old,
                "konnectivity_network_proxy_server_established_connections",
                &[]
            ),
            0.0,
            "{old}"
        );
        assert_eq!(konnectivity_dials(&old), konnectivity_after_step_3, "{old}");
        assert_eq!(fallback_ok(&cluster), fallback_after_step_3);

        // Step 5: konnectivity's server out.
        std::fs::remove_file(manifests.join("konnectivity-server.yaml")).unwrap();
        until(
            Duration::from_secs(60),
            "konnectivity's server gone",
            || {
                cluster
                    .control_plane_get(KONNECTIVITY_HEALTH, "/healthz")
                    .is_err()
            },
        );
        clients.progress(ROUNDS);
        log(&format!(
            "step 5: konnectivity's server out after {:?}",
            started.elapsed()
        ));

        let tallies = clients.stop();
        for tally in &tallies {
            log(&format!(
                "{}: {} requests, {} failed",
                tally.what,
                tally.ok,
                tally.failures.len()
            ));
        }
        let failures: Vec<&String> = tallies.iter().flat_map(|t| &t.failures).collect();
        assert!(
            failures.is_empty(),
            "failed requests during the migration:\n{failures:#?}"
        );
        assert_eq!(fallback_ok(&cluster), fallback_after_step_3);
        // And the clients' tunnels ran through Bridgehead's agents since step 2 (its dials
        // count the fallback's too).
        let through_agents = metric_sum(
            &bridgehead(&cluster),
            "bridgehead_server_dials_total",
            &["result=\"ok\""],
        ) - fallback_after_step_3;
        assert!(
            through_agents > 0.0,
            "no tunnel through Bridgehead's agents:\n{}",
            bridgehead(&cluster)
        );
        log(&format!(
            "migrated in {:?}: {} tunnels through konnectivity's server, {} through the fallback, {through_agents} through Bridgehead's agents",
            started.elapsed(),
            konnectivity_after_step_3,
            fallback_after_step_3,
        ));
        drop(server);
    });
}

/// Dials konnectivity's server made (its dial latency histogram's count).
fn konnectivity_dials(metrics: &str) -> f64 {
    metric_sum(
        metrics,
        "konnectivity_network_proxy_server_dial_duration_seconds_count",
        &[],
    )
}

/// docs/migrating.md step 1: deploy/'s server manifest with "konnectivity's flags as in step
/// 3 above but `--uds-name=/etc/kubernetes/bridgehead/bridgehead.sock`, `--agent-port=8142`,
/// `--admin-port=8143`, `--health-port=8144`, and `--fallback-proxy=unix://` konnectivity's
/// socket (a hostPath volume for each of the two socket directories)", under its own name;
/// its image pulled from the cluster's registry.
fn bridgehead_beside_konnectivity(cluster: &RealCluster) -> String {
    let mut text = cluster
        .pulled_from_registry(
            &std::fs::read_to_string(deploy().join("server-static-pod/konnectivity-server.yaml"))
                .unwrap(),
        )
        .unwrap();
    for (from, to) in [
        ("\n  name: konnectivity-server\n", "\n  name: bridgehead-server\n"),
        (
            "--uds-name=/etc/kubernetes/konnectivity-server/konnectivity-server.socket",
            "--uds-name=/etc/kubernetes/bridgehead/bridgehead.sock\n    - --fallback-proxy=unix:///etc/kubernetes/konnectivity-server/konnectivity-server.socket",
        ),
        ("8132", "8142"),
        ("8133", "8143"),
        ("8134", "8144"),
        (
            "  volumes:\n",
            "    - name: bridgehead-uds\n      mountPath: /etc/kubernetes/bridgehead\n  volumes:\n  - name: bridgehead-uds\n    hostPath:\n      path: /etc/kubernetes/bridgehead\n      type: DirectoryOrCreate\n",
        ),
    ] {
        assert!(
            text.contains(from),
            "deploy/'s server manifest has no {from:?}"
        );
        text = text.replace(from, to);
    }
    text
}

/// Writes `path` as a configuration tool would: beside it, then renamed over it (kubelet
/// skips dot files).
fn write_atomically(path: &std::path::Path, text: &str) {
    let name = path.file_name().unwrap().to_string_lossy();
    let temporary = path.with_file_name(format!(".{name}.new"));
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// What one client did.
#[derive(Debug)]
struct Tally {
    what: &'static str,
    ok: usize,
    failures: Vec<String>,
}

/// The client loop: a thread per kind of request, each taking `gate` for reading around
/// every request (the test takes it for writing across a kube-apiserver restart).
struct Clients {
    gate: Arc<RwLock<()>>,
    stop: Arc<AtomicBool>,
    counts: Vec<Arc<AtomicUsize>>,
    threads: Vec<JoinHandle<Tally>>,
}

impl Clients {
    fn start(cluster: &RealCluster) -> Clients {
        let gate = Arc::new(RwLock::new(()));
        let stop = Arc::new(AtomicBool::new(false));
        let kubectl = Kubectl {
            program: cluster.control_plane.binaries.kubectl.clone(),
            kubeconfig: cluster.control_plane.kubeconfig.clone(),
        };
        type Round = Box<dyn FnMut(&Kubectl, usize) -> Result<(), String> + Send>;
        let rounds: Vec<(&'static str, Round)> = vec![
            (
                "kubectl exec",
                Box::new(|kubectl: &Kubectl, n: usize| {
                    let pod = if n % 2 == 0 { "shell-1" } else { "shell-2" };
                    let out = kubectl.run(&["exec", pod, "--", "echo", "back"], None);
                    match out {
                        Ok(out) if out == b"back\n" => Ok(()),
                        Ok(out) => Err(format!("exec {pod}: {:?}", String::from_utf8_lossy(&out))),
                        Err(e) => Err(format!("exec {pod}: {e}")),
                    }
                }),
            ),
            (
                "guarded writes",
                Box::new(|kubectl: &Kubectl, n: usize| {
                    let yaml = TestServer::guarded_configmap_yaml(&format!("write-{n}"));
                    kubectl
                        .run(&["create", "-f", "-"], Some(&yaml))
                        .map(|_| ())
                        .map_err(|e| format!("write-{n}: {e}"))
                }),
            ),
            ("kubectl logs -f", Box::new(follow_ten_lines)),
        ];
        let mut counts = Vec::new();
        let mut threads = Vec::new();
        for (what, mut round) in rounds {
            let (gate, stop, kubectl) = (gate.clone(), stop.clone(), kubectl.clone());
            let count = Arc::new(AtomicUsize::new(0));
            counts.push(count.clone());
            threads.push(std::thread::spawn(move || {
                let mut tally = Tally {
                    what,
                    ok: 0,
                    failures: Vec::new(),
                };
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Poisoned only when the test failed already.
                    let _open = gate.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                    n += 1;
                    match round(&kubectl, n) {
                        Ok(()) => tally.ok += 1,
                        Err(failure) => {
                            log(&format!("FAILED {what}: {failure}"));
                            tally.failures.push(failure);
                        }
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                }
                tally
            }));
        }
        Clients {
            gate,
            stop,
            counts,
            threads,
        }
    }

    /// Waits until every client finished `rounds` more requests (bounded).
    fn progress(&self, rounds: usize) {
        let targets: Vec<usize> = self
            .counts
            .iter()
            .map(|count| count.load(Ordering::Relaxed) + rounds)
            .collect();
        until(Duration::from_secs(90), "the clients' progress", || {
            self.counts
                .iter()
                .zip(&targets)
                .all(|(count, target)| count.load(Ordering::Relaxed) >= *target)
        });
    }

    fn stop(self) -> Vec<Tally> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|thread| thread.join().expect("a client thread panicked"))
            .collect()
    }
}

/// kubectl with the admin kubeconfig, for the client threads.
#[derive(Debug, Clone)]
struct Kubectl {
    program: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.program);
        command
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg("--request-timeout=30s")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// Runs kubectl to its end: its stdout, or its stderr as the error.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<Vec<u8>, String> {
        let mut command = self.command(args);
        command.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = command.spawn().map_err(|e| e.to_string())?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().ok_or("no stdin")?;
            pipe.write_all(input.as_bytes())
                .map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }
}

/// `kubectl logs -f` of the ticker until ten consecutive lines came (about a second).
fn follow_ten_lines(kubectl: &Kubectl, _: usize) -> Result<(), String> {
    let mut command = kubectl.command(&["logs", "-f", "--tail=1", "ticker"]);
    let mut child = command
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let stderr = child.stderr.take();
    let mut lines = BufReader::new(stdout).lines();
    let tick = |line: Option<std::io::Result<String>>| -> Option<u64> {
        line?.ok()?.strip_prefix("tick ")?.parse().ok()
    };
    let mut result = Ok(());
    let mut last = tick(lines.next());
    for _ in 0..10 {
        let next = tick(lines.next());
        match (last, next) {
            (Some(a), Some(b)) if b == a + 1 => last = next,
            _ => {
                result = Err(format!("logs -f: after tick {last:?} came {next:?}"));
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    if result.is_err() {
        let mut text = String::new();
        if let Some(mut pipe) = stderr {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
        }
        result = result.map_err(|e| format!("{e}; {}", text.trim()));
    }
    result
}

/// Polls `check` (bounded: what it waits for announces itself nowhere) until it holds;
/// panics naming `what` after `within`.
fn until(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A line on the terminal past the harness's capture.
fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
