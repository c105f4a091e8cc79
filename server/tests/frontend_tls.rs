//! The frontend's TLS stream (rustls' unbuffered API) against a tokio-rustls client: data both
//! ways in every read size, half-close in both orders, truncation, refused handshakes, and no
//! buffers held while idle.

use std::path::Path;
use std::sync::Arc;

use bridgehead_certs::Pki;
use bridgehead_runtime::tls::{load_certs, load_key, load_roots, provider};
use bridgehead_server::frontend::TlsStream;
use bridgehead_test_support::bounded;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client;

struct Rig {
    _dir: tempfile::TempDir,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    listener: TcpListener,
}

fn client_config(dir: &Path, cert: Option<(&str, &str)>) -> Arc<ClientConfig> {
    client_config_for(dir, cert, rustls::DEFAULT_VERSIONS)
}

/// [`client_config`] offering only `versions`.
fn client_config_for(
    dir: &Path,
    cert: Option<(&str, &str)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(load_roots(&dir.join("frontend-ca.crt")).unwrap());
    let config = match cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                load_certs(&dir.join(cert)).unwrap(),
                load_key(&dir.join(key)).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    Pki::generate(&[])
        .unwrap()
        .write_dir(dir.path(), false)
        .unwrap();
    let config = bridgehead_server::process::tls_config::server_config(
        &dir.path().join("server.crt"),
        &dir.path().join("server.key"),
        Some(&dir.path().join("frontend-ca.crt")),
        &bridgehead_server::process::tls_config::TlsPolicy::default(),
    )
    .unwrap();
    Rig {
        server: config,
        client: client_config(dir.path(), Some(("client.crt", "client.key"))),
        listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        _dir: dir,
    }
}

impl Rig {
    /// A handshake through loopback: the server's stream and the client's.
    async fn pair(&self) -> (TlsStream, client::TlsStream<TcpStream>) {
        self.pair_with(self.client.clone()).await
    }

    /// [`Rig::pair`] with another client configuration.
    async fn pair_with(
        &self,
        config: Arc<ClientConfig>,
    ) -> (TlsStream, client::TlsStream<TcpStream>) {
        let addr = self.listener.local_addr().unwrap();
        let connector = tokio_rustls::TlsConnector::from(config);
        let (server, client) = tokio::join!(
            async {
                let (tcp, _) = self.listener.accept().await.unwrap();
                TlsStream::accept(self.server.clone(), tcp).await.unwrap()
            },
            async {
                let tcp = TcpStream::connect(addr).await.unwrap();
                connector
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await
                    .unwrap()
            }
        );
        (server, client)
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Reads everything until EOF in reads of at most `chunk` bytes.
async fn read_all_in(mut rd: impl AsyncRead + Unpin, chunk: usize) -> std::io::Result<Vec<u8>> {
    let mut all = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        let n = rd.read(&mut buf).await?;
        if n == 0 {
            return Ok(all);
        }
        all.extend_from_slice(&buf[..n]);
    }
}

/// Sends `up` from the client and `down` from the server at the same time, each side then
/// closing, and returns what each side read (in reads of at most `chunk` bytes).
async fn exchange(
    server: TlsStream,
    client: client::TlsStream<TcpStream>,
    up: &[u8],
    down: &[u8],
    chunk: usize,
) -> (Vec<u8>, Vec<u8>) {
    let (server_rd, server_wr) = tokio::io::split(server);
    let (client_rd, client_wr) = tokio::io::split(client);
    let (got_up, got_down, (), ()) = tokio::join!(
        read_all_in(server_rd, chunk),
        read_all_in(client_rd, chunk),
        write_and_close(client_wr, up),
        write_and_close(server_wr, down),
    );
    (got_up.unwrap(), got_down.unwrap())
}

async fn write_and_close(mut wr: impl AsyncWrite + Unpin, data: &[u8]) {
    wr.write_all(data).await.unwrap();
    wr.shutdown().await.unwrap();
}

#[tokio::test]
async fn bytes_arrive_whole_in_any_read_size_both_ways() {
    bounded(async {
        let rig = rig().await;
        for (size, chunk) in [
            (0, 1),
            (1, 1),
            (5000, 1),
            (100_000, 7),
            (3 << 20, 512),
            (3 << 20, 1 << 20),
        ] {
            let (server, client) = rig.pair().await;
            let up = pattern(size, 1);
            let down = pattern(size, 2);
            let (got_up, got_down) = exchange(server, client, &up, &down, chunk).await;
            assert!(
                got_up == up,
                "client to server, {size} bytes in reads of {chunk}"
            );
            assert!(
                got_down == down,
                "server to client, {size} bytes in reads of {chunk}"
            );
        }
    })
    .await
}

#[tokio::test]
async fn vectored_writes_keep_order() {
    bounded(async {
        let rig = rig().await;
        let (mut server, client) = rig.pair().await;
        let parts = [
            pattern(10, 1),
            pattern(70_000, 2),
            Vec::new(),
            pattern(3, 3),
            pattern(20_000, 4),
        ];
        let reader = tokio::spawn(read_all_in(client, 4096));
        let mut slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        while !slices.is_empty() {
            let io: Vec<std::io::IoSlice<'_>> =
                slices.iter().map(|s| std::io::IoSlice::new(s)).collect();
            let mut n = server.write_vectored(&io).await.unwrap();
            while let Some(first) = slices.first_mut() {
                if n < first.len() {
                    *first = &first[n..];
                    break;
                }
                n -= first.len();
                slices.remove(0);
            }
        }
        server.shutdown().await.unwrap();
        assert_eq!(reader.await.unwrap().unwrap(), parts.concat());
    })
    .await
}

#[tokio::test]
async fn half_close_either_side_first() {
    bounded(async {
        let rig = rig().await;
        // The client finishes first; the server still answers after seeing EOF.
        let (mut server, mut client) = rig.pair().await;
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"request");
        server.write_all(b"answer after EOF").await.unwrap();
        server.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"answer after EOF");

        // The server finishes first; the client still sends.
        let (mut server, mut client) = rig.pair().await;
        server.write_all(b"greeting").await.unwrap();
        server.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"greeting");
        client.write_all(b"late words").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"late words");
        // Writing after shutdown is an error, not silence.
        assert!(server.write_all(b"x").await.is_err());
    })
    .await
}

#[tokio::test]
async fn tcp_eof_without_close_notify_is_an_error() {
    bounded(async {
        let rig = rig().await;
        let (mut server, client) = rig.pair().await;
        let mut tcp = client.into_inner().0;
        tcp.shutdown().await.unwrap();
        let error = server.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
    })
    .await
}

/// Records encrypted for a client that stopped reading, which its socket did not take, count
/// as tunnel data held against the budget (at most one write's worth, in a buffer no larger
/// than twice what still waits), and leave it as the client reads them or the stream goes.
#[tokio::test]
async fn records_waiting_for_a_client_count_against_the_budget() {
    bounded(async {
        let rig = rig().await;
        for drained in [true, false] {
            let (mut server, mut client) = rig.pair().await;
            let budget = bridgehead_proto::budget::Budget::new(1 << 30);
            server.count_against(budget.clone());
            let chunk = pattern(64 * 1024, 3);
            let mut written = 0;
            // Write until the socket and the stream take no more, without waiting.
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            while let std::task::Poll::Ready(n) =
                std::pin::Pin::new(&mut server).poll_write(&mut cx, &chunk)
            {
                written += n.unwrap();
            }
            let held = budget.buffered();
            assert!(held > 0, "nothing counted with {written} bytes written");
            let waiting = server.buffered();
            assert!(held as usize == waiting, "{held} counted, {waiting} held");
            // A write's records and their headers, at most.
            assert!(held <= 64 * 1024 + 8 * 22, "{held} bytes counted");
            if drained {
                let reading = tokio::spawn(async move {
                    let mut got = vec![0; written];
                    client.read_exact(&mut got).await.unwrap();
                });
                server.flush().await.unwrap();
                reading.await.unwrap();
                assert_eq!(budget.buffered(), 0, "after the client read everything");
            } else {
                drop(server);
                assert_eq!(budget.buffered(), 0, "after the stream went");
            }
        }
    })
    .await
}

#[tokio::test]
async fn idle_stream_holds_no_buffers() {
    bounded(async {
        let rig = rig().await;
        let (mut server, mut client) = rig.pair().await;
        assert_eq!(server.buffered(), 0, "after the handshake");
        for size in [64, 40_000] {
            client.write_all(&pattern(size, 5)).await.unwrap();
            client.flush().await.unwrap();
            let mut got = vec![0u8; size];
            server.read_exact(&mut got).await.unwrap();
            server.write_all(&got).await.unwrap();
            server.flush().await.unwrap();
            let mut back = vec![0u8; size];
            client.read_exact(&mut back).await.unwrap();
            assert_eq!(back, pattern(size, 5));
            // The reader goes back to waiting, as a tunnel's uplink does, and finds nothing.
            let waiting = tokio::time::timeout(
                std::time::Duration::from_millis(1),
                server.read(&mut [0u8; 512]),
            )
            .await;
            assert!(waiting.is_err(), "nothing to read");
            assert_eq!(server.buffered(), 0, "idle after a {size}-byte exchange");
        }
    })
    .await
}

#[tokio::test]
async fn refused_handshakes_fail_with_an_alert_to_the_client() {
    bounded(async {
        let rig = rig().await;
        let addr = rig.listener.local_addr().unwrap();
        let other = tempfile::tempdir().unwrap();
        Pki::generate(&[])
            .unwrap()
            .write_dir(other.path(), false)
            .unwrap();
        let mut foreign =
            (*client_config(other.path(), Some(("client.crt", "client.key")))).clone();
        // Trust the real server, present a client certificate from another CA.
        foreign
            .dangerous()
            .set_certificate_verifier(Arc::new(AcceptAnyServer(provider())));
        let no_cert = client_config(rig._dir.path(), None);
        for (what, config) in [
            ("foreign certificate", Arc::new(foreign)),
            ("no certificate", no_cert),
        ] {
            let connector = tokio_rustls::TlsConnector::from(config);
            let (server, client) = tokio::join!(
                async {
                    let (tcp, _) = rig.listener.accept().await.unwrap();
                    TlsStream::accept(rig.server.clone(), tcp).await
                },
                async {
                    let tcp = TcpStream::connect(addr).await.unwrap();
                    let mut tls = connector
                        .connect(ServerName::try_from("localhost").unwrap(), tcp)
                        .await?;
                    // TLS 1.3: the client learns of the refusal on its first read.
                    tls.read(&mut [0u8; 1]).await
                }
            );
            assert!(server.is_err(), "{what}: the server refuses");
            let error = client
                .expect_err(&format!("{what}: the client is refused"))
                .to_string();
            assert!(
                error.contains("alert"),
                "{what}: the client gets an alert, not a reset: {error}"
            );
        }
        // Not TLS at all: an error, not a hang.
        let (server, ()) = tokio::join!(
            async {
                let (tcp, _) = rig.listener.accept().await.unwrap();
                TlsStream::accept(rig.server.clone(), tcp).await
            },
            async {
                let mut tcp = TcpStream::connect(addr).await.unwrap();
                tcp.write_all(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")
                    .await
                    .unwrap();
                let _ = tcp.read(&mut [0u8; 64]).await;
            }
        );
        assert!(server.is_err());
    })
    .await
}

#[derive(Debug)]
struct AcceptAnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Post-handshake messages: a client that updates its keys mid-stream (TLS 1.3 KeyUpdate,
/// asking the server to update too) keeps talking, both ways, across several updates.
#[tokio::test]
async fn key_updates_mid_stream() {
    bounded(async {
        let rig = rig().await;
        let (mut server, mut client) = rig.pair().await;
        for round in 0..3u8 {
            client.get_mut().1.refresh_traffic_keys().unwrap();
            let message = pattern(30_000, round);
            client.write_all(&message).await.unwrap();
            client.flush().await.unwrap();
            let mut got = vec![0u8; message.len()];
            server.read_exact(&mut got).await.unwrap();
            assert!(got == message, "round {round}: client to server");
            server.write_all(&got).await.unwrap();
            server.flush().await.unwrap();
            let mut back = vec![0u8; message.len()];
            client.read_exact(&mut back).await.unwrap();
            assert!(back == message, "round {round}: server to client");
        }
    })
    .await
}

/// Bytes that are not TLS records after the handshake: an error, not a hang or a panic.
#[tokio::test]
async fn garbage_after_the_handshake_is_an_error() {
    bounded(async {
        let rig = rig().await;
        for garbage in [
            &b"\x17\x03\x03\x00\x05hello"[..],
            b"\xff\xff\xff\xff\xff",
            b"\x17\x03\x03\xff\xff",
        ] {
            let (mut server, mut client) = rig.pair().await;
            client.get_mut().0.write_all(garbage).await.unwrap();
            if garbage.ends_with(b"\xff\xff") {
                // A record header announcing more than a record may hold: refused on the header.
                client.get_mut().0.write_all(&[0u8; 64]).await.unwrap();
            }
            let error = server.read(&mut [0u8; 64]).await.unwrap_err();
            assert_eq!(
                error.kind(),
                std::io::ErrorKind::InvalidData,
                "{garbage:?}: {error}"
            );
        }
    })
    .await
}

/// A TLS 1.2 client (older HTTP clients; the server offers 1.2 and 1.3) gets through the
/// handshake and moves data both ways.
#[tokio::test]
async fn tls12_clients_work_too() {
    bounded(async {
        let rig = rig().await;
        let tls12 = client_config_for(
            rig._dir.path(),
            Some(("client.crt", "client.key")),
            &[&rustls::version::TLS12],
        );
        let (server, client) = rig.pair_with(tls12).await;
        assert_eq!(
            client.get_ref().1.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_2)
        );
        let up = pattern(100_000, 7);
        let down = pattern(50_000, 8);
        let (got_up, got_down) = exchange(server, client, &up, &down, 1000).await;
        assert!(got_up == up, "client to server");
        assert!(got_down == down, "server to client");
    })
    .await
}
