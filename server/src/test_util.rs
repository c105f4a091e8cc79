//! What the server's unit tests share.

use std::time::Duration;

/// Every async test fails after this long instead of hanging the suite.
pub(crate) const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a test body under [`TEST_TIMEOUT`].
pub(crate) async fn bounded<F: std::future::Future>(body: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, body)
        .await
        .expect("test timed out")
}

/// A valid configuration (the Unix-socket frontend, nothing read from disk) with every
/// timeout at [`TEST_TIMEOUT`] and no hold on a target's first bytes; tests change what
/// they are about.
pub(crate) fn test_config() -> crate::Config {
    let cli = <crate::Cli as clap::Parser>::try_parse_from([
        "bridgehead-server",
        "--uds-name=/nonexistent/test.sock",
        "--server-port=0",
        "--cluster-cert=/nonexistent/cluster.crt",
        "--cluster-key=/nonexistent/cluster.key",
        "--cluster-ca-cert=/nonexistent/cluster-ca.crt",
        "--server-id=test",
        "--target-bytes-hold=0",
    ])
    .expect("test flags");
    let mut config = cli.validate().expect("a valid test configuration");
    config.frontend.handshake_timeout = TEST_TIMEOUT;
    config.agent_endpoint.handshake_timeout = TEST_TIMEOUT;
    config.agent_endpoint.answer_timeout = TEST_TIMEOUT;
    config.routing.dial_timeout = TEST_TIMEOUT;
    config
}
