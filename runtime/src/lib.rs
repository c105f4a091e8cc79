//! What `bridgehead-server` and `bridgehead-agent` share at run time.
//!
//! - [`accept`]: accept loops that back off on errors, rate-limited logs.
//! - [`build`]: the version and commit built, logged first and exported as a metric.
//! - [`addresses`]: the addresses a list of hosts resolves to, again every interval, and which
//!   server answered at each (agents finding servers, servers finding peers).
//! - [`certificates`]: when each certificate file in use expires, as a metric.
//! - [`compat`]: klog's flags and ANP's ignored ones, for konnectivity's command lines.
//! - [`destinations`]: the destination policy, where a tunnel may lead (the agent's dials, the
//!   server's fallback proxy).
//! - [`duration`]: durations written as ANP writes them (`10s`, `500ms`, `1m30s`).
//! - [`logging`]: tracing setup, text or JSON.
//! - [`tls`]: loading PEM certificates and keys, the one rustls crypto provider.
//! - [`shutdown`]: the shutdown tree: stop, the grace period, end.
//! - [`signal`]: SIGTERM/SIGINT into a cancellation token.
//! - [`health`]: the small HTTP server for `/healthz`, `/readyz`, `/metrics` and friends.
//! - [`host`]: the host name, for default ids.
//! - [`http_head`]: reading one HTTP/1 head (the CONNECT, the upgrade and its answer).
//! - [`legacy_counter`]: counters under konnectivity's names without `_total`.
//! - [`limits`]: raising the open-files limit, TCP keepalive.
//! - [`memory`]: `--tunnel-memory-budget`, `--tunnel-receive-buffer`, `--tunnel-unsent-limit`,
//!   `--tunnel-max-window` into `bridgehead_mux::memory::TunnelMemory`, and its metrics; byte
//!   sizes.
//! - [`process_args`]: the flags both binaries take with one meaning (log format, threads,
//!   the health and admin ports' addresses, keepalive), written once and flattened by both.
//! - [`process_metrics`]: `process_*` metrics under Prometheus' standard names.
//! - [`upgrade`]: the client's side of the WebSocket upgrade (agents to servers, servers to
//!   peers).
//! - [`threads`]: the tokio runtime, sized by `--worker-threads`.
//! - [`timeouts`]: every deadline of both binaries, named once: the constants, and the list
//!   docs/architecture.md's Deadlines table is tested against.
//!
//! Nothing here knows about tunnels beyond the numbers their flags give: what those numbers
//! mean for a tunnel is `bridgehead_mux::memory`'s.

pub mod accept;
pub mod addresses;
pub mod build;
pub mod certificates;
pub mod compat;
pub mod destinations;
pub mod duration;
pub mod health;
pub mod host;
pub mod http_head;
pub mod legacy_counter;
pub mod limits;
pub mod logging;
pub mod memory;
pub mod process_args;
pub mod process_metrics;
pub mod shutdown;
pub mod signal;
pub mod threads;
pub mod timeouts;
pub mod tls;
pub mod upgrade;

/// Exit code for a bad command line or configuration (BSD `EX_USAGE`).
pub const EX_USAGE: i32 = 64;
