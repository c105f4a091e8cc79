//! Collecting results: one JSON line per measurement as it happens, Markdown tables on stdout
//! at the end, the targets with PASS/MISS, and the points the plots need.

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{json, Value};

/// Whether a result met its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Miss,
    /// The measurement failed; the row says how.
    Error,
}

impl Outcome {
    /// `Pass` when `ok`, else `Miss`.
    pub fn of(ok: bool) -> Outcome {
        if ok {
            Outcome::Pass
        } else {
            Outcome::Miss
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Pass => "PASS",
            Outcome::Miss => "MISS",
            Outcome::Error => "ERROR",
        })
    }
}

/// One target from the issue, evaluated.
#[derive(Debug, Clone)]
pub struct Check {
    pub what: String,
    pub bridgehead: String,
    pub direct: String,
    pub ratio: String,
    pub target: String,
    pub outcome: Outcome,
}

/// A titled table of results.
#[derive(Debug, Clone)]
struct Section {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Aggregate bulk throughput at some tunnel count, for the plot.
#[derive(Debug, Clone)]
pub struct ThroughputPoint {
    pub route: &'static str,
    pub direction: &'static str,
    pub tunnels: usize,
    pub mib_per_s: f64,
}

/// Setup latency of one route at one concurrency, for the plot.
#[derive(Debug, Clone)]
pub struct SetupPoint {
    pub route: &'static str,
    pub concurrency: usize,
    pub p50: Duration,
    pub p99: Duration,
}

/// Everything a run produced.
#[derive(Debug)]
pub struct Report {
    json: BufWriter<File>,
    json_path: PathBuf,
    run: u64,
    quick: bool,
    checks: Vec<Check>,
    sections: Vec<Section>,
    pub throughput: Vec<ThroughputPoint>,
    pub setup: Vec<SetupPoint>,
}

impl Report {
    /// Truncates `json_path` and starts a run.
    pub fn create(json_path: &Path, quick: bool) -> anyhow::Result<Report> {
        if let Some(dir) = json_path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file =
            File::create(json_path).with_context(|| format!("creating {}", json_path.display()))?;
        Ok(Report {
            json: BufWriter::new(file),
            json_path: json_path.to_owned(),
            run: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            quick,
            checks: Vec::new(),
            sections: Vec::new(),
            throughput: Vec::new(),
            setup: Vec::new(),
        })
    }

    /// Appends one JSON line: `fields` (an object) plus the measurement name and run id.
    pub fn record(&mut self, measurement: &str, fields: Value) -> anyhow::Result<()> {
        let mut line = json!({ "measurement": measurement, "run": self.run, "quick": self.quick });
        if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), fields) {
            line.extend(fields);
        }
        serde_json::to_writer(&mut self.json, &line)?;
        self.json.write_all(b"\n")?;
        self.json.flush()?;
        Ok(())
    }

    /// Adds a target's evaluation (also as a JSON line).
    pub fn check(&mut self, check: Check) -> anyhow::Result<()> {
        eprintln!(
            "  -> {}: {} (direct {}, ratio {}) target {}: {}",
            check.what, check.bridgehead, check.direct, check.ratio, check.target, check.outcome
        );
        self.record(
            "check",
            json!({
                "what": check.what,
                "bridgehead": check.bridgehead,
                "direct": check.direct,
                "ratio": check.ratio,
                "target": check.target,
                "outcome": check.outcome.to_string(),
            }),
        )?;
        self.checks.push(check);
        Ok(())
    }

    /// Records that a measurement failed, as an ERROR row under its target.
    pub fn failed(&mut self, what: &str, target: &str, error: &anyhow::Error) {
        eprintln!("  !! {what} failed: {error:#}");
        let _ = self.check(Check {
            what: what.to_owned(),
            bridgehead: format!("failed: {error:#}"),
            direct: "-".to_owned(),
            ratio: "-".to_owned(),
            target: target.to_owned(),
            outcome: Outcome::Error,
        });
    }

    /// Adds a row to the table `title`, created with `header` on first use.
    pub fn row(&mut self, title: &str, header: &[&str], row: Vec<String>) {
        let index = match self.sections.iter().position(|s| s.title == title) {
            Some(index) => index,
            None => {
                self.sections.push(Section {
                    title: title.to_owned(),
                    header: header.iter().map(|h| (*h).to_owned()).collect(),
                    rows: Vec::new(),
                });
                self.sections.len() - 1
            }
        };
        self.sections[index].rows.push(row);
    }

    /// Where the JSON lines go.
    pub fn json_path(&self) -> &Path {
        &self.json_path
    }

    /// Whether any target was missed or any measurement failed.
    pub fn all_passed(&self) -> bool {
        self.checks.iter().all(|c| c.outcome == Outcome::Pass)
    }

    /// The targets table and every results table, as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        if !self.checks.is_empty() {
            out.push_str("### Targets\n\n");
            let header = [
                "measurement",
                "bridgehead",
                "direct",
                "ratio",
                "target",
                "result",
            ];
            let rows: Vec<Vec<String>> = self
                .checks
                .iter()
                .map(|c| {
                    vec![
                        c.what.clone(),
                        c.bridgehead.clone(),
                        c.direct.clone(),
                        c.ratio.clone(),
                        c.target.clone(),
                        c.outcome.to_string(),
                    ]
                })
                .collect();
            table(&mut out, &header.map(str::to_owned), &rows);
        }
        for section in &self.sections {
            out.push_str(&format!("\n### {}\n\n", section.title));
            table(&mut out, &section.header, &section.rows);
        }
        out
    }
}

fn table(out: &mut String, header: &[String], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(width) = widths.get_mut(i) {
                *width = (*width).max(cell.chars().count());
            }
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::from("|");
        for (i, width) in widths.iter().enumerate() {
            let cell = cells.get(i).map_or("", String::as_str);
            let pad = width - cell.chars().count().min(*width);
            s.push_str(&format!(" {cell}{} |", " ".repeat(pad)));
        }
        s.push('\n');
        s
    };
    out.push_str(&line(header));
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&line(&rule));
    for row in rows {
        out.push_str(&line(row));
    }
}

/// `123.4 MiB/s`.
pub fn rate(bytes_per_s: f64) -> String {
    format!("{:.1} MiB/s", bytes_per_s / (1024.0 * 1024.0))
}

/// A duration in µs (below 10 ms) or ms.
pub fn micros(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 10_000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

/// `0.42`.
pub fn ratio(value: f64) -> String {
    format!("{value:.2}")
}
