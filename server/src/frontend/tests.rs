//! The CONNECT pipeline as a client sees it: one connection served by [`connection::serve`]
//! over an in-memory pipe, with in-process agent sessions behind the registry. What the client
//! reads back (the `200` and the tunnel's bytes, or a refusal's status and reason), what the
//! agent is asked, and what the metrics count. Then the listeners: the Unix socket (its file
//! and mode, a stale socket replaced, anything else left alone) and mTLS with
//! `--allowed-clients`.

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bridgehead_certs::Pki;
use bridgehead_mux::{DialRequest, Keepalive, Mux, MuxStream};
use bridgehead_proto::ident::AgentIdentifiers;
use bridgehead_proto::ErrorCode;
use bridgehead_runtime::accept::RateLimit;
use bridgehead_runtime::threads::Shards;
use bridgehead_runtime::tls::{load_certs, load_key, load_roots, provider};
use bytes::Bytes;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;

use super::*;
use crate::agents::auth::AgentAuth;
use crate::frontend::handshakes::Handshakes;
use crate::process::metrics::Metrics;
use crate::routing::admission::Admission;
use crate::routing::registry::{Registration, Registry};
use crate::routing::router::Strategy;
use crate::test_util::metric;

use bridgehead_test_support::{bounded, MuxPair, TEST_TIMEOUT};

mod fallback;

const HEAD: &[u8] = b"CONNECT 10.0.0.5:10250 HTTP/1.1\r\nHost: 10.0.0.5:10250\r\n\r\n";

/// The server's end of a client connection: a pipe that tells how many bytes the server has
/// read from it, and whether the server made its close a reset.
#[derive(Debug)]
struct ServerEnd {
    io: DuplexStream,
    read: watch::Sender<usize>,
    aborted: Arc<AtomicBool>,
}

/// The client's end, and what it can see of the server's.
struct ClientEnd {
    io: DuplexStream,
    read: watch::Receiver<usize>,
    aborted: Arc<AtomicBool>,
}

fn connection() -> (ServerEnd, ClientEnd) {
    let (server, client) = tokio::io::duplex(256 * 1024);
    let (read, seen) = watch::channel(0);
    let aborted = Arc::new(AtomicBool::new(false));
    (
        ServerEnd {
            io: server,
            read,
            aborted: aborted.clone(),
        },
        ClientEnd {
            io: client,
            read: seen,
            aborted,
        },
    )
}

impl AsyncRead for ServerEnd {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        this.read.send_modify(|read| *read += n);
        result
    }
}

impl AsyncWrite for ServerEnd {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl TunnelSocket for ServerEnd {
    fn abort_on_close(&self) {
        self.aborted.store(true, Ordering::SeqCst);
    }

    fn set_receive_buffer(&self, _bytes: u32) -> io::Result<()> {
        Ok(())
    }

    fn set_send_buffer(&self, _bytes: u32) -> io::Result<()> {
        Ok(())
    }
}

/// An in-memory pipe belongs to no runtime: it moves as it is.
impl ClientSocket for ServerEnd {
    type Detached = ServerEnd;

    fn detach(self) -> io::Result<ServerEnd> {
        Ok(self)
    }

    fn attach(detached: ServerEnd) -> io::Result<ServerEnd> {
        Ok(detached)
    }
}

/// The server's shared state with `registry` behind it, nothing held back.
fn context(registry: Registry) -> Arc<Context> {
    context_with_dial_timeout(registry, TEST_TIMEOUT)
}

/// [`context`] with `--dial-timeout` `dial_timeout`.
fn context_with_dial_timeout(registry: Registry, dial_timeout: Duration) -> Arc<Context> {
    context_with_fallback(registry, dial_timeout, None)
}

/// [`context`] with `--dial-timeout` `dial_timeout` and `--fallback-proxy` `fallback`.
fn context_with_fallback(
    registry: Registry,
    dial_timeout: Duration,
    fallback: Option<crate::routing::fallback::Fallback>,
) -> Arc<Context> {
    let memory = bridgehead_mux::memory::TunnelMemory::unbounded();
    let metrics = Metrics::new(&memory.budget, &memory.earned);
    let mut config = crate::test_util::test_config();
    config.routing.dial_timeout = dial_timeout;
    Arc::new(Context {
        config,
        registry,
        admission: Admission::new(16, 16, metrics.routing.dials_pending.clone()),
        metrics,
        agent_auth: AgentAuth::new(false, None, false),
        frontend_handshakes: Handshakes::new(16),
        agent_admission: crate::agents::admission::HandshakeAdmission::new(
            16,
            TEST_TIMEOUT,
            TEST_TIMEOUT * 2,
        ),
        refusal_log: RateLimit::new(10),
        tunnels: TaskTracker::new(),
        memory,
        shards: Shards::none(),
        fallback,
        revocation: Default::default(),
        peers_settled: crate::routing::settled::Settled::already(),
    })
}

/// A context whose registry holds one agent taking every target; returns the agent's end of
/// its session.
async fn context_with_agent() -> (Arc<Context>, Mux, CancellationToken) {
    agent_context(TEST_TIMEOUT).await
}

/// [`context_with_agent`] with `--dial-timeout` `dial_timeout`.
async fn agent_context(dial_timeout: Duration) -> (Arc<Context>, Mux, CancellationToken) {
    let shutdown = CancellationToken::new();
    let MuxPair { server, agent } = MuxPair::new(256 * 1024, &shutdown);
    let registry = Registry::new(vec![Strategy::Default], 100);
    register_agent(&registry, server);
    (
        context_with_dial_timeout(registry, dial_timeout),
        agent,
        shutdown,
    )
}

/// Registers `mux` as `agent-1`, taking every target.
fn register_agent(registry: &Registry, mux: Mux) {
    registry
        .register(Registration {
            name: "agent-1".to_owned(),
            identity: "certificate CN=agent-1".to_owned(),
            identifiers: AgentIdentifiers::default(),
            peer: SocketAddr::from(([127, 0, 0, 1], 1)),
            mux,
        })
        .unwrap();
}

/// Serves `server` in a task of its own, as the listeners do.
fn serve(server: ServerEnd, ctx: &Arc<Context>) -> tokio::task::JoinHandle<()> {
    let client = ClientKey::from(&b"test client"[..]);
    tokio::spawn(connection::serve(Box::new(server), client, ctx.clone()))
}

fn dials(ctx: &Context, result: &str) -> f64 {
    metric(
        ctx,
        &format!("bridgehead_server_dials_total{{result=\"{result}\"}}"),
    )
}

async fn next_dial(agent: &Mux) -> DialRequest {
    agent.accept().await.expect("a dial request")
}

/// Reads exactly `n` bytes.
async fn read_n(io: &mut DuplexStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    io.read_exact(&mut buf).await.unwrap();
    buf
}

/// Everything a target's stream delivers until its end.
async fn read_stream(stream: &MuxStream) -> Vec<u8> {
    let mut got = Vec::new();
    while let Some(chunk) = stream.read().await.unwrap() {
        got.extend_from_slice(&chunk);
    }
    got
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// A dialed tunnel: the client gets exactly the `200` head, the bytes it sent behind its head
/// reach the target first, data flows both ways until both sides finish, and the metrics count
/// one successful dial, the bytes each way, and no tunnel left open.
#[tokio::test]
async fn a_tunnel_is_answered_200_and_carries_bytes_both_ways() {
    bounded(async {
        let (ctx, agent, shutdown) = context_with_agent().await;
        let (server, mut client) = connection();
        let served = serve(server, &ctx);
        client
            .io
            .write_all(&[HEAD, b"early"].concat())
            .await
            .unwrap();
        let dial = next_dial(&agent).await;
        assert_eq!((dial.host.as_str(), dial.port), ("10.0.0.5", 10250));
        let target = dial.accept().unwrap();
        assert_eq!(
            read_n(&mut client.io, head::ESTABLISHED.len()).await,
            head::ESTABLISHED
        );
        target.write(Bytes::from_static(b"banner")).await.unwrap();
        assert_eq!(read_n(&mut client.io, 6).await, b"banner");
        assert_eq!(metric(&ctx, "bridgehead_server_tunnels_open"), 1.0);
        client.io.write_all(b" and more").await.unwrap();
        client.io.shutdown().await.unwrap();
        assert_eq!(read_stream(&target).await, b"early and more");
        target.finish().unwrap();
        let mut rest = Vec::new();
        client.io.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        served.await.unwrap();
        assert!(!client.aborted.load(Ordering::SeqCst));
        assert_eq!(dials(&ctx, "ok"), 1.0);
        assert_eq!(metric(&ctx, "bridgehead_server_tunnels_open"), 0.0);
        assert_eq!(metric(&ctx, "bridgehead_server_dials_pending"), 0.0);
        let bytes = |direction: &str| {
            metric(
                &ctx,
                &format!("bridgehead_server_bytes_total{{direction=\"{direction}\"}}"),
            )
        };
        assert_eq!((bytes("to_target"), bytes("from_target")), (14.0, 6.0));
        shutdown.cancel();
    })
    .await
}

/// A tunnel the target's side resets ends the client's connection with a reset, not a clean
/// end of data.
#[tokio::test]
async fn a_failed_tunnel_ends_the_client_connection_with_a_reset() {
    bounded(async {
        let (ctx, agent, shutdown) = context_with_agent().await;
        let (server, mut client) = connection();
        let served = serve(server, &ctx);
        client.io.write_all(HEAD).await.unwrap();
        let target = next_dial(&agent).await.accept().unwrap();
        assert_eq!(
            read_n(&mut client.io, head::ESTABLISHED.len()).await,
            head::ESTABLISHED
        );
        target.reset(ErrorCode::ConnectionReset, "target reset");
        served.await.unwrap();
        assert!(client.aborted.load(Ordering::SeqCst));
        shutdown.cancel();
    })
    .await
}

/// Reads a whole refusal: the status line and the body, then the server's close.
async fn refusal_of(ctx: &Arc<Context>, request: &[u8]) -> (String, String) {
    let (server, mut client) = connection();
    let served = serve(server, ctx);
    client.io.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    client.io.read_to_end(&mut answer).await.unwrap();
    served.await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("a whole head");
    (head.to_owned(), body.to_owned())
}

/// Every refusal on the way is answered with its status and reason, and counted under its
/// label: a request that is not CONNECT, a bad target, no agent for the target, an agent whose
/// dial failed.
#[tokio::test]
async fn refusals_are_answered_with_status_and_reason_and_counted() {
    bounded(async {
        let (ctx, agent, shutdown) = context_with_agent().await;
        let (head, body) = refusal_of(&ctx, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            head.starts_with("HTTP/1.1 405 ") && head.contains("\r\nallow: CONNECT"),
            "{head}"
        );
        assert_eq!(body, "only CONNECT is served here\n");
        let (head, _) = refusal_of(&ctx, b"CONNECT 10.0.0.5 HTTP/1.1\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
        assert_eq!(dials(&ctx, "bad_request"), 2.0);

        let rejecting = tokio::spawn(async move {
            next_dial(&agent)
                .await
                .reject(ErrorCode::Refused, "connection refused");
            agent
        });
        let (head, body) = refusal_of(&ctx, HEAD).await;
        assert!(head.starts_with("HTTP/1.1 502 "), "{head}");
        assert!(body.contains("connection refused"), "{body}");
        assert_eq!(dials(&ctx, "refused"), 1.0);
        let _agent = rejecting.await.unwrap();

        let (head, _) =
            refusal_of(&context(Registry::new(vec![Strategy::Default], 100)), HEAD).await;
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert_eq!(dials(&ctx, "ok"), 0.0);
        shutdown.cancel();
    })
    .await
}

/// The dial has `--dial-timeout` from the CONNECT: an agent that answers within it opens the
/// tunnel; one that never answers gets the client a 504 when it has passed, and hears the
/// dial cancelled. (The clock is tokio's paused one: it moves only when told to, or when
/// every task waits for a timer.)
#[tokio::test(start_paused = true)]
async fn the_dial_has_until_its_timeout_from_the_connect() {
    bounded(async {
        let dial_timeout = Duration::from_secs(10);
        let (ctx, agent, shutdown) = agent_context(dial_timeout).await;
        let (server, mut client) = connection();
        let served = serve(server, &ctx);
        client.io.write_all(HEAD).await.unwrap();
        let dial = next_dial(&agent).await;
        tokio::time::advance(dial_timeout / 2).await;
        let target = dial.accept().unwrap();
        assert_eq!(
            read_n(&mut client.io, head::ESTABLISHED.len()).await,
            head::ESTABLISHED
        );
        drop(target);
        served.await.unwrap();

        let silent = tokio::spawn(async move {
            next_dial(&agent).await.cancelled().await;
            agent
        });
        let started = tokio::time::Instant::now();
        let (head, body) = refusal_of(&ctx, HEAD).await;
        assert!(head.starts_with("HTTP/1.1 504 "), "{head}");
        assert!(body.contains("did not connect"), "{body}");
        let waited = started.elapsed();
        assert!(
            waited >= dial_timeout && waited < 2 * dial_timeout,
            "{waited:?}"
        );
        let _agent = silent.await.unwrap();
        assert_eq!(dials(&ctx, "timed_out"), 1.0);
        shutdown.cancel();
    })
    .await
}

/// A client that leaves while its dial is pending cancels the dial (the agent hears it) and
/// frees its admission slot; nothing is answered.
#[tokio::test]
async fn a_client_that_leaves_while_its_dial_is_pending_cancels_it() {
    bounded(async {
        let (ctx, agent, shutdown) = context_with_agent().await;
        let (server, mut client) = connection();
        let served = serve(server, &ctx);
        client.io.write_all(HEAD).await.unwrap();
        let dial = next_dial(&agent).await;
        assert_eq!(metric(&ctx, "bridgehead_server_dials_pending"), 1.0);
        drop(client.io);
        dial.cancelled().await;
        served.await.unwrap();
        assert_eq!(metric(&ctx, "bridgehead_server_dials_pending"), 0.0);
        assert_eq!(dials(&ctx, "ok"), 0.0);
        shutdown.cancel();
    })
    .await
}

/// What a client sends behind its head and while its dial is pending is read ahead only up to
/// 64 KiB; the rest waits in the socket. All of it reaches the target, in order, once the dial
/// is answered.
#[tokio::test]
async fn bytes_sent_while_the_dial_is_pending_are_read_ahead_up_to_64_kib() {
    bounded(async {
        let (ctx, agent, shutdown) = context_with_agent().await;
        let (server, mut client) = connection();
        let served = serve(server, &ctx);
        let sent = pattern(5 + 64 * 1024 + 10);
        client
            .io
            .write_all(&[HEAD, &sent[..5]].concat())
            .await
            .unwrap();
        let dial = next_dial(&agent).await;
        client.io.write_all(&sent[5..]).await.unwrap();
        let read = *client
            .read
            .wait_for(|read| *read >= HEAD.len() + 64 * 1024)
            .await
            .unwrap();
        assert_eq!(read, HEAD.len() + 64 * 1024);
        let target = dial.accept().unwrap();
        assert_eq!(
            read_n(&mut client.io, head::ESTABLISHED.len()).await,
            head::ESTABLISHED
        );
        client.io.shutdown().await.unwrap();
        assert!(
            read_stream(&target).await == sent,
            "the target got other bytes"
        );
        target.finish().unwrap();
        served.await.unwrap();
        shutdown.cancel();
    })
    .await
}

/// The Unix-socket listener: the socket is made with mode 0660 where asked, even when the
/// working directory is on another filesystem; each client gets the CONNECT pipeline.
#[tokio::test]
async fn the_unix_socket_serves_connect_with_mode_0660() {
    bounded(async {
        // A directory on another filesystem than the working directory where there is one
        // (tmpfs): the socket is staged beside its path, so the rename into place works.
        let cwd_dev = std::fs::metadata(".").unwrap().dev();
        let dir = match std::fs::metadata("/dev/shm") {
            Ok(shm) if shm.is_dir() && shm.dev() != cwd_dev => tempfile::tempdir_in("/dev/shm"),
            _ => tempfile::tempdir(),
        }
        .unwrap();
        let path = dir.path().join("bridgehead.sock");
        let listener = bind_unix(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660, "{mode:o}");
        // Only the socket is left in the directory: the private staging directory is gone.
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1, "{entries:?}");

        let ctx = context(Registry::new(vec![Strategy::Default], 100));
        let shutdown = CancellationToken::new();
        let connections = TaskTracker::new();
        let serving = tokio::spawn(serve_unix(
            listener,
            ctx.clone(),
            shutdown.clone(),
            connections.clone(),
        ));
        let mut client = UnixStream::connect(&path).await.unwrap();
        client.write_all(HEAD).await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        assert_eq!(dials(&ctx, "no_agent"), 1.0);
        shutdown.cancel();
        serving.await.unwrap();
        connections.close();
        connections.wait().await;
    })
    .await
}

/// With the agent's session on a thread of its own, a tunnel leaves the connection's task
/// once it is answered and is spliced on the session's thread: the frontend's connection
/// task ends while the tunnel still carries bytes both ways, and shutdown's count of open
/// tunnels still holds it until both sides finish.
#[tokio::test]
async fn a_tunnel_is_spliced_on_its_sessions_thread() {
    bounded(async {
        let shards = Shards::start("test-session", 1).unwrap();
        let home = shards.home().unwrap();
        let shutdown = CancellationToken::new();
        let (a, b) = tokio::io::duplex(256 * 1024);
        let (server, agent) = (Mux::server(), Mux::agent());
        server.set_home(home.handle().clone());
        let server_ws =
            bridgehead_mux::WebSocket::new(a, bridgehead_mux::WsRole::Server, Bytes::new());
        let agent_ws =
            bridgehead_mux::WebSocket::new(b, bridgehead_mux::WsRole::Client, Bytes::new());
        let token = shutdown.clone();
        let driver = server.clone();
        home.handle().spawn(async move {
            let on = std::thread::current().name().map(str::to_owned);
            assert_eq!(on.as_deref(), Some("test-session-0"));
            driver.run(server_ws, Keepalive::default(), token).await
        });
        let (driver, token) = (agent.clone(), shutdown.clone());
        tokio::spawn(async move { driver.run(agent_ws, Keepalive::default(), token).await });
        let registry = Registry::new(vec![Strategy::Default], 100);
        registry
            .register(Registration {
                name: "agent-1".to_owned(),
                identity: "certificate CN=agent-1".to_owned(),
                identifiers: AgentIdentifiers::default(),
                peer: SocketAddr::from(([127, 0, 0, 1], 1)),
                mux: server,
            })
            .unwrap();
        let ctx = context(registry);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bridgehead.sock");
        let listener = bind_unix(&path).unwrap();
        let connections = TaskTracker::new();
        let serving = tokio::spawn(serve_unix(
            listener,
            ctx.clone(),
            shutdown.clone(),
            connections.clone(),
        ));
        let mut client = UnixStream::connect(&path).await.unwrap();
        client.write_all(HEAD).await.unwrap();
        let target = next_dial(&agent).await.accept().unwrap();
        let mut answer = vec![0; head::ESTABLISHED.len()];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, head::ESTABLISHED);
        // The connection's task is done (this waits for it); the tunnel is not.
        connections.close();
        connections.wait().await;
        assert_eq!(ctx.tunnels.len(), 1);
        client.write_all(b"up").await.unwrap();
        client.shutdown().await.unwrap();
        assert_eq!(read_stream(&target).await, b"up");
        let send = async {
            target.write(pattern(300_000).into()).await.unwrap();
            target.finish().unwrap();
        };
        let mut down = Vec::new();
        let ((), read) = tokio::join!(send, client.read_to_end(&mut down));
        read.unwrap();
        assert_eq!(down, pattern(300_000));
        ctx.tunnels.close();
        ctx.tunnels.wait().await;
        assert_eq!(metric(&ctx, "bridgehead_server_tunnels_open"), 0.0);
        shutdown.cancel();
        serving.await.unwrap();
    })
    .await
}

/// A socket file nobody listens on is replaced; a live socket and anything that is not a
/// socket are left alone and the bind refused.
#[tokio::test]
async fn binding_the_unix_socket_replaces_only_a_stale_socket() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bridgehead.sock");
        std::fs::write(&path, b"not a socket").unwrap();
        let error = bind_unix(&path).unwrap_err();
        assert!(error.to_string().contains("is not a socket"), "{error:#}");
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
        std::fs::remove_file(&path).unwrap();

        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let error = bind_unix(&path).unwrap_err();
        assert!(error.to_string().contains("another process"), "{error:#}");
        drop(live);
        // The dropped listener left its socket file behind: stale, so replaced.
        assert!(path.exists());
        let listener = bind_unix(&path).unwrap();
        let (accepted, connected) = tokio::join!(listener.accept(), UnixStream::connect(&path));
        accepted.unwrap();
        connected.unwrap();
    })
    .await
}

/// A client configuration for the PKI in `dir` with the client certificate `name` (`.crt`,
/// `.key`).
fn client_config(dir: &std::path::Path, name: &str) -> Arc<ClientConfig> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(load_roots(&dir.join("frontend-ca.crt")).unwrap())
        .with_client_auth_cert(
            load_certs(&dir.join(format!("{name}.crt"))).unwrap(),
            load_key(&dir.join(format!("{name}.key"))).unwrap(),
        )
        .unwrap();
    Arc::new(config)
}

/// The mTLS listener with `--allowed-clients`: a client certificate named there gets the
/// CONNECT pipeline (here: no agent, 503); another one from the same CA gets 403 and its name.
#[tokio::test]
async fn allowed_clients_narrow_the_tls_frontend_to_named_certificates() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(&[]).unwrap();
        pki.write_dir(dir.path(), false).unwrap();
        let other = pki.issue_client("curl-on-a-laptop").unwrap();
        std::fs::write(dir.path().join("other.crt"), &other.cert_pem).unwrap();
        std::fs::write(dir.path().join("other.key"), &other.key_pem).unwrap();
        let tls = crate::process::tls_config::ReloadingConfig::load(
            "frontend",
            &dir.path().join("server.crt"),
            &dir.path().join("server.key"),
            Some(&dir.path().join("frontend-ca.crt")),
            &crate::process::tls_config::TlsPolicy::default(),
        )
        .unwrap();
        let ctx = context(Registry::new(vec![Strategy::Default], 100));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let connections = TaskTracker::new();
        let serving = tokio::spawn(serve_tcp(
            listener,
            tls,
            Arc::from(vec!["bridgehead-client".to_owned()]),
            ctx.clone(),
            shutdown.clone(),
            connections.clone(),
        ));
        let answer = |name: &'static str| {
            let config = client_config(dir.path(), name);
            async move {
                let tcp = TcpStream::connect(addr).await.unwrap();
                let mut tls = tokio_rustls::TlsConnector::from(config)
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await
                    .unwrap();
                tls.write_all(HEAD).await.unwrap();
                let mut answer = Vec::new();
                // The server closes without close_notify after a refusal; what came is whole.
                let _ = tls.read_to_end(&mut answer).await;
                String::from_utf8(answer).unwrap()
            }
        };
        let allowed = answer("client").await;
        assert!(allowed.starts_with("HTTP/1.1 503 "), "{allowed}");
        let refused = answer("other").await;
        assert!(refused.starts_with("HTTP/1.1 403 "), "{refused}");
        assert!(
            refused.contains("CN=curl-on-a-laptop") && refused.contains("--allowed-clients"),
            "{refused}"
        );
        assert_eq!(
            (dials(&ctx, "no_agent"), dials(&ctx, "not_permitted")),
            (1.0, 1.0)
        );
        shutdown.cancel();
        serving.await.unwrap();
        connections.close();
        connections.wait().await;
    })
    .await
}

/// `read_head`, the fuzz target's entry: a head and what follows it, a refusal and its
/// answer, bytes that end before the head does.
#[test]
fn read_head_reads_a_head_as_the_frontend_does() {
    let bytes = b"CONNECT 10.0.0.5:10250 HTTP/1.1\r\nHost: 10.0.0.5:10250\r\n\r\nearly";
    let super::ReadHead::Connect { target, start } = super::read_head(bytes) else {
        panic!("the head was not read");
    };
    assert_eq!(target.to_string(), "10.0.0.5:10250");
    assert_eq!(&bytes[start..], b"early");
    let super::ReadHead::Refused { refusal, answer } = super::read_head(b"GET / HTTP/1.1\r\n\r\n")
    else {
        panic!("a GET was not refused");
    };
    assert_eq!(refusal.status().as_u16(), 405);
    assert!(answer.starts_with(b"HTTP/1.1 405 "), "{answer:?}");
    assert!(matches!(
        super::read_head(b"CONNECT a:1 HTTP/1.1\r\n"),
        super::ReadHead::Incomplete
    ));
}

/// A server whose first round of dialing its peers is not over holds a CONNECT that finds no
/// agent until it is (its peers' agents become known a moment after it listens), then routes
/// it again; settled, the same CONNECT is answered 503 at once.
#[tokio::test]
async fn a_connect_that_finds_no_agent_waits_for_the_first_round_of_peers() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let registry = Registry::new(vec![Strategy::Default], 100);
        let mut ctx = context(registry.clone());
        let (settle, settled) = crate::routing::settled::Settled::new();
        Arc::get_mut(&mut ctx).unwrap().peers_settled = settled;
        let (server, mut client) = connection();
        let served = serve(server, &ctx);
        client.io.write_all(HEAD).await.unwrap();
        // The server read the head and routed it: found nothing, it waits.
        let mut read = client.read.clone();
        read.wait_for(|&n| n >= HEAD.len()).await.unwrap();
        let MuxPair { server, agent } = MuxPair::new(256 * 1024, &shutdown);
        register_agent(&registry, server);
        settle.send_replace(true);
        next_dial(&agent).await.accept().unwrap();
        assert_eq!(
            read_n(&mut client.io, head::ESTABLISHED.len()).await,
            head::ESTABLISHED
        );
        drop(client);
        served.await.unwrap();

        let (head, _) =
            refusal_of(&context(Registry::new(vec![Strategy::Default], 100)), HEAD).await;
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        shutdown.cancel();
    })
    .await
}

/// The wait for the first round of peers counts against the dial timeout: a CONNECT that
/// waited for it has only the rest of `--dial-timeout` for its dial, so its client hears a
/// 504 one dial timeout after its CONNECT, however long the server took to learn its peers'
/// agents (kube-apiserver sets no deadline of its own).
#[tokio::test(start_paused = true)]
async fn the_wait_for_the_first_round_of_peers_counts_against_the_dial_timeout() {
    bounded(async {
        let shutdown = CancellationToken::new();
        let dial_timeout = Duration::from_secs(10);
        let registry = Registry::new(vec![Strategy::Default], 100);
        let mut ctx = context_with_dial_timeout(registry.clone(), dial_timeout);
        let (settle, settled) = crate::routing::settled::Settled::new();
        Arc::get_mut(&mut ctx).unwrap().peers_settled = settled;
        let (server, mut client) = connection();
        let started = tokio::time::Instant::now();
        let served = serve(server, &ctx);
        client.io.write_all(HEAD).await.unwrap();
        let mut read = client.read.clone();
        read.wait_for(|&n| n >= HEAD.len()).await.unwrap();
        tokio::time::advance(dial_timeout * 6 / 10).await;
        let MuxPair { server, agent } = MuxPair::new(256 * 1024, &shutdown);
        register_agent(&registry, server);
        settle.send_replace(true);
        let silent = tokio::spawn(async move {
            next_dial(&agent).await.cancelled().await;
            agent
        });
        let mut answer = String::new();
        client.io.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 504 "), "{answer}");
        assert_eq!(started.elapsed(), dial_timeout);
        let _agent = silent.await.unwrap();
        served.await.unwrap();
        shutdown.cancel();
    })
    .await
}
