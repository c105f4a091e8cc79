//! The memory flags both binaries share: the budget of buffered tunnel data
//! (`--tunnel-memory-budget`) and the kernel buffers of every tunnel socket
//! (`--tunnel-receive-buffer`, `--tunnel-unsent-limit`), with byte sizes written as
//! Kubernetes quantities (`256Mi`).
//!
//! The flags are plain numbers here; [`MemoryArgs::tunnel_memory`] turns them into the policy
//! `bridgehead_mux::memory` owns, and the collectors below show it as metrics.

use std::sync::Arc;

use bridgehead_mux::memory::{
    EarnedBuffer, EarnedTotal, SocketTuning, TunnelMemory, START_BUFFER, UNIX_SEND_BUFFER,
};
use bridgehead_mux::splice::SendWait;
use bridgehead_proto::budget::Budget;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// `--tunnel-memory-budget`, `--tunnel-receive-buffer`, `--tunnel-unsent-limit` and
/// `--tunnel-max-window`.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct MemoryArgs {
    /// Most bytes of tunnel data this process holds received but not yet taken by its
    /// sockets (clients or targets that do not read), all tunnels together. As it fills, new
    /// tunnels start with smaller windows and reading tunnels stop growing theirs; once it is
    /// spent, new tunnels are refused (503 "overloaded") until some of it drains. A size:
    /// bytes, or with Ki, Mi, Gi (or k, M, G).
    #[arg(long, env = "BRIDGEHEAD_TUNNEL_MEMORY_BUDGET", default_value = "256Mi", value_parser = parse_size, value_name = "SIZE")]
    pub tunnel_memory_budget: u64,
    /// Kernel receive buffer of every tunnel TCP socket this process owns (CONNECT clients'
    /// on the server, dialed targets' on the agent): what a tunnel whose other end stopped
    /// reading holds in the kernel on the receiving side (the kernel doubles the value for its
    /// bookkeeping). A target socket dialed while the server's memory budget is under pressure
    /// starts with 8Ki instead (and asks for segments of at most 8 KiB) and earns this by
    /// reading; Unix-socket clients' send buffers
    /// likewise start at 8Ki and earn Linux's default. 0 leaves every socket to the kernel's
    /// autotuning, up to net.ipv4.tcp_rmem's maximum (megabytes per socket). A size, as for
    /// --tunnel-memory-budget.
    #[arg(long, env = "BRIDGEHEAD_TUNNEL_RECEIVE_BUFFER", default_value = "128Ki", value_parser = parse_size, value_name = "SIZE")]
    pub tunnel_receive_buffer: u64,
    /// Largest kernel receive buffer a tunnel TCP socket earns by reading (CONNECT clients'
    /// on the server, dialed targets' on the agent): a tunnel that keeps reading doubles its
    /// --tunnel-receive-buffer each time it has moved eight times the buffer it has, up to
    /// this, so a bulk transfer is not held to a small window, while one whose far end stalls
    /// early keeps the small buffer. All tunnels of the process together earn at most a
    /// quarter of --tunnel-memory-budget beyond the buffers they started with: that bounds
    /// what tunnels that earned and then stalled hold in the kernel beyond
    /// --tunnel-receive-buffer each. At or below --tunnel-receive-buffer: no earning. A size,
    /// as for --tunnel-memory-budget.
    #[arg(long, env = "BRIDGEHEAD_TUNNEL_RECEIVE_BUFFER_MAX", default_value = "4Mi", value_parser = parse_size, value_name = "SIZE")]
    pub tunnel_receive_buffer_max: u64,
    /// Most bytes a tunnel TCP socket this process owns keeps queued but not yet sent
    /// (TCP_NOTSENT_LOWAT): what a tunnel whose reader stopped holds in the kernel on the
    /// sending side, beyond what is in flight. 0: no limit (net.ipv4.tcp_wmem's maximum).
    #[arg(long, env = "BRIDGEHEAD_TUNNEL_UNSENT_LIMIT", default_value = "16Ki", value_parser = parse_size, value_name = "SIZE")]
    pub tunnel_unsent_limit: u64,
    /// Largest receive window one tunnel earns by reading (each direction's receiver grants
    /// it: the server for downloads, the agent for uploads). One tunnel moves at most about
    /// half of it per round trip of the agent link, and even on loopback the round trip
    /// through both processes is what limits one tunnel, so at 10 ms a window of 1Mi holds
    /// one tunnel to about 50 MiB/s (docs/benchmarks.md, "One tunnel over an agent link with latency"). Only tunnels that keep
    /// reading earn it (an eighth of what they read so far: 16Mi after 128 MiB), and the
    /// memory budget still bounds what all tunnels hold together; a tunnel that earned it and
    /// then stalls holds up to that much. 64Ki (the window a tunnel starts with) to 16Mi (the most credit the
    /// protocol lets a peer hold); a size.
    #[arg(long, env = "BRIDGEHEAD_TUNNEL_MAX_WINDOW", default_value = "16Mi", value_parser = parse_window, value_name = "SIZE")]
    pub tunnel_max_window: u32,
}

/// `--tunnel-max-window`: a size from the initial window to the protocol's credit limit.
fn parse_window(input: &str) -> Result<u32, String> {
    let size = parse_size(input)?;
    let (low, high) = (
        u64::from(bridgehead_proto::session::DEFAULT_INITIAL_WINDOW),
        bridgehead_proto::session::MAX_CREDIT,
    );
    if !(low..=high).contains(&size) {
        return Err(format!(
            "{input:?}: a tunnel's window is 64Ki (the window it starts with) to 16Mi"
        ));
    }
    u32::try_from(size).map_err(|_| format!("{input:?} is too large"))
}

impl MemoryArgs {
    /// The tunnel memory these flags ask for: the budget, the sockets' buffers (what all
    /// sockets together earn beyond their start is a quarter of the budget), the window.
    pub fn tunnel_memory(&self) -> TunnelMemory {
        let nonzero = |value: u64| u32::try_from(value).ok().filter(|&v| v > 0);
        let receive_buffer = nonzero(self.tunnel_receive_buffer);
        TunnelMemory {
            budget: Budget::new(self.tunnel_memory_budget),
            sockets: SocketTuning {
                receive_buffer,
                receive_buffer_max: receive_buffer.map(|start| {
                    u32::try_from(self.tunnel_receive_buffer_max)
                        .unwrap_or(u32::MAX)
                        .max(start)
                }),
                unix_send_buffer: receive_buffer.map(|_| EarnedBuffer {
                    start: START_BUFFER,
                    max: UNIX_SEND_BUFFER,
                }),
                unsent_limit: nonzero(self.tunnel_unsent_limit),
            },
            earned: Arc::new(EarnedTotal::new(self.tunnel_memory_budget / 4)),
            max_window: self.tunnel_max_window,
        }
    }
}

/// The budget's series, read at each scrape: `tunnel_buffered_bytes`,
/// `tunnel_memory_budget_bytes` and `tunnel_memory_refusals_total` (under the registry's
/// prefix). `read` gives (buffered, budget, refusals).
pub struct BudgetCollector<F>(pub F);

impl<F> std::fmt::Debug for BudgetCollector<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BudgetCollector")
    }
}

impl<F> prometheus_client::collector::Collector for BudgetCollector<F>
where
    F: Fn() -> (u64, u64, u64) + Send + Sync + 'static,
{
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let (buffered, budget, refusals) = (self.0)();
        for (name, help, value) in [
            (
                "tunnel_buffered_bytes",
                "Tunnel data received and not yet taken by its socket, all tunnels together",
                buffered,
            ),
            (
                "tunnel_memory_budget_bytes",
                "--tunnel-memory-budget: the most tunnel data this process buffers before it refuses new tunnels",
                budget,
            ),
        ] {
            let gauge = ConstGauge::new(value as i64);
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        let counter = ConstCounter::new(refusals);
        let metric = encoder.encode_descriptor(
            "tunnel_memory_refusals",
            "New tunnels refused because the tunnel memory budget was spent",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
}

/// `tunnel_earned_receive_buffer_bytes` (under the registry's prefix), read at each scrape:
/// what tunnel sockets earned beyond --tunnel-receive-buffer, all tunnels together.
#[derive(Debug)]
pub struct EarnedCollector(pub std::sync::Arc<EarnedTotal>);

impl prometheus_client::collector::Collector for EarnedCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let gauge = prometheus_client::metrics::gauge::ConstGauge::new(self.0.earned() as i64);
        let metric = encoder.encode_descriptor(
            "tunnel_earned_receive_buffer_bytes",
            "Kernel receive buffers tunnel sockets earned by reading beyond --tunnel-receive-buffer, all tunnels together (at most a quarter of --tunnel-memory-budget)",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

/// `tunnel_send_waits_total{reason}` (under the registry's prefix): how often a tunnel had
/// bytes to send and its stream took none, by what it waited for ([`SendWait`]):
/// `reason="window"`, the peer's window (a tunnel that keeps hitting it over a link with
/// latency wants a larger `--tunnel-max-window`), or `reason="queue"`, room in the session's
/// queue to the agent link (the link, not the tunnel, is what is full).
#[derive(Debug, Clone)]
pub struct SendWaits {
    family: Family<ReasonLabel, Counter>,
    window: Counter,
    queue: Counter,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

impl Default for SendWaits {
    fn default() -> SendWaits {
        let family = Family::<ReasonLabel, Counter>::default();
        let counter = |reason| family.get_or_create(&ReasonLabel { reason }).clone();
        let (window, queue) = (counter("window"), counter("queue"));
        SendWaits {
            family,
            window,
            queue,
        }
    }
}

impl SendWaits {
    /// Registers the counters in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tunnel_send_waits",
            "Times a tunnel had bytes to send and waited: for the peer's window (reason=window: over a link with latency, a larger --tunnel-max-window) or for room in its session's queue to the agent link (reason=queue)",
            self.family.clone(),
        );
    }

    /// One more wait for `why`.
    pub fn waited(&self, why: SendWait) {
        match why {
            SendWait::Window => self.window.inc(),
            SendWait::Queue => self.queue.inc(),
        };
    }
}

/// A byte size: digits with an optional Kubernetes quantity suffix, binary (`Ki`, `Mi`, `Gi`)
/// or decimal (`k`, `M`, `G`).
pub fn parse_size(input: &str) -> Result<u64, String> {
    let input = input.trim();
    let split = input
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(input.len());
    let (digits, suffix) = input.split_at(split);
    let unit: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => {
            return Err(format!(
                "{input:?}: unknown unit {other:?} (use bytes, Ki, Mi, Gi, k, M or G)"
            ))
        }
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{input:?} is not a size (digits, then Ki, Mi, Gi, k, M or G)"))?;
    number
        .checked_mul(unit)
        .ok_or_else(|| format!("{input:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bridgehead_mux::memory::SMALL_WINDOW_SEGMENT;

    #[test]
    fn sizes_are_kubernetes_quantities() {
        assert_eq!(parse_size("65536"), Ok(65_536));
        assert_eq!(parse_size("256Ki"), Ok(256 * 1024));
        assert_eq!(parse_size("256Mi"), Ok(256 << 20));
        assert_eq!(parse_size("2Gi"), Ok(2 << 30));
        assert_eq!(parse_size("64k"), Ok(64_000));
        assert_eq!(parse_size("1M"), Ok(1_000_000));
        assert_eq!(parse_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_size(" 0 "), Ok(0));
        for bad in [
            "",
            "Mi",
            "1.5Mi",
            "-1",
            "1MB",
            "1mi",
            "99999999999999999999Gi",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse_size("18446744073709551615Ki")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn a_window_is_between_the_initial_window_and_the_credit_limit() {
        assert_eq!(parse_window("64Ki"), Ok(64 * 1024));
        assert_eq!(parse_window("4Mi"), Ok(4 << 20));
        assert_eq!(parse_window("16Mi"), Ok(16 << 20));
        for bad in ["32Ki", "0", "17Mi", "1Gi", "lots"] {
            assert!(parse_window(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn the_budgets_series_carry_the_prefix() {
        let mut root = prometheus_client::registry::Registry::default();
        root.sub_registry_with_prefix("bridgehead_agent")
            .register_collector(Box::new(BudgetCollector(|| (3, 1024, 2))));
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &root).unwrap();
        for line in [
            "bridgehead_agent_tunnel_buffered_bytes 3",
            "bridgehead_agent_tunnel_memory_budget_bytes 1024",
            "bridgehead_agent_tunnel_memory_refusals_total 2",
        ] {
            assert!(page.lines().any(|l| l == line), "{line:?} not in:\n{page}");
        }
    }

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        memory: MemoryArgs,
    }

    /// The flag's default is the protocol crate's, which the sessions of tests and tools
    /// that take no flags get.
    #[test]
    fn the_window_flag_defaults_to_the_protocols_default() {
        let flags = <Flags as clap::Parser>::try_parse_from(["bridgehead"]).unwrap();
        assert_eq!(
            flags.memory.tunnel_max_window,
            bridgehead_proto::session::DEFAULT_MAX_WINDOW
        );
        assert_eq!(
            u64::from(flags.memory.tunnel_max_window),
            bridgehead_proto::session::MAX_CREDIT
        );
    }

    /// The socket flags at their defaults.
    fn defaults() -> MemoryArgs {
        MemoryArgs {
            tunnel_memory_budget: 1,
            tunnel_receive_buffer: 128 * 1024,
            tunnel_receive_buffer_max: 4 << 20,
            tunnel_unsent_limit: 16 * 1024,
            tunnel_max_window: 256 * 1024,
        }
    }

    #[test]
    fn tuning_is_set_and_zero_means_the_kernels() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let args = defaults();
        let tuning = args.tunnel_memory().sockets;
        tuning.apply_accepted(&socket).unwrap();
        let sock = socket2::SockRef::from(&socket);
        // Linux doubles the receive buffer for its bookkeeping.
        assert_eq!(sock.recv_buffer_size().unwrap(), 256 * 1024);
        assert_eq!(sock.tcp_notsent_lowat().unwrap(), 16 * 1024);
        let earning = EarnedBuffer {
            start: 128 * 1024,
            max: 4 << 20,
        };
        assert_eq!(tuning.dial_receive(false), Some(earning));
        let fixed = MemoryArgs {
            tunnel_receive_buffer_max: 0,
            ..defaults()
        };
        assert_eq!(
            fixed.tunnel_memory().sockets.dial_receive(false),
            Some(EarnedBuffer {
                start: 128 * 1024,
                max: 128 * 1024
            })
        );
        let pressed = tuning.dial_receive(true).unwrap();
        assert_eq!((pressed.start, pressed.max), (8 * 1024, 128 * 1024));
        let off = MemoryArgs {
            tunnel_receive_buffer: 0,
            tunnel_unsent_limit: 0,
            ..args
        };
        assert_eq!(off.tunnel_memory().sockets, SocketTuning::default());
        assert_eq!(off.tunnel_memory().sockets.dial_receive(true), None);
    }

    /// Only a socket that starts too small for a window scale asks for small segments (the
    /// kernel reports the asked-for segment until the socket connects).
    #[test]
    fn a_small_start_asks_for_small_segments() {
        let tuning = defaults().tunnel_memory().sockets;
        for (pressed, small) in [(true, true), (false, false)] {
            let socket =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            tuning
                .apply_dial(&socket, tuning.dial_receive(pressed))
                .unwrap();
            let asked = socket.tcp_mss().unwrap();
            assert_eq!(
                asked == SMALL_WINDOW_SEGMENT,
                small,
                "pressed {pressed}: {asked}"
            );
        }
    }
}
