//! The Unix-socket frontend (`--uds-name`): tunnels, the socket's mode, a stale socket
//! replaced, a regular file left alone.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use bridgehead_e2e::client::{kube_connect, uds_connect, uds_stream};
use bridgehead_e2e::{target, Agent, AgentOptions, Pki, Server, ServerOptions};

fn uds_server(pki: &Pki, path: &Path) -> anyhow::Result<Server> {
    Server::start(
        pki,
        ServerOptions {
            uds: Some(path.to_owned()),
            ..Default::default()
        },
    )
}

/// A CONNECT through the socket at `path` to an echo target, and a round trip.
fn tunnel_through(path: &Path) {
    let echo = target::echo("127.0.0.1:0").unwrap();
    let mut conn = uds_connect(path).unwrap();
    let reply = kube_connect(conn.as_mut(), &echo.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert!(reply.extra.is_empty(), "bytes after the head");
    conn.write_all(b"over the unix socket").unwrap();
    let mut back = [0u8; 20];
    conn.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"over the unix socket");
}

#[test]
fn tunnel_through_the_unix_socket_which_is_0660_or_stricter() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let server = uds_server(&pki, &path).unwrap();
    assert_eq!(server.frontend, format!("unix:{}", path.display()));
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    let mode = meta.permissions().mode() & 0o777;
    assert_eq!(mode & !0o660, 0, "socket mode {mode:o} is wider than 0660");
    let _agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    tunnel_through(&path);
}

#[test]
fn a_stale_socket_is_replaced_at_startup() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    // What a crashed server leaves behind: a socket file nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(std::fs::symlink_metadata(&path).is_ok());
    let server = uds_server(&pki, &path).unwrap();
    let _agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    tunnel_through(&path);
}

#[test]
fn a_regular_file_at_the_socket_path_stops_the_server() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    std::fs::write(&path, "not a socket").unwrap();
    let error = uds_server(&pki, &path)
        .map(|_| ())
        .expect_err("the server started over a regular file");
    let message = format!("{error:#}");
    assert!(
        message.contains(&format!("{} exists and is not a socket", path.display())),
        "unclear failure: {message}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
}

#[test]
fn half_close_through_the_unix_socket() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let server = uds_server(&pki, &path).unwrap();
    let _agent = Agent::start(&pki, &server, AgentOptions::default()).unwrap();
    server.wait_agents(1).unwrap();
    let counter = target::counter("127.0.0.1:0").unwrap();
    let mut sock = uds_stream(&path).unwrap();
    let reply = kube_connect(&mut sock, &counter.to_string()).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    sock.write_all(&[1u8; 70_000]).unwrap();
    sock.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    sock.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "got 70000");
}

/// A second server pointed at a live server's socket refuses to start and leaves the socket
/// (and the first server's clients) alone.
#[test]
fn a_live_socket_of_another_server_is_not_replaced() {
    let pki = Pki::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bridgehead.sock");
    let first = uds_server(&pki, &path).unwrap();
    let _agent = Agent::start(&pki, &first, AgentOptions::default()).unwrap();
    first.wait_agents(1).unwrap();
    let error = uds_server(&pki, &path)
        .map(|_| ())
        .expect_err("a second server took over a live socket");
    let message = format!("{error:#}");
    assert!(
        message.contains(&format!(
            "another process is listening on {}",
            path.display()
        )),
        "unclear failure: {message}"
    );
    tunnel_through(&path);
    // Nothing of the attempt is left beside the socket.
    let entries: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(entries, [std::ffi::OsString::from("bridgehead.sock")]);
}
