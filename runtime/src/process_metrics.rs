//! The process metrics operators alert on, under Prometheus' standard names (as every Go
//! program's client library exports them): `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`. Read from `/proc/self` at each scrape.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Registers with [`prometheus_client::registry::Registry::register_collector`] (on a
/// registry without a prefix: the names are the standard ones).
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// What `/proc/self/stat` says, in the units the metrics use.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
    /// Seconds since boot.
    started_after_boot: f64,
}

/// Parses `/proc/self/stat` (fields after the command name, which may hold spaces and
/// parentheses: cut at its last `)`).
fn parse_stat(text: &str, ticks: f64, page: u64) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field N is fields[N - 3].
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        started_after_boot: field(22)? as f64 / ticks,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)?.saturating_mul(page),
    })
}

/// The boot time (`btime` of `/proc/stat`), in seconds since the epoch.
fn boot_time(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

/// The soft open-files limit (`Max open files` of `/proc/self/limits`).
fn max_fds(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn encode_gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), fmt::Error> {
    let gauge = ConstGauge::new(value);
    let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
    gauge.encode(metric)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        let page = rustix::param::page_size() as u64;
        let stat = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|text| parse_stat(&text, ticks, page));
        if let Some(stat) = stat {
            let cpu = ConstCounter::new(stat.cpu_seconds);
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                cpu.metric_type(),
            )?;
            cpu.encode(metric)?;
            encode_gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                stat.resident_bytes as f64,
            )?;
            encode_gauge(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                stat.virtual_bytes as f64,
            )?;
            if let Some(boot) = std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|text| boot_time(&text))
            {
                encode_gauge(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    boot + stat.started_after_boot,
                )?;
            }
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            encode_gauge(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors.",
                entries.count() as f64,
            )?;
        }
        if let Some(max) = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|text| max_fds(&text))
        {
            encode_gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max as f64,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_with_spaces_and_parentheses() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss ...
        let text = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 3 0 5000 123456789 300 18446744073709551615";
        let stat = parse_stat(text, 100.0, 4096).unwrap();
        assert_eq!(stat.cpu_seconds, 4.0);
        assert_eq!(stat.started_after_boot, 50.0);
        assert_eq!(stat.virtual_bytes, 123_456_789);
        assert_eq!(stat.resident_bytes, 300 * 4096);
        assert_eq!(parse_stat("garbage", 100.0, 4096), None);
    }

    #[test]
    fn boot_time_and_limits() {
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"),
            Some(1.7e9)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            65536                524288               files\n";
        assert_eq!(max_fds(limits), Some(65536));
    }

    #[test]
    fn every_series_is_encoded_with_its_standard_name() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        // This process started moments ago: boot time plus its start after boot is now.
        let start: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_start_time_seconds "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((now - start).abs() < 600.0, "start {start}, now {now}");
        for series in [
            "# TYPE process_cpu_seconds counter",
            "process_cpu_seconds_total ",
            "# TYPE process_resident_memory_bytes gauge",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(series), "{series}: {text}");
        }
    }
}
