//! A simulator process: the bench binary again (`bench --fleet-worker`), holding a slice of
//! the fleet, so that no process needs more descriptors than one may have. It reads its
//! [`Spec`] as the first line of its standard input, starts its agents, and then answers each
//! `stats` line with one JSON line of its [`Snapshot`]; at the end of its input it stops every
//! agent and exits, so a worker never outlives the bench.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bridgehead_runtime::tls;
use serde::{Deserialize, Serialize};

use super::agent::{self, Agent, Shared};
use super::connect::Endpoint;
use super::counters::{Counters, Snapshot};
use super::identity::{Identity, MAX_AGENTS};

/// Descriptors a worker needs beyond one per session and one per agent (while a drained
/// session finishes, the next attempt).
pub const FD_SLACK: u64 = 256;

/// What one worker simulates.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    /// The server's agent endpoint.
    pub server: SocketAddr,
    /// The CA the server's certificate is checked against (`--ca-cert`).
    pub ca: PathBuf,
    /// The client certificate and key every agent presents, if any.
    pub certificate: Option<(PathBuf, PathBuf)>,
    /// A file of bearer tokens, one a line: agent `i` presents line `i`.
    pub tokens: Option<PathBuf>,
    /// The first agent's index, and how many agents from there.
    pub first: usize,
    pub count: usize,
    /// Each agent's first attempt comes at a random moment within this.
    pub start_within: Duration,
    /// Sessions each agent holds at most (one per server behind the address).
    pub sessions_per_agent: usize,
    /// How late each agent answers each step of its handshake (`--fleet-client-delay`).
    /// (Its bounds: `Lateness` itself is not serialised.)
    #[serde(default)]
    pub lateness: Option<(Duration, Duration)>,
    /// Every agent on one thread (`--fleet-shared-cores`), as a simulator written with one
    /// event loop runs them: its answers then also wait for each other's TLS work, on the
    /// cores the server uses.
    #[serde(default)]
    pub one_thread: bool,
}

/// Runs a worker: the spec from the first line of stdin, then commands until stdin ends.
pub fn serve() -> anyhow::Result<()> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the worker's spec")?;
    let spec: Spec = serde_json::from_str(&line).context("parsing the worker's spec")?;
    if spec.first + spec.count > MAX_AGENTS {
        bail!("at most {MAX_AGENTS} agents");
    }
    // A session with each server, and the next attempt.
    let want = spec.count as u64 * (spec.sessions_per_agent.max(1) as u64 + 1) + FD_SLACK;
    let have = bridgehead_runtime::limits::raise_nofile_to(Some(want)).unwrap_or(0);
    if have < want {
        bail!(
            "{} agents need {want} descriptors, RLIMIT_NOFILE allows {have}",
            spec.count
        );
    }
    tls::install_crypto_provider();
    let tokens = match &spec.tokens {
        Some(path) => Some(tokens(path, spec.first, spec.count)?),
        None => None,
    };
    let shared = Arc::new(Shared {
        endpoint: Endpoint {
            addr: spec.server,
            tls: client_config(&spec.ca, spec.certificate.as_ref())?,
            lateness: spec
                .lateness
                .map(|(min, max)| bridgehead_e2e::late::Lateness { min, max }),
        },
        counters: Counters::default(),
        stop: tokio_util::sync::CancellationToken::new(),
    });
    let runtime = if spec.one_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()?;
    let mut tokens = tokens.map(Vec::into_iter);
    let agents = tokio_util::task::TaskTracker::new();
    for index in spec.first..spec.first + spec.count {
        let agent = Agent {
            identity: Identity::of(index),
            token: tokens.as_mut().and_then(Iterator::next),
        };
        let run = agent::run(agent, shared.clone(), spec.start_within);
        drop(runtime.spawn(agents.track_future(run)));
    }
    agents.close();
    // The runtime is driven on a thread of its own (its only one with `one_thread`) until the
    // stop, then gives the agents a moment to close.
    let stop = shared.stop.clone();
    let driver = std::thread::spawn(move || {
        runtime.block_on(async {
            stop.cancelled().await;
            let _ = tokio::time::timeout(Duration::from_secs(5), agents.wait()).await;
        });
    });
    println!("fleet worker started {} agents", spec.count);
    // The commands, read here while the runtime runs the agents.
    let commands = std::io::stdin().lines().try_for_each(|line| {
        match line?.trim() {
            "stats" => answer(&shared.counters.snapshot())?,
            "" => {}
            other => eprintln!("fleet worker: unknown command {other:?}"),
        }
        anyhow::Ok(())
    });
    shared.stop.cancel();
    let _ = driver.join();
    commands
}

/// Writes `snapshot` as one line on stdout.
fn answer(snapshot: &Snapshot) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, snapshot)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// Lines `first..first + count` of the token file (one token a line, blank lines skipped).
pub fn tokens(path: &Path, first: usize, count: usize) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .skip(first)
        .take(count)
        .map(str::to_owned)
        .collect();
    if tokens.len() < count {
        bail!(
            "{} holds fewer than {} tokens (one a line, one per agent)",
            path.display(),
            first + count
        );
    }
    Ok(tokens)
}

/// The agents' TLS client: the agent's settings (its crypto provider, ALPN `http/1.1`), the
/// server checked against `ca`, `certificate` (and its key) presented if given, and no session
/// resumption, since the agent builds a fresh client for every connection.
pub fn client_config(
    ca: &Path,
    certificate: Option<&(PathBuf, PathBuf)>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let roots = tls::load_roots(ca).context("loading the agents' CA")?;
    let builder = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match certificate {
        Some((cert, key)) => builder
            .with_client_auth_cert(tls::load_certs(cert)?, tls::load_key(key)?)
            .context("the agents' certificate and key")?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}
