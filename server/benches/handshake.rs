//! What one frontend TLS handshake costs the server, by certificate key type: the full mTLS
//! handshake kube-apiserver makes for every tunnel (no resumption), in memory, with the
//! server's real configuration (`tls_config::server_config`). Only the server's share of the work is
//! timed (its `read_tls`/`process_new_packets`/`write_tls` calls).
//!
//! Run: `cargo bench -p bridgehead-server --bench handshake -- --warm-up-time 1 --measurement-time 5`
//!
//! The ECDSA P-256 PKI is `bridgehead-certs`'; the RSA-2048 one is made with the `openssl`
//! command line (kubeadm's certificates are RSA-2048). Four cases, server certificate ×
//! client certificate, and a fifth without rustls' session tickets.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridgehead_certs::Pki;
use bridgehead_runtime::tls::{load_certs, load_key, load_roots, provider};
use criterion::{criterion_group, criterion_main, Criterion};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};

/// One PKI on disk: `ca.crt`, `server.{crt,key}`, `client.{crt,key}`.
struct Pkis {
    _dir: tempfile::TempDir,
    ecdsa: PathBuf,
    rsa: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the openssl command line (apt-get install -y openssl)");
    assert!(status.success(), "openssl {args:?} failed");
}

/// An RSA-2048 CA and a server and a client certificate it issued, as kubeadm makes them.
fn rsa_pki(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=bench-rsa-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    );
    for (name, ext) in [
        (
            "server",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n"),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &format!("{name}.key"),
                "-out", &format!("{name}.csr"), "-subj", &format!("/CN=bench-{name}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509", "-req", "-in", &format!("{name}.csr"), "-CA", "ca.crt", "-CAkey",
                "ca.key", "-CAcreateserial", "-out", &format!("{name}.crt"), "-days", "2",
                "-extfile", &format!("{name}.ext"),
            ],
        );
    }
}

fn pkis() -> Pkis {
    let dir = tempfile::tempdir().unwrap();
    let ecdsa = dir.path().join("ecdsa");
    let rsa = dir.path().join("rsa");
    Pki::generate(&[])
        .unwrap()
        .write_dir(&ecdsa, false)
        .unwrap();
    std::fs::create_dir_all(&rsa).unwrap();
    rsa_pki(&rsa);
    Pkis {
        _dir: dir,
        ecdsa,
        rsa,
    }
}

/// The server presents `server`'s certificate and trusts `client`'s CA; the client the
/// other way round.
fn configs(server: &Path, client: &Path) -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    let server_config = bridgehead_server::process::tls_config::server_config(
        &server.join("server.crt"),
        &server.join("server.key"),
        Some(&client.join("ca.crt")),
        &bridgehead_server::process::tls_config::TlsPolicy::default(),
    )
    .unwrap();
    let mut client_config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(load_roots(&server.join("ca.crt")).unwrap())
        .with_client_auth_cert(
            load_certs(&client.join("client.crt")).unwrap(),
            load_key(&client.join("client.key")).unwrap(),
        )
        .unwrap();
    // Every handshake is a full one, as kube-apiserver's (rustls would resume otherwise).
    client_config.resumption = rustls::client::Resumption::disabled();
    (server_config, Arc::new(client_config))
}

/// One full handshake; returns the time the server spent in it.
fn handshake(server_config: &Arc<ServerConfig>, client_config: &Arc<ClientConfig>) -> Duration {
    let name = ServerName::try_from("localhost").unwrap();
    let mut client = ClientConnection::new(client_config.clone(), name).unwrap();
    let mut server_time = Duration::ZERO;
    let started = Instant::now();
    let mut server = ServerConnection::new(server_config.clone()).unwrap();
    server_time += started.elapsed();
    let mut wire = Vec::new();
    while client.is_handshaking() || server.is_handshaking() {
        wire.clear();
        while client.wants_write() {
            client.write_tls(&mut wire).unwrap();
        }
        let started = Instant::now();
        let mut input = &wire[..];
        while !input.is_empty() {
            server.read_tls(&mut input).unwrap();
            server.process_new_packets().unwrap();
        }
        wire.clear();
        while server.wants_write() {
            server.write_tls(&mut wire).unwrap();
        }
        server_time += started.elapsed();
        let mut input = &wire[..];
        while !input.is_empty() {
            client.read_tls(&mut input).unwrap();
            client.process_new_packets().unwrap();
        }
    }
    server_time
}

fn bench(c: &mut Criterion) {
    bridgehead_runtime::tls::install_crypto_provider();
    let pkis = pkis();
    let mut group = c.benchmark_group("frontend handshake, server CPU");
    for (server_name, server) in [("ECDSA P-256", &pkis.ecdsa), ("RSA-2048", &pkis.rsa)] {
        for (client_name, client) in [("ECDSA P-256", &pkis.ecdsa), ("RSA-2048", &pkis.rsa)] {
            let (server_config, client_config) = configs(server, client);
            bench_case(
                &mut group,
                format!("server {server_name}, client {client_name}"),
                &server_config,
                &client_config,
            );
        }
    }
    // What rustls' default of two TLS 1.3 session tickets per handshake costs (clients that
    // do not resume, as kube-apiserver, never use them).
    let (server_config, client_config) = configs(&pkis.ecdsa, &pkis.ecdsa);
    let mut no_tickets = (*server_config).clone();
    no_tickets.send_tls13_tickets = 0;
    bench_case(
        &mut group,
        "server ECDSA P-256, client ECDSA P-256, no session tickets".to_owned(),
        &Arc::new(no_tickets),
        &client_config,
    );
    group.finish();
}

fn bench_case(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: String,
    server_config: &Arc<ServerConfig>,
    client_config: &Arc<ClientConfig>,
) {
    group.bench_function(name, |b| {
        b.iter_custom(|iterations| {
            (0..iterations)
                .map(|_| handshake(server_config, client_config))
                .sum()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
