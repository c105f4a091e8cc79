//! Sizes and time bounds of every measurement: the full run and the CI smoke run.

use std::time::Duration;

/// Sizes and time bounds of every measurement.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Bytes of one bulk run (split between its tunnels).
    pub bulk_bytes: u64,
    /// Time bound of one bulk run.
    pub bulk_time: Duration,
    pub setup_count: usize,
    pub setup_time: Duration,
    pub rtt_count: usize,
    pub rtt_time: Duration,
    /// Idle tunnel counts, ascending.
    pub idle: Vec<usize>,
    pub stall_rounds: usize,
    /// Stalled readers of the stalled-readers measurement.
    pub stalled_readers: usize,
    /// Tunnels and seconds of the soak.
    pub soak_tunnels: usize,
    pub soak_seconds: u64,
    /// Seconds of the CONNECT burst.
    pub burst_seconds: u64,
    /// Turns the paths take on each side-by-side bulk and round-trip row (`--rounds`).
    pub side_by_side_rounds: usize,
    /// Tunnel counts of the bulk rows, instead of each measurement's own (`--tunnels`).
    pub bulk_tunnels: Option<Vec<usize>>,
    /// The fleet's size and bounds (`--agents` sets its size).
    pub fleet: crate::fleet::Plan,
}

impl Budget {
    /// The bulk rows' tunnel counts: `--tunnels`, or else `default`.
    pub fn tunnel_counts(&self, default: &[usize]) -> Vec<usize> {
        self.bulk_tunnels
            .clone()
            .unwrap_or_else(|| default.to_vec())
    }

    /// The full run.
    pub fn full() -> Budget {
        Budget {
            bulk_bytes: 1 << 30,
            bulk_time: Duration::from_secs(5),
            setup_count: 10_000,
            setup_time: Duration::from_secs(5),
            rtt_count: 20_000,
            rtt_time: Duration::from_secs(3),
            idle: vec![1_000, 10_000],
            stall_rounds: 3,
            stalled_readers: 5_000,
            soak_tunnels: 10_000,
            soak_seconds: 600,
            burst_seconds: 60,
            side_by_side_rounds: 1,
            bulk_tunnels: None,
            fleet: crate::fleet::Plan {
                agents: 10_000,
                auth: crate::fleet::Auth::Cert,
                tokens: None,
                // Three keepalive intervals of the server and of the agents.
                idle_window: Duration::from_secs(15),
                probes: 2_000,
                recovery_bound: Duration::from_secs(300),
                trickle_interval: Duration::from_millis(50),
                stalled: 0,
                servers: 1,
                round_robin: false,
                sessions_per_agent: None,
                peering: false,
                lateness: None,
                shared_cores: false,
            },
        }
    }

    /// The CI smoke run.
    pub fn quick() -> Budget {
        Budget {
            bulk_bytes: 64 << 20,
            bulk_time: Duration::from_millis(700),
            setup_count: 300,
            setup_time: Duration::from_millis(700),
            rtt_count: 2_000,
            rtt_time: Duration::from_millis(500),
            idle: vec![100, 500],
            stall_rounds: 1,
            stalled_readers: 300,
            soak_tunnels: 300,
            soak_seconds: 20,
            burst_seconds: 3,
            side_by_side_rounds: 1,
            bulk_tunnels: None,
            fleet: crate::fleet::Plan {
                agents: 300,
                auth: crate::fleet::Auth::Cert,
                tokens: None,
                // One keepalive interval.
                idle_window: Duration::from_secs(5),
                probes: 200,
                recovery_bound: Duration::from_secs(60),
                trickle_interval: Duration::from_millis(50),
                stalled: 0,
                servers: 1,
                round_robin: false,
                sessions_per_agent: None,
                peering: false,
                lateness: None,
                shared_cores: false,
            },
        }
    }
}
