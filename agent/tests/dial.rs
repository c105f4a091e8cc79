//! Dialing targets and mapping failures to error codes. Only loopback is ever dialed.

use std::future::pending;
use std::io;
use std::time::Duration;

use bridgehead_agent::dial::{code_of, dial, dial_with, DialError};
use bridgehead_mux::memory::SocketTuning;
use bridgehead_proto::ErrorCode;
use bridgehead_runtime::destinations::{Policy, RuleFlags};
use bridgehead_test_support::bounded;
use tokio::net::{TcpListener, TcpStream};

/// [`dial`] within 5 s, with the default policy and the kernel's socket buffers.
async fn dial_loopback(host: &str, port: u16) -> Result<TcpStream, DialError> {
    dial(
        host,
        port,
        Duration::from_secs(5),
        &Policy::default(),
        &SocketTuning::default(),
        None,
    )
    .await
}

#[tokio::test]
async fn connects_to_a_listener() {
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let socket = dial_loopback("127.0.0.1", port).await.unwrap();
        assert!(socket.nodelay().unwrap());
        // Names resolve on the agent; if "localhost" also resolves to ::1, where nothing listens,
        // the next address is tried.
        dial_loopback("localhost", port).await.unwrap();
    })
    .await
}

#[tokio::test]
async fn closed_port_is_refused() {
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let error = dial_loopback("127.0.0.1", port).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::Refused, "{error}");
        assert!(error.to_string().contains("127.0.0.1"), "{error}");
    })
    .await
}

#[tokio::test]
async fn ipv6_literal_without_brackets() {
    bounded(async {
        let Ok(listener) = TcpListener::bind("[::1]:0").await else {
            eprintln!("no IPv6 loopback here; skipping");
            return;
        };
        let port = listener.local_addr().unwrap().port();
        dial_loopback("::1", port).await.unwrap();
    })
    .await
}

#[tokio::test]
async fn unknown_name_is_not_resolved() {
    bounded(async {
        // A 64-octet label is not a valid DNS name: the resolver refuses it without sending a
        // query, so this test sends no packet off the machine.
        let name = format!("{}.invalid", "a".repeat(64));
        let error = dial(
            &name,
            80,
            Duration::from_secs(10),
            &Policy::default(),
            &SocketTuning::default(),
            None,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(error, DialError::Resolve { .. } | DialError::NoAddress(_)),
            "{error:?}"
        );
        assert_eq!(error.code(), ErrorCode::NameNotResolved);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn deadline_passes() {
    bounded(async {
        let started = tokio::time::Instant::now();
        let error = dial_with(
            "127.0.0.1",
            9,
            Duration::from_secs(3),
            &Policy::default(),
            |_| pending::<io::Result<TcpStream>>(),
        )
        .await
        .unwrap_err();
        assert!(matches!(error, DialError::TimedOut(_)), "{error:?}");
        assert_eq!(error.code(), ErrorCode::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    })
    .await
}

#[tokio::test]
async fn tries_each_address_and_reports_the_last_error() {
    bounded(async {
        // localhost may resolve to ::1 and 127.0.0.1: every one is tried.
        let mut tried = Vec::new();
        let error = dial_with(
            "localhost",
            1,
            Duration::from_secs(5),
            &Policy::default(),
            |addr| {
                tried.push(addr);
                std::future::ready(Err::<TcpStream, _>(io::Error::from(
                    io::ErrorKind::HostUnreachable,
                )))
            },
        )
        .await
        .unwrap_err();
        assert!(!tried.is_empty());
        assert_eq!(error.code(), ErrorCode::Unreachable);
    })
    .await
}

#[test]
fn io_error_kinds_map_to_codes() {
    let cases = [
        (io::ErrorKind::ConnectionRefused, ErrorCode::Refused),
        (io::ErrorKind::HostUnreachable, ErrorCode::Unreachable),
        (io::ErrorKind::NetworkUnreachable, ErrorCode::Unreachable),
        (io::ErrorKind::TimedOut, ErrorCode::TimedOut),
        (io::ErrorKind::PermissionDenied, ErrorCode::NotPermitted),
        (io::ErrorKind::ConnectionReset, ErrorCode::Other),
        (io::ErrorKind::Other, ErrorCode::Other),
    ];
    for (kind, code) in cases {
        assert_eq!(code_of(&io::Error::from(kind)), code, "{kind:?}");
    }
    // From errno, as connect(2) reports them.
    assert_eq!(
        code_of(&io::Error::from_raw_os_error(113)), // EHOSTUNREACH
        ErrorCode::Unreachable
    );
    assert_eq!(
        code_of(&io::Error::from_raw_os_error(101)), // ENETUNREACH
        ErrorCode::Unreachable
    );
}

#[tokio::test]
async fn the_policy_applies_to_resolved_addresses() {
    bounded(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let deny = Policy::new(
            RuleFlags::AGENT,
            vec![],
            bridgehead_runtime::destinations::parse_rules("127.0.0.0/8,::1/128").unwrap(),
            vec![],
            vec![],
        );
        // A name that resolves to a denied address is as denied as the address.
        for host in ["127.0.0.1", "localhost"] {
            let error = dial(
                host,
                port,
                Duration::from_secs(5),
                &deny,
                &SocketTuning::default(),
                None,
            )
            .await
            .unwrap_err();
            assert!(matches!(error, DialError::Denied(_)), "{host}: {error}");
            assert_eq!(error.code(), ErrorCode::NotPermitted);
        }
        // The agent's own port on this host is denied by default.
        let own = Policy::new(RuleFlags::AGENT, vec![], vec![], vec![port], vec![]);
        let error = dial(
            "127.0.0.1",
            port,
            Duration::from_secs(5),
            &own,
            &SocketTuning::default(),
            None,
        )
        .await
        .unwrap_err();
        assert!(error.to_string().contains("own port"), "{error}");
    })
    .await
}
