//! `--peer NAME=CMD`: the bench runs a hand-built proxy beside Bridgehead. Here the peer is a
//! small threaded HTTP CONNECT proxy in Python, started through the same shell command line an
//! operator would give: the bench finds it serving, counts every process of its group, moves
//! bulk through it both ways and kills the whole group at the end.

use std::path::Path;
use std::time::Duration;

use bridgehead_bench::peer::{Peer, PeerSpec};
use bridgehead_bench::throughput::{self, Direction};
use bridgehead_e2e::target::bulk::Target;

/// A CONNECT proxy: one thread per direction of every tunnel, half-close passed on.
const PROXY: &str = r#"
import socket, sys, threading
host, port = sys.argv[1].rsplit(":", 1)
server = socket.create_server((host, int(port)))

def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass

def handle(client):
    head = b""
    while b"\r\n\r\n" not in head:
        data = client.recv(4096)
        if not data:
            client.close()
            return
        head += data
    head, rest = head.split(b"\r\n\r\n", 1)
    target = head.split(b"\r\n")[0].split(b" ")[1].decode()
    name, port = target.rsplit(":", 1)
    upstream = socket.create_connection((name.strip("[]"), int(port)))
    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    if rest:
        upstream.sendall(rest)
    threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
    pipe(client, upstream)

while True:
    client, _ = server.accept()
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=handle, args=(client,), daemon=True).start()
"#;

fn python() -> bool {
    std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test]
async fn a_peer_given_by_command_is_measured_and_its_whole_group_killed() {
    if !python() {
        bridgehead_e2e::skip::skip(
            "a_peer_given_by_command_is_measured_and_its_whole_group_killed",
            "needs python3 for the stand-in peer",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("proxy.py");
    std::fs::write(&script, PROXY).unwrap();
    // Not exec'd: the shell stays, so the group has two processes, as a peer with a client
    // and a server would.
    let spec: PeerSpec = format!("py-proxy=python3 {} {{listen}}; true", script.display())
        .parse()
        .unwrap();
    let target = Target::start().await.unwrap();
    let peer = Peer::start(&spec, target.addr).await.unwrap();
    assert_eq!(peer.route.label(), "py-proxy");
    let pids = peer.pids();
    assert_eq!(pids.len(), 2, "the shell and python: {pids:?}");

    for direction in [Direction::Upload, Direction::Download] {
        let bulk = throughput::bulk(
            &peer.route,
            target.addr,
            direction,
            1,
            64 << 20,
            Duration::from_secs(30),
            &pids,
        )
        .await
        .unwrap();
        assert_eq!(bulk.bytes, 64 << 20, "{direction:?}");
        assert!(
            bulk.cpu_per_gib().is_some_and(|cpu| cpu > 0.0),
            "{direction:?}"
        );
    }
    drop(peer);
    for pid in pids {
        assert!(!alive(pid), "peer process {pid} outlived the bench's peer");
    }
}

#[tokio::test]
async fn a_peer_that_exits_or_never_serves_is_an_error_with_its_output() {
    let target = Target::start().await.unwrap();
    let spec: PeerSpec = "broken=echo cannot start on {listen} >&2; exit 3"
        .parse()
        .unwrap();
    let error = Peer::start(&spec, target.addr).await.unwrap_err();
    let text = format!("{error:#}");
    assert!(text.contains("exited"), "{text}");
    assert!(text.contains("cannot start on 127.0.0.5:"), "{text}");
}

#[test]
fn peer_specs_need_a_name_and_a_command() {
    for bad in ["", "wstunnel", "=cmd", "name with space=cmd", "w=  "] {
        assert!(bad.parse::<PeerSpec>().is_err(), "{bad:?}");
    }
    let spec: PeerSpec = "wstunnel=wstunnel client -L http://{listen} ws://a=b"
        .parse()
        .unwrap();
    assert_eq!(spec.name, "wstunnel");
    assert_eq!(spec.command, "wstunnel client -L http://{listen} ws://a=b");
}
