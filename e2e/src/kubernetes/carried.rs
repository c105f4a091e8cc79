//! What an installed Bridgehead must carry, checked on a [`RealCluster`] the way an operator
//! would after an install (docs/install.md, the chart): `kubectl exec`, `kubectl logs -f` and a
//! `failurePolicy: Fail` admission webhook, each counted as tunnels by the server. The deeper
//! checks of one install shape (bytes, port-forward, cp, rollouts) live in e2e/tests/cluster.rs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::real_cluster::{metric_sum, RealCluster, POD_READY};
use super::workload::{self, TestServer, DENIAL};

/// The pod [`pods`] makes: it prints `tick N` every 100 ms.
pub const TICKER: &str = "ticker";

/// How long kube-apiserver may take to act on a stored webhook configuration.
const WEBHOOK_EFFECT: Duration = Duration::from_secs(30);

/// The ticker pod on `node`, created and Ready.
pub fn pods(cluster: &RealCluster, node: &str) -> anyhow::Result<()> {
    let cp = &cluster.control_plane;
    cp.apply(&workload::busybox_pods(
        &[(
            TICKER,
            node,
            "i=0; while true; do echo tick $i; i=$((i+1)); usleep 100000; done",
        )],
        true,
    ))?;
    cp.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        &format!("pod/{TICKER}"),
        &format!("--timeout={}s", POD_READY.as_secs()),
    ])
    .with_context(|| cluster.describe_pods("default"))?;
    Ok(())
}

/// The tunnels the server on the control-plane node has opened so far
/// (`bridgehead_server_dials_total{result="ok"}` on its health port, 8134).
pub fn tunnels(cluster: &RealCluster) -> anyhow::Result<f64> {
    let metrics = cluster.server_health("/metrics")?;
    if !metrics.contains("bridgehead_server_dials_total") {
        bail!("no server metrics on the control-plane node's 8134: {metrics:?}");
    }
    Ok(metric_sum(
        &metrics,
        "bridgehead_server_dials_total",
        &["result=\"ok\""],
    ))
}

/// `kubectl exec -i`: 64 KiB through `cat` in the ticker pod and back, and the command's exit
/// status carried back as kubectl's.
pub fn exec(cluster: &RealCluster) -> anyhow::Result<()> {
    let input: Vec<u8> = (0..64u32 << 10).map(workload::pattern_byte).collect();
    let mut child = kubectl(
        cluster,
        &["exec", "-i", TICKER, "--", "sh", "-c", "cat; exit 3"],
    )?;
    let mut stdin = child.stdin.take().context("kubectl's stdin")?;
    let feed = {
        let input = input.clone();
        std::thread::spawn(move || stdin.write_all(&input))
    };
    let output = child.wait_with_output()?;
    let _ = feed.join();
    if output.status.code() != Some(3) || output.stdout != input {
        bail!(
            "kubectl exec: status {:?}, {} bytes back of {}: {}",
            output.status.code(),
            output.stdout.len(),
            input.len(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// `kubectl logs -f`: the ticker's lines arrive in order while they are written (ten lines
/// written 100 ms apart cannot arrive in one burst).
pub fn follow_logs(cluster: &RealCluster) -> anyhow::Result<()> {
    let mut child = kubectl(cluster, &["logs", "-f", "--tail=1", TICKER])?;
    let stdout = child.stdout.take().context("kubectl's stdout")?;
    let result = (|| {
        let mut lines = BufReader::new(stdout).lines();
        let mut next = || -> anyhow::Result<u64> {
            let line = lines.next().context("kubectl logs -f ended")??;
            line.strip_prefix("tick ")
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("not a tick: {line:?}"))
        };
        let first = next()?;
        let started = Instant::now();
        for expected in first + 1..=first + 10 {
            let got = next()?;
            if got != expected {
                bail!("tick {got} after tick {}", expected - 1);
            }
        }
        let took = started.elapsed();
        if took < Duration::from_millis(700) {
            bail!("ten lines in {took:?}: not followed while written");
        }
        Ok(())
    })();
    let _ = child.kill();
    let stderr = child
        .wait_with_output()
        .map(|out| out.stderr)
        .unwrap_or_default();
    result.with_context(|| format!("kubectl logs -f: {}", String::from_utf8_lossy(&stderr)))
}

/// A validating webhook with `failurePolicy: Fail`, served by a testserver pod on `node`
/// behind a Service: a guarded write it denies comes back denied by that pod (so
/// kube-apiserver reached it), and an allowed one is stored. Removed at the end.
pub fn webhook(cluster: &RealCluster, node: &str) -> anyhow::Result<()> {
    let cp = &cluster.control_plane;
    let server =
        TestServer::start(cp, &[node]).with_context(|| cluster.describe_pods("default"))?;
    cp.apply(&server.webhook_yaml("bridgehead-install"))?;
    // kube-apiserver acts on the configuration shortly after it is stored: bounded poll.
    let started = Instant::now();
    for attempt in 0.. {
        let name = format!("denied-{attempt}");
        let out = cp.kubectl_as(
            &cp.kubeconfig,
            &["create", "-f", "-"],
            Some(&TestServer::guarded_configmap_yaml(&name)),
        )?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some((_, by)) = stderr.split_once(DENIAL) {
            if by.trim() != node {
                bail!("denied by {by:?}, not {node}");
            }
            break;
        }
        if started.elapsed() > WEBHOOK_EFFECT {
            bail!("the webhook did not answer for {name}: {stderr}");
        }
        if out.status.success() {
            // Stored before the configuration took effect.
            cp.kubectl_ok(&["delete", "configmap", &name])?;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    cp.apply(&TestServer::guarded_configmap_yaml("allowed"))?;
    cp.kubectl_ok(&[
        "delete",
        "validatingwebhookconfiguration",
        "bridgehead-install",
    ])?;
    Ok(())
}

/// One check of [`all_through_bridgehead`], given the cluster and the node of the workload.
type Check = fn(&RealCluster, &str) -> anyhow::Result<()>;

/// [`exec`], [`follow_logs`] and [`webhook`] (on `node`), each of which must add to the
/// server's [`tunnels`]: proof that they went through Bridgehead, not around it.
pub fn all_through_bridgehead(cluster: &RealCluster, node: &str) -> anyhow::Result<()> {
    let checks: [(&str, Check); 3] = [
        ("kubectl exec", |cluster, _| exec(cluster)),
        ("kubectl logs -f", |cluster, _| follow_logs(cluster)),
        ("a failurePolicy: Fail webhook", webhook),
    ];
    for (what, check) in checks {
        let before = tunnels(cluster)?;
        check(cluster, node).with_context(|| what.to_owned())?;
        let after = tunnels(cluster)?;
        if after <= before {
            bail!("{what} worked, but the server counted no tunnel ({before} before and after)");
        }
        let _ = writeln!(
            std::io::stderr(),
            "{what}: through Bridgehead ({} tunnels)",
            after - before
        );
    }
    Ok(())
}

/// `kubectl ARGS` with the admin kubeconfig as a child, its standard streams piped.
fn kubectl(cluster: &RealCluster, args: &[&str]) -> anyhow::Result<std::process::Child> {
    let cp = &cluster.control_plane;
    Command::new(&cp.binaries.kubectl)
        .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl")
}
