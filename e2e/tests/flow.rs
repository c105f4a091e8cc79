//! Data flow through a tunnel: half-close in each direction, and a stalled tunnel that must not
//! slow another one on the same agent.

use std::io::{Read, Write};
use std::time::Instant;

use bridgehead_e2e::client::{
    kube_connect, tls_config, tls_shutdown_write, tls_stream, TlsStream, IO_TIMEOUT,
};
use bridgehead_e2e::process::start_pair;
use bridgehead_e2e::{target, Pki, Server, ServerOptions};

/// A CONNECT to `target` that got its 200, and the tunnel bytes that came in the same reads
/// as the head (a target that speaks first may be that quick).
fn open(pki: &Pki, server: &Server, target: &str) -> (TlsStream, Vec<u8>) {
    let config = tls_config(pki, Some(("client.crt", "client.key"))).unwrap();
    let mut tls = tls_stream(config, server.frontend_addr()).unwrap();
    let reply = kube_connect(&mut tls, target).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.head);
    (tls, reply.extra)
}

#[test]
fn client_half_close_still_gets_the_answer() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let counter = target::counter("127.0.0.1:0").unwrap();
    let (mut tls, early) = open(&pki, &server, &counter.to_string());
    assert!(early.is_empty(), "bytes after the head");
    let data = vec![7u8; 300_000];
    tls.write_all(&data).unwrap();
    // The client's EOF travels to the target, which answers only then.
    tls_shutdown_write(&mut tls).unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "got 300000");
}

#[test]
fn target_half_close_leaves_the_client_able_to_write() {
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let total = 1_000_000;
    let (source, received) = target::source_then_sink("127.0.0.1:0", total).unwrap();
    let (mut tls, early) = open(&pki, &server, &source.to_string());
    tls.write_all(b"before EOF; ").unwrap();
    tls.flush().unwrap();
    target::read_pattern_to_eof(&mut tls, &early, total);
    // The target's direction ended; the client's is still open.
    tls.write_all(b"after EOF").unwrap();
    tls.flush().unwrap();
    tls_shutdown_write(&mut tls).unwrap();
    let got = received.recv_timeout(IO_TIMEOUT).unwrap();
    assert_eq!(String::from_utf8_lossy(&got), "before EOF; after EOF");
}

#[test]
fn a_stalled_tunnel_does_not_slow_a_bulk_one_on_the_same_agent() {
    const STALLED: usize = 20 << 20;
    const BULK: usize = 50 << 20;
    let pki = Pki::new().unwrap();
    let (server, _agent) = start_pair(&pki, ServerOptions::default()).unwrap();
    let stalled_target = target::source("127.0.0.1:0", STALLED).unwrap();
    let bulk_target = target::source("127.0.0.1:0", BULK).unwrap();

    // Tunnel A: the target pushes 20 MB, the client reads none of it for now.
    let (mut stalled, stalled_early) = open(&pki, &server, &stalled_target.to_string());
    // Tunnel B, same agent: 50 MB, read as fast as they come.
    let started = Instant::now();
    let (mut bulk, bulk_early) = open(&pki, &server, &bulk_target.to_string());
    target::read_pattern_to_eof(&mut bulk, &bulk_early, BULK);
    let elapsed = started.elapsed();
    assert!(
        elapsed < IO_TIMEOUT,
        "the bulk tunnel took {elapsed:?} beside a stalled one"
    );
    // A lost nothing while it waited.
    target::read_pattern_to_eof(&mut stalled, &stalled_early, STALLED);
}
