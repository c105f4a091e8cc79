//! What the server's unit tests share beyond `bridgehead_test_support`: a configuration.

use bridgehead_test_support::TEST_TIMEOUT;

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

/// A shared context over [`test_config`]: certificate authentication, no session threads,
/// no fallback.
pub(crate) fn test_context() -> std::sync::Arc<crate::context::Context> {
    let shards = bridgehead_runtime::threads::Shards::start("test", 0).expect("no threads");
    let auth = crate::agents::auth::AgentAuth::new(true, None, false);
    std::sync::Arc::new(crate::context::Context::new(
        test_config(),
        auth,
        shards,
        None,
    ))
}

/// The value of one series in `ctx`'s metrics text (0 when it is not there yet).
pub(crate) fn metric(ctx: &crate::context::Context, series: &str) -> f64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, ctx.metrics.registry()).expect("text");
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| value.parse().expect("a number"))
}
