//! What a server asked kube-apiserver during a storm, from its own
//! `bridgehead_server_kube_apiserver_requests_total{verb, resource}`: read about once a second
//! while the fleet comes back (one `/metrics` a second costs the server a few milliseconds
//! with 10,000 agents), so the peak rate is the most requests within one such second.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bridgehead_e2e::Server;

const SERIES: &str = "bridgehead_server_kube_apiserver_requests_total{";
/// The shortest window a rate is taken over.
const WINDOW: Duration = Duration::from_secs(1);

/// The requests of one server process, sampled.
#[derive(Debug)]
pub struct Sampler {
    last: (Instant, u64),
    peak: u64,
    counts: BTreeMap<String, u64>,
}

/// What the samples add up to.
#[derive(Debug, Clone)]
pub struct KubeLoad {
    pub total: u64,
    /// `VERB resource` with its count.
    pub counts: BTreeMap<String, u64>,
    /// The most requests within one window of about a second.
    pub peak_per_second: u64,
}

impl Sampler {
    /// A sampler for a server process started at `started` (it had asked nothing then).
    pub fn new(started: Instant) -> Sampler {
        Sampler {
            last: (started, 0),
            peak: 0,
            counts: BTreeMap::new(),
        }
    }

    /// Reads the server's counts if a window passed since the last reading.
    pub fn sample(&mut self, server: &Server) {
        if self.last.0.elapsed() >= WINDOW {
            self.read(server);
        }
    }

    fn read(&mut self, server: &Server) {
        let Ok((200, page)) = server.get("/metrics") else {
            return;
        };
        self.counts = counts(&page);
        let total: u64 = self.counts.values().sum();
        let now = Instant::now();
        // Requests within the window; a longer one (a slow reading) is scaled to a second.
        let seconds = (now - self.last.0).as_secs_f64().max(WINDOW.as_secs_f64());
        let rate = (total.saturating_sub(self.last.1) as f64 / seconds).ceil() as u64;
        self.peak = self.peak.max(rate);
        self.last = (now, total);
    }

    /// One last reading, and the sum.
    pub fn finish(mut self, server: &Server) -> KubeLoad {
        self.read(server);
        KubeLoad {
            total: self.counts.values().sum(),
            peak_per_second: self.peak,
            counts: self.counts,
        }
    }
}

impl KubeLoad {
    /// `LIST nodes 1, WATCH nodes 1, ...`, or `none`.
    pub fn counts_text(&self) -> String {
        if self.counts.is_empty() {
            return "none".to_owned();
        }
        self.counts
            .iter()
            .map(|(what, n)| format!("{what} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The count of `verb` on `resource`.
    pub fn of(&self, verb: &str, resource: &str) -> u64 {
        self.counts
            .get(&format!("{verb} {resource}"))
            .copied()
            .unwrap_or(0)
    }
}

/// `VERB resource` → count, from a `/metrics` page.
fn counts(page: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in page.lines().filter(|line| line.starts_with(SERIES)) {
        let Some((labels, value)) = line[SERIES.len()..].split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
        };
        if let (Some(verb), Some(resource), Ok(n)) = (
            label("verb"),
            label("resource"),
            value.trim().parse::<f64>(),
        ) {
            *counts.entry(format!("{verb} {resource}")).or_insert(0) += n as u64;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_is_read_by_verb_and_resource() {
        let page = "# HELP x\nbridgehead_server_kube_apiserver_requests_total{verb=\"LIST\",resource=\"nodes\"} 2\nbridgehead_server_kube_apiserver_requests_total{verb=\"WATCH\",resource=\"pods\"} 1\nbridgehead_server_agents_connected 5\n";
        let counts = counts(page);
        assert_eq!(counts.get("LIST nodes"), Some(&2));
        assert_eq!(counts.get("WATCH pods"), Some(&1));
        assert_eq!(counts.len(), 2);
    }
}
