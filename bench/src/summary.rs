//! Percentiles of measured durations.

use std::time::Duration;

/// Percentiles of a set of durations.
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub mean: Duration,
    pub max: Duration,
}

impl Summary {
    /// Summarises `samples` (sorted in place); all zero when empty.
    pub fn of(samples: &mut [Duration]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        samples.sort_unstable();
        let n = samples.len();
        let rank = |q: f64| samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        let total: Duration = samples.iter().sum();
        Summary {
            n,
            p50: rank(0.50),
            p99: rank(0.99),
            mean: total / n as u32,
            max: samples[n - 1],
        }
    }
}
