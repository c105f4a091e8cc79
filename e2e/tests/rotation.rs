//! Certificates rotated on disk while tunnels run, as Kubernetes rotates them: the files live
//! in a directory laid out as kubelet lays out a Secret volume (each file a symlink through
//! `..data` to a versioned directory, `..data` swapped atomically). The server takes new
//! files for new connections within seconds, keeps open tunnels and the agent's session, keeps
//! its last good files when the new ones do not load, and a client loop tunnelling throughout
//! sees no failure.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bridgehead_e2e::client::{echo_round_trip, kube_connect, tls, tls_connect_with, tls_stream};
use bridgehead_e2e::process::wait_until;
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions};
use rustls::pki_types::CertificateDer;

/// How long a change may take to reach new connections (files are looked at every second).
const RELOAD: Duration = Duration::from_secs(15);

/// A Secret-like volume.
struct Volume {
    dir: tempfile::TempDir,
    version: usize,
}

impl Volume {
    fn new() -> Volume {
        Volume {
            dir: tempfile::tempdir().unwrap(),
            version: 0,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `files` into a new version and swaps `..data` to it in one rename.
    fn publish(&mut self, files: &[(&str, String)]) {
        self.version += 1;
        let version = format!("..v{}", self.version);
        let dir = self.dir.path();
        std::fs::create_dir(dir.join(&version)).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(&version).join(name), text).unwrap();
        }
        let tmp = dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
        for (name, _) in files {
            let link = dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
            }
        }
    }
}

/// Every file of `pki`, the CA files holding `extra_cas` too (a rotation's bundle).
fn files(
    pki: &bridgehead_certs::Pki,
    extra_cas: Option<&bridgehead_certs::Pki>,
) -> Vec<(&'static str, String)> {
    let bundle = |own: &str, extra: Option<String>| match extra {
        Some(extra) => format!("{own}{extra}"),
        None => own.to_owned(),
    };
    vec![
        (
            "frontend-ca.crt",
            bundle(
                &pki.frontend_ca.cert_pem,
                extra_cas.map(|p| p.frontend_ca.cert_pem.clone()),
            ),
        ),
        (
            "cluster-ca.crt",
            bundle(
                &pki.cluster_ca.cert_pem,
                extra_cas.map(|p| p.cluster_ca.cert_pem.clone()),
            ),
        ),
        ("server.crt", pki.server.cert_pem.clone()),
        ("server.key", pki.server.key_pem.clone()),
        ("cluster.crt", pki.cluster.cert_pem.clone()),
        ("cluster.key", pki.cluster.key_pem.clone()),
        ("client.crt", pki.client.cert_pem.clone()),
        ("client.key", pki.client.key_pem.clone()),
        ("agent.crt", pki.agent.cert_pem.clone()),
        ("agent.key", pki.agent.key_pem.clone()),
    ]
}

/// The DER of a one-certificate PEM.
fn der(pem: &str) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

/// A client as kube-apiserver would be after its own files rotated: the volume's current
/// CA and client pair.
fn client_config(volume: &Volume) -> Arc<rustls::ClientConfig> {
    tls::config(
        &volume.path("frontend-ca.crt"),
        Some((&volume.path("client.crt"), &volume.path("client.key"))),
    )
    .unwrap()
}

/// The certificate the frontend presents to a new connection.
fn presented(volume: &Volume, frontend: std::net::SocketAddr) -> Option<CertificateDer<'static>> {
    let stream = tls_stream(client_config(volume), frontend).ok()?;
    stream
        .conn
        .peer_certificates()?
        .first()
        .map(|c| c.clone().into_owned())
}

#[test]
fn certificates_rotate_under_load_without_losing_a_tunnel() {
    let mut volume = Volume::new();
    let mut pki = bridgehead_certs::Pki::generate(&[]).unwrap();
    volume.publish(&files(&pki, None));
    let path = |name: &str| volume.path(name).display().to_string();
    let server = Server::start(
        &Pki::new().unwrap(),
        ServerOptions {
            args: [
                ("--server-cert", "server.crt"),
                ("--server-key", "server.key"),
                ("--server-ca-cert", "frontend-ca.crt"),
                ("--cluster-cert", "cluster.crt"),
                ("--cluster-key", "cluster.key"),
                ("--cluster-ca-cert", "cluster-ca.crt"),
            ]
            .iter()
            .flat_map(|(flag, file)| [flag.to_string(), path(file)])
            .collect(),
            ..Default::default()
        },
    )
    .unwrap();
    let agent = Agent::start(
        &Pki::new().unwrap(),
        &server,
        AgentOptions {
            args: [
                ("--ca-cert", "cluster-ca.crt"),
                ("--agent-cert", "agent.crt"),
                ("--agent-key", "agent.key"),
            ]
            .iter()
            .flat_map(|(flag, file)| [flag.to_string(), path(file)])
            .collect(),
            ..Default::default()
        },
    )
    .unwrap();
    server.wait_agents(1).unwrap();
    let frontend = server.frontend_addr();
    let echo = target::echo("127.0.0.1:0").unwrap();

    // A tunnel open from before the first rotation to after the last.
    let mut long = tls_connect_with(client_config(&volume), frontend).unwrap();
    assert_eq!(
        kube_connect(long.as_mut(), &echo.to_string())
            .unwrap()
            .status,
        200
    );
    echo_round_trip(long.as_mut(), b"before");

    // A client loop, each tunnel with the files current at its start.
    let volume = Arc::new(Mutex::new(volume));
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let tunnels = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let client = {
        let (volume, stop, failures, tunnels) = (
            volume.clone(),
            stop.clone(),
            failures.clone(),
            tunnels.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let config = client_config(&volume.lock().unwrap());
                let result = tls_connect_with(config, frontend).and_then(|mut conn| {
                    let reply = kube_connect(conn.as_mut(), &echo.to_string())?;
                    anyhow::ensure!(reply.status == 200, "{}", reply.head);
                    echo_round_trip(conn.as_mut(), b"loop");
                    Ok(())
                });
                match result {
                    Ok(()) => {
                        tunnels.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => failures.lock().unwrap().push(format!("{error:#}")),
                }
            }
        })
    };
    let served = |n: usize| {
        let start = tunnels.load(Ordering::Relaxed);
        wait_until(RELOAD, || tunnels.load(Ordering::Relaxed) >= start + n).unwrap();
    };
    served(5);

    // 1. New leaves from the same CAs: new connections get the new server certificate.
    pki.renew_leaves(&[]).unwrap();
    volume.lock().unwrap().publish(&files(&pki, None));
    let wanted = der(&pki.server.cert_pem);
    wait_until(RELOAD, || {
        presented(&volume.lock().unwrap(), frontend) == Some(wanted.clone())
    })
    .unwrap_or_else(|_| {
        panic!(
            "the frontend still presents the old certificate\n{}",
            server.process.stderr()
        )
    });
    server
        .process
        .wait_log("certificates reloaded", RELOAD)
        .unwrap();
    served(5);

    // 2. A broken server certificate: logged, the last good one kept.
    let mut broken = files(&pki, None);
    broken[2].1 = "-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n".to_owned();
    volume.lock().unwrap().publish(&broken);
    server
        .process
        .wait_log(
            "changed certificate files do not load; keeping the previous ones",
            RELOAD,
        )
        .unwrap();
    assert_eq!(
        presented(&volume.lock().unwrap(), frontend),
        Some(wanted.clone())
    );
    served(5);

    // 3. New CAs: first the bundles (old and new CA), then the leaves of the new CAs.
    let next = bridgehead_certs::Pki::generate(&[]).unwrap();
    let reloads = server
        .process
        .stderr()
        .matches("certificates reloaded")
        .count();
    volume.lock().unwrap().publish(&files(&pki, Some(&next)));
    wait_until(RELOAD, || {
        server
            .process
            .stderr()
            .matches("certificates reloaded")
            .count()
            >= reloads + 2
    })
    .unwrap_or_else(|_| panic!("{}", server.process.stderr()));
    served(5);
    let mut bundled = files(&next, Some(&pki));
    // The bundles stay as they were (old CA first) until every client has the new leaves.
    bundled[0].1 = files(&pki, Some(&next))[0].1.clone();
    bundled[1].1 = files(&pki, Some(&next))[1].1.clone();
    volume.lock().unwrap().publish(&bundled);
    let wanted = der(&next.server.cert_pem);
    wait_until(RELOAD, || {
        presented(&volume.lock().unwrap(), frontend) == Some(wanted.clone())
    })
    .unwrap();
    served(5);

    stop.store(true, Ordering::Relaxed);
    client.join().unwrap();
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} tunnels failed: {failures:?}",
        failures.len()
    );
    // The old tunnel and the agent's session lived through it all.
    echo_round_trip(long.as_mut(), b"after every rotation");
    assert_eq!(server.agents().unwrap().len(), 1);
    assert!(
        !agent.process.stderr().contains("session with server ended"),
        "{}",
        agent.process.stderr()
    );
}
