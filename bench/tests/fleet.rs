//! The fleet simulator: a simulated agent's upgrade and backoff against a stand-in agent
//! endpoint, and `bench --only fleet` with a few dozen agents against the real server.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridgehead_bench::fleet::agent::{self, Agent, Shared};
use bridgehead_bench::fleet::connect::Endpoint;
use bridgehead_bench::fleet::counters::Counters;
use bridgehead_bench::fleet::identity::Identity;
use bridgehead_bench::fleet::worker::client_config;
use bridgehead_e2e::Pki;
use bridgehead_runtime::http_head::{self, RawHead};
use bridgehead_runtime::tls;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Longest wait for the simulated agent's next attempt.
const ATTEMPT: Duration = Duration::from_secs(20);
/// What a busy CI machine may add to a delay.
const SLACK: Duration = Duration::from_secs(1);

/// Takes one attempt: the TLS handshake, the upgrade request's head (and when it arrived),
/// answered with `answer`.
async fn take_attempt(
    listener: &TcpListener,
    acceptor: &TlsAcceptor,
    answer: &str,
) -> (String, Instant) {
    tokio::time::timeout(ATTEMPT, async {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        let RawHead::Complete { buf, end } = http_head::read(&mut tls).await else {
            panic!("no upgrade request");
        };
        let arrived = Instant::now();
        tls.write_all(answer.as_bytes()).await.unwrap();
        tls.shutdown().await.unwrap();
        (String::from_utf8_lossy(&buf[..end]).into_owned(), arrived)
    })
    .await
    .expect("the simulated agent did not come back in time")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_simulated_agent_presents_its_token_and_honours_a_retry_hint_then_backs_off() {
    tls::install_crypto_provider();
    let pki = Pki::new().unwrap();
    let server = rustls::ServerConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            tls::load_certs(&pki.path("cluster.crt")).unwrap(),
            tls::load_key(&pki.path("cluster.key")).unwrap(),
        )
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(server));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shared = Arc::new(Shared {
        endpoint: Endpoint {
            addr: listener.local_addr().unwrap(),
            tls: client_config(&pki.path("cluster-ca.crt"), None).unwrap(),
            lateness: None,
        },
        counters: Counters::default(),
        stop: CancellationToken::new(),
    });
    let agent = Agent {
        identity: Identity::of(7),
        token: Some("token-of-7".to_owned()),
    };
    tokio::spawn(agent::run(agent, shared.clone(), Duration::ZERO));

    let busy = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nContent-Length: 0\r\n\r\n";
    let (head, first) = take_attempt(&listener, &acceptor, busy).await;
    let forbidden = "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n";
    let (_, second) = take_attempt(&listener, &acceptor, forbidden).await;
    let (_, third) = take_attempt(&listener, &acceptor, forbidden).await;
    shared.stop.cancel();

    assert!(
        head.starts_with("GET /connect?id=fleet-00007&host=node-00007&ipv4=10.0.0.8 HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("\r\nAuthorization: Bearer token-of-7\r\n"),
        "{head}"
    );
    assert!(
        head.contains("\r\nSec-WebSocket-Protocol: bridgehead.v1\r\n"),
        "{head}"
    );
    // The hint, ±20 %, in place of the first step's 1 s.
    let hinted = second - first;
    assert!(
        hinted >= Duration::from_millis(2400) && hinted <= Duration::from_millis(3600) + SLACK,
        "came back {hinted:?} after Retry-After: 3"
    );
    // Without a hint, the schedule's second step: 1.5 s ±20 %.
    let backed_off = third - second;
    assert!(
        backed_off >= Duration::from_millis(1200)
            && backed_off <= Duration::from_millis(1800) + SLACK,
        "came back {backed_off:?} after a 403"
    );
    let seen = shared.counters.snapshot();
    assert_eq!(seen.failed_of("http:503"), 1, "{seen:?}");
    // The third answer may still be on its way when the agent stops.
    assert!(seen.failed_of("http:403") >= 1, "{seen:?}");
    assert_eq!(seen.hints, 1, "{seen:?}");
}

#[test]
fn a_small_fleet_comes_back_through_stalled_handshakes_and_carries_routed_tunnels() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("results.jsonl");
    let agents = 40;
    let stalled = 100;
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--quick", "--only", "fleet"])
        .args(["--agents", &agents.to_string()])
        .args(["--fleet-stalled", &stalled.to_string()])
        .arg("--json")
        .arg(&json)
        .arg("--out-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stderr}");
    let lines = std::fs::read_to_string(&json).unwrap();
    let rows: Vec<serde_json::Value> = lines
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let of = |measurement: &str| -> Vec<&serde_json::Value> {
        rows.iter()
            .filter(|row| row["measurement"] == measurement)
            .collect()
    };
    let errors: Vec<_> = of("check")
        .into_iter()
        .filter(|row| row["outcome"] == "ERROR")
        .collect();
    assert!(errors.is_empty(), "{errors:?}\n{stderr}");
    assert!(of("fleet_start")[0]["back_s"].is_number(), "{lines}");

    let restarts = of("fleet_restart");
    assert_eq!(restarts.len(), 2, "{lines}");
    for (row, signal) in restarts.iter().zip(["KILL", "TERM"]) {
        assert_eq!(row["signal"], signal, "{row}");
        assert!(row["back_s"].is_number(), "not all back: {row}");
        assert!(row["connected"].as_u64() >= Some(agents), "{row}");
        assert!(row["stalled_opened"].as_u64() >= Some(stalled), "{row}");
    }
    // SIGKILL just loses every session; SIGTERM drains them first.
    let (killed, terminated) = (restarts[0], restarts[1]);
    assert_eq!(killed["lost"].as_u64(), Some(agents), "{killed}");
    assert_eq!(terminated["drained"].as_u64(), Some(agents), "{terminated}");

    let routing = of("fleet_routing")[0];
    assert_eq!(routing["misrouted"], 0, "{routing}");
    assert_eq!(routing["ok"], routing["connects"], "{routing}");
    let trickle = of("fleet_trickle")[0];
    assert!(trickle["outcomes"]["ok"].as_u64() > Some(0), "{trickle}");
    assert_eq!(trickle["misrouted"], 0, "{trickle}");
    let admin = of("fleet_admin");
    assert_eq!(admin.len(), 2, "{lines}");
    for row in admin {
        assert!(row["bytes"].as_u64() > Some(0), "{row}");
    }
    let idle = of("fleet_idle")[0];
    assert!(idle["server_rss"].as_u64() > Some(0), "{idle}");
}

/// Slow agents on one thread beside the server (`--fleet-client-delay`,
/// `--fleet-shared-cores`): every step of each handshake late, and every agent back after
/// both restarts.
#[test]
fn a_slow_fleet_on_one_thread_comes_back_after_both_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("results.jsonl");
    let agents = 20;
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--quick", "--only", "fleet"])
        .args(["--agents", &agents.to_string()])
        .args([
            "--fleet-client-delay",
            "200ms..400ms",
            "--fleet-shared-cores",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--out-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stderr}");
    assert!(
        stderr.contains("each step 200ms..400ms late, simulator on one thread"),
        "{stderr}"
    );
    let lines = std::fs::read_to_string(&json).unwrap();
    let restarts: Vec<serde_json::Value> = lines
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|row| row["measurement"] == "fleet_restart")
        .collect();
    assert_eq!(restarts.len(), 2, "{lines}");
    for row in &restarts {
        assert!(row["back_s"].is_number(), "not all back: {row}");
        assert_eq!(row["client_delay"], "200ms..400ms", "{row}");
        assert_eq!(row["shared_cores"], true, "{row}");
    }
}
