//! Bridgehead, konnectivity and any `--peer` side by side in one run: bulk at 1, 16 and 64
//! tunnels both ways with server+agent CPU per GiB, tunnel setup at concurrency 1 and 16,
//! idle memory per tunnel, round trips, and what a stalled neighbour costs a bulk download
//! (ANP#881), each on both frontends (mTLS and the Unix socket), with direct loopback as the
//! yardstick and every proxy's CPU per GiB also as a multiple of its path's [`floor`].
//! The paths take turns for every row, so load changes hit them alike; with `--rounds N`
//! they take turns N times on the bulk and round-trip rows, and each path's median counts
//! (each turn is a `side_by_side_round` JSON line, the medians `side_by_side` lines as
//! before). The round-trip row takes [`RTT_SLICES`] turns per round, each on a slice of the
//! exchanges, on tunnels that stay open for the round. Each Bridgehead path is checked against konnectivity's on the same frontend, ahead on every row; the
//! Unix-socket path (plain CONNECT in, one TLS leg, as a peer's) against every peer on the
//! rows issue 14 names: one tunnel's bulk rate and CPU per GiB both ways, setup rate, round
//! trip, idle memory.

use serde_json::json;

use crate::budget::Budget;
use crate::floor::{self, Crypto};
use crate::konnectivity::Konnectivity;
use crate::latency;
use crate::memory;
use crate::peer::Peer;
use crate::report::{micros, rate, Check, Outcome, Report};
use crate::rig::Rig;
use crate::route::Route;
use crate::setup;
use crate::stall;
use crate::throughput::{self, Direction};
use bridgehead_e2e::target::bulk::Target;

/// Tunnel counts of the bulk rows.
const TUNNELS: [usize; 3] = [1, 16, 64];
/// Turns the paths take in each round of the round-trip row, each on its share of the
/// exchanges.
const RTT_SLICES: usize = 10;

/// A path under test: its route and whose CPU counts.
struct Path<'a> {
    route: &'a Route,
    pids: Vec<u32>,
}

/// One row's figure on each path, in the order of the paths.
type Figures = Vec<Option<f64>>;

/// One check of a row over its rounds: what is compared, the medians, the rounds, which way
/// is better, and how a figure is shown.
/// One check of a row: what, the figures, their rounds (for the range of the turns' own
/// ratios), which way is better, how a figure is shown.
type Checked<'a> = (
    &'a str,
    &'a Figures,
    Option<&'a Rounds>,
    Better,
    &'a dyn Fn(f64) -> String,
);

/// One row's figures on each path over the rounds of a run (`--rounds`), one entry per round
/// (none where that round's run failed), so that a round of one path lines up with the same
/// round of another: the two ran one after the other, under the same load.
struct Rounds(Vec<Vec<Option<f64>>>);

impl Rounds {
    fn new(paths: usize) -> Rounds {
        Rounds(vec![Vec::new(); paths])
    }

    /// Adds a round's figure for the path at `index` (none when the run failed).
    fn push(&mut self, index: usize, value: Option<f64>) {
        if let Some(values) = self.0.get_mut(index) {
            values.push(value);
        }
    }

    /// Each path's median over its rounds (of an even count, the mean of the middle two);
    /// none for a path whose every round failed.
    fn medians(&self) -> Figures {
        self.0
            .iter()
            .map(|values| {
                let mut values: Vec<f64> = values.iter().flatten().copied().collect();
                values.sort_by(f64::total_cmp);
                let middle = values.len() / 2;
                match values.len() {
                    0 => None,
                    n if n % 2 == 1 => Some(values[middle]),
                    _ => Some((values[middle - 1] + values[middle]) / 2.0),
                }
            })
            .collect()
    }

    /// The lowest figure of the path at `index` over its rounds.
    fn lowest(&self, index: usize) -> Option<f64> {
        self.0
            .get(index)?
            .iter()
            .flatten()
            .copied()
            .min_by(f64::total_cmp)
    }

    /// The lowest and highest of `ours / theirs` over the rounds both paths have a figure
    /// for: how far one round's verdict could fall from the medians'.
    fn ratio_range(&self, ours: usize, theirs: usize) -> Option<(f64, f64)> {
        let (ours, theirs) = (self.0.get(ours)?, self.0.get(theirs)?);
        let ratios: Vec<f64> = ours
            .iter()
            .zip(theirs)
            .filter_map(|(a, b)| Some(a.as_ref()? / b.as_ref()?.max(1e-12)))
            .collect();
        let low = ratios.iter().copied().reduce(f64::min)?;
        let high = ratios.iter().copied().reduce(f64::max)?;
        (ratios.len() > 1).then_some((low, high))
    }
}

/// Who is checked against whom: Bridgehead's path, the other path, and the other's name.
struct Pair {
    ours: usize,
    theirs: usize,
    against: String,
    /// Only the rows issue 14 sets a target for against this peer.
    targeted_rows_only: bool,
}

/// Runs every row over direct, both Bridgehead frontends, both konnectivity frontends (when
/// built) and every peer.
pub async fn run(
    rig: &Rig,
    konnectivity: Option<&Konnectivity>,
    peers: &[Peer],
    bulk_target: &Target,
    budget: &Budget,
    crypto: Crypto,
    report: &mut Report,
) {
    eprintln!("== side by side: Bridgehead, konnectivity and peers, both frontends");
    let direct = Route::Direct;
    let Some((uds, uds_pids)) = rig.uds() else {
        eprintln!("  (no Unix-socket pair started: side by side skipped)");
        return;
    };
    let mut sheet = Sheet::default();
    sheet.add(&direct, vec![std::process::id()]);
    sheet.add(&rig.mtls, rig.pids());
    sheet.add(uds, uds_pids.to_vec());
    if let Some(konnectivity) = konnectivity {
        for (ours, pair) in [(1, &konnectivity.mtls), (2, &konnectivity.uds)] {
            sheet.against(ours, &pair.route, pair.pids(), false);
        }
    }
    for peer in peers {
        sheet.against(2, &peer.route, peer.pids(), true);
    }
    let run = Run {
        sheet: &sheet,
        bulk_target,
        budget,
        crypto,
    };
    // First, while every process is fresh: later rows leave freed memory in the allocators
    // that new tunnels would reuse unseen.
    run.idle_memory(report).await;
    for tunnels in budget.tunnel_counts(&TUNNELS) {
        for direction in [Direction::Upload, Direction::Download] {
            run.bulk(report, tunnels, direction).await;
        }
    }
    for concurrency in setup::CONCURRENCY {
        run.setup(report, concurrency).await;
    }
    run.round_trips(report).await;
    // Last: a proxy whose tunnels all block behind a stalled one stays blocked.
    run.stalled_neighbour(report).await;
}

/// The paths of a side-by-side run, and who is checked against whom.
#[derive(Default)]
struct Sheet<'a> {
    paths: Vec<Path<'a>>,
    pairs: Vec<Pair>,
}

impl<'a> Sheet<'a> {
    fn add(&mut self, route: &'a Route, pids: Vec<u32>) {
        self.paths.push(Path { route, pids });
    }

    /// Another proxy's path, checked against Bridgehead's path `ours` (on the rows issue 14
    /// sets a target for only, when `targeted_rows_only`).
    fn against(&mut self, ours: usize, route: &'a Route, pids: Vec<u32>, targeted_rows_only: bool) {
        self.pairs.push(Pair {
            ours,
            theirs: self.paths.len(),
            against: route.label().to_owned(),
            targeted_rows_only,
        });
        self.add(route, pids);
    }

    fn labels(&self) -> Vec<&'a str> {
        self.paths.iter().map(|p| p.route.label()).collect()
    }

    /// One row of the table.
    fn table(
        &self,
        report: &mut Report,
        row: &str,
        unit: &str,
        figures: &Figures,
        show: impl Fn(f64) -> String,
    ) {
        let mut header = vec!["row"];
        header.extend(self.labels());
        table(report, &header, row, unit, figures, show);
    }

    /// Bridgehead against each other path on `row` for each of `checks`.
    fn compare<const N: usize>(
        &self,
        report: &mut Report,
        targeted: bool,
        row: &str,
        checks: [Checked; N],
    ) {
        let labels = self.labels();
        for checked in checks {
            compare(report, &self.pairs, targeted, row, &labels, checked);
        }
    }
}

/// What every row of one run reads.
struct Run<'a> {
    sheet: &'a Sheet<'a>,
    bulk_target: &'a Target,
    budget: &'a Budget,
    crypto: Crypto,
}

impl Run<'_> {
    fn paths(&self) -> &[Path<'_>] {
        &self.sheet.paths
    }

    async fn idle_memory(&self, report: &mut Report) {
        let count = self.budget.idle.first().copied().unwrap_or(100);
        let row = format!("idle memory per tunnel, {count} tunnels");
        let mut costs = Figures::new();
        for path in self.paths() {
            if matches!(path.route, Route::Direct) {
                costs.push(None);
                continue;
            }
            let cost =
                memory::idle_cost(path.route, self.bulk_target.addr, count, &path.pids).await;
            let value = match cost {
                Ok(bytes) => Some(bytes as f64 / 1024.0),
                Err(error) => {
                    eprintln!("  {row}, {}: {error:#}", path.route.label());
                    None
                }
            };
            let _ = report.record(
                "side_by_side",
                json!({ "row": row, "route": path.route.label(), "kib_per_tunnel": value }),
            );
            costs.push(value);
        }
        let as_kib = |v: f64| format!("{v:.1} KiB");
        self.sheet.table(report, &row, "", &costs, as_kib);
        self.sheet.compare(
            report,
            true,
            &row,
            [("idle memory", &costs, None, Lower, &as_kib)],
        );
    }

    async fn bulk(&self, report: &mut Report, tunnels: usize, direction: Direction) {
        let row = format!("bulk, {tunnels} tunnel(s), {}", direction.label());
        let (rate_rounds, cpu_rounds, whole_rounds) =
            self.bulk_rounds(report, &row, tunnels, direction).await;
        let (rates, cpus, wholes) = (
            rate_rounds.medians(),
            cpu_rounds.medians(),
            whole_rounds.medians(),
        );
        for (((path, rate), cpu), whole) in self.paths().iter().zip(&rates).zip(&cpus).zip(&wholes)
        {
            if rate.is_some() {
                let _ = report.record(
                    "side_by_side",
                    json!({
                        "row": row, "route": path.route.label(), "rounds": self.budget.side_by_side_rounds,
                        "bytes_per_s": rate, "cpu_s_per_gib": cpu,
                        "whole_path_cpu_s_per_gib": whole,
                    }),
                );
            }
        }
        let two_places = |v: f64| format!("{v:.2}");
        self.sheet.table(report, &row, "MiB/s", &rates, rate);
        self.sheet
            .table(report, &format!("{row}, CPU s/GiB"), "", &cpus, two_places);
        // Each path's floor (for the plot), from the cheapest direct round's CPU: a floor
        // is a best case, and the direct run's CPU moves from round to round.
        let direct_cpu = cpu_rounds.lowest(0);
        let floors: Figures = self
            .paths()
            .iter()
            .map(|path| floor::floor(self.crypto, path.route, direct_cpu?))
            .collect();
        for (path, floor) in self.paths().iter().zip(&floors) {
            if let Some(floor) = floor {
                let _ = report.record(
                    "side_by_side",
                    json!({ "row": row, "route": path.route.label(), "floor_s_per_gib": floor }),
                );
            }
        }
        // Each proxy's CPU as a multiple of its path's floor.
        let times_floor: Figures = cpus
            .iter()
            .zip(&floors)
            .map(|(cpu, floor)| Some(cpu.as_ref()? / floor.as_ref()?))
            .collect();
        self.sheet.table(
            report,
            &format!("{row}, CPU × floor"),
            "",
            &times_floor,
            two_places,
        );
        // What the machine spent on the whole path, the client's and target's ends
        // included: where a proxy's own CPU leaves out what it made them pay.
        let whole_row = format!("{row}, whole path CPU s/GiB (with client and target)");
        self.sheet
            .table(report, &whole_row, "", &wholes, two_places);
        let per_gib = |v: f64| format!("{v:.2} s/GiB");
        self.sheet.compare(
            report,
            tunnels == 1,
            &row,
            [
                ("throughput", &rates, Some(&rate_rounds), Higher, &rate),
                ("CPU per GiB", &cpus, Some(&cpu_rounds), Lower, &per_gib),
            ],
        );
    }

    /// Every path's bulk transfer, the paths taking turns round by round: rate, CPU per GiB,
    /// and whole-path CPU per GiB.
    async fn bulk_rounds(
        &self,
        report: &mut Report,
        row: &str,
        tunnels: usize,
        direction: Direction,
    ) -> (Rounds, Rounds, Rounds) {
        let paths = self.paths();
        let (mut rates, mut cpus, mut wholes) = (
            Rounds::new(paths.len()),
            Rounds::new(paths.len()),
            Rounds::new(paths.len()),
        );
        for round in 0..self.budget.side_by_side_rounds {
            for (index, path) in paths.iter().enumerate() {
                let bulk = throughput::bulk(
                    path.route,
                    self.bulk_target.addr,
                    direction,
                    tunnels,
                    self.budget.bulk_bytes,
                    self.budget.bulk_time,
                    &path.pids,
                )
                .await;
                match bulk {
                    Ok(bulk) => {
                        let whole = bulk.whole_cpu_per_gib(matches!(path.route, Route::Direct));
                        rates.push(index, Some(bulk.rate()));
                        cpus.push(index, bulk.cpu_per_gib());
                        wholes.push(index, whole);
                        let _ = report.record(
                            "side_by_side_round",
                            json!({
                                "row": row, "route": path.route.label(), "round": round,
                                "bytes_per_s": bulk.rate(), "cpu_s_per_gib": bulk.cpu_per_gib(),
                                "whole_path_cpu_s_per_gib": whole,
                            }),
                        );
                    }
                    Err(error) => {
                        eprintln!("  {row}, {}: {error:#}", path.route.label());
                        for figures in [&mut rates, &mut cpus, &mut wholes] {
                            figures.push(index, None);
                        }
                    }
                }
            }
        }
        (rates, cpus, wholes)
    }

    async fn setup(&self, report: &mut Report, concurrency: usize) {
        let row = format!("setup, concurrency {concurrency}");
        let mut rates = Figures::new();
        for path in self.paths() {
            let budget = self.budget;
            let run = setup::setup(
                path.route,
                self.bulk_target.addr,
                concurrency,
                budget.setup_count,
                budget.setup_time,
            )
            .await;
            let value = (run.opened > 0).then(|| run.rate());
            let _ = report.record(
                "side_by_side",
                json!({ "row": row, "route": path.route.label(), "tunnels_per_s": value, "errors": run.errors }),
            );
            rates.push(value);
        }
        let per_second = |v: f64| format!("{v:.0}/s");
        self.sheet
            .table(report, &row, "tunnels/s", &rates, |v| format!("{v:.0}"));
        self.sheet.compare(
            report,
            true,
            &row,
            [("setup rate", &rates, None, Higher, &per_second)],
        );
    }

    async fn round_trips(&self, report: &mut Report) {
        let row = "round trip p50".to_owned();
        let (p50_rounds, cpu_rounds) = self.round_trip_rounds(report, &row).await;
        let (p50s, cpus) = (p50_rounds.medians(), cpu_rounds.medians());
        for ((path, p50), cpu) in self.paths().iter().zip(&p50s).zip(&cpus) {
            let _ = report.record(
                "side_by_side",
                json!({
                    "row": row, "route": path.route.label(), "rounds": self.budget.side_by_side_rounds,
                    "p50_s": p50, "cpu_s_per_round_trip": cpu,
                }),
            );
        }
        let as_micros = |v: f64| micros(std::time::Duration::from_secs_f64(v));
        let cpu_micros = |v: f64| format!("{:.1} µs", v * 1e6);
        self.sheet.table(report, &row, "", &p50s, as_micros);
        // What each round trip cost the proxy's processes (direct: the bench's own client and
        // echo target), beside the wait-dominated latency.
        self.sheet.table(
            report,
            "round trip, CPU per round trip",
            "",
            &cpus,
            cpu_micros,
        );
        self.sheet.compare(
            report,
            true,
            &row,
            [
                (
                    "CPU per round trip",
                    &cpus,
                    Some(&cpu_rounds),
                    Lower,
                    &cpu_micros,
                ),
                ("round trip", &p50s, Some(&p50_rounds), Lower, &as_micros),
            ],
        );
    }

    /// Each path's figures are the median of its slices' (a slice: its share of the
    /// exchanges on a tunnel opened for the round), and the paths take turns slice by slice,
    /// so that what the machine does meanwhile falls on all of them alike.
    async fn round_trip_rounds(&self, report: &mut Report, row: &str) -> (Rounds, Rounds) {
        let paths = self.paths();
        let (mut p50s, mut cpus) = (Rounds::new(paths.len()), Rounds::new(paths.len()));
        let budget = self.budget;
        let (slice_count, slice_time) = (
            budget.rtt_count.div_ceil(RTT_SLICES),
            budget.rtt_time / RTT_SLICES as u32,
        );
        for round in 0..budget.side_by_side_rounds {
            let mut conns = Vec::with_capacity(paths.len());
            for path in paths {
                let conn =
                    latency::echo_tunnel(path.route, self.bulk_target.addr, budget.rtt_time).await;
                if let Err(error) = &conn {
                    eprintln!("  {row}, {}: {error:#}", path.route.label());
                }
                conns.push(conn.ok());
            }
            for slice in 0..RTT_SLICES {
                for (index, (path, conn)) in paths.iter().zip(&mut conns).enumerate() {
                    let trips = match conn {
                        Some(conn) => {
                            latency::timed_round_trips(conn, slice_count, slice_time, &path.pids)
                                .await
                        }
                        None => Err(anyhow::anyhow!("no tunnel")),
                    };
                    let (value, cpu) = match trips {
                        Ok(trips) => (
                            Some(trips.summary.p50.as_secs_f64()),
                            trips.cpu_per_exchange,
                        ),
                        Err(_) => {
                            // A tunnel that failed once is not timed again this round.
                            *conn = None;
                            (None, None)
                        }
                    };
                    let _ = report.record(
                        "side_by_side_round",
                        json!({
                            "row": row, "route": path.route.label(), "round": round,
                            "slice": slice, "p50_s": value, "cpu_s_per_round_trip": cpu,
                        }),
                    );
                    p50s.push(index, value);
                    cpus.push(index, cpu);
                }
            }
        }
        (p50s, cpus)
    }

    async fn stalled_neighbour(&self, report: &mut Report) {
        let row = "stalled neighbour: cost to a bulk download (1 tunnel)".to_owned();
        let mut costs = Figures::new();
        for path in self.paths() {
            if matches!(path.route, Route::Direct) {
                costs.push(None);
                continue;
            }
            let value = match stall::cost(path.route, self.bulk_target, self.budget).await {
                Ok((cost, buffered)) => {
                    let _ = report.record(
                        "side_by_side",
                        json!({ "row": row, "route": path.route.label(), "cost": cost, "neighbour_buffered": buffered }),
                    );
                    Some(cost.max(0.0))
                }
                Err(error) => {
                    eprintln!("  {row}, {}: {error:#}", path.route.label());
                    None
                }
            };
            costs.push(value);
        }
        let as_share = |v: f64| format!("{:.0} %", v * 100.0);
        self.sheet.table(report, &row, "", &costs, as_share);
        self.sheet.compare(
            report,
            false,
            &row,
            [("stalled neighbour", &costs, None, Lower, &as_share)],
        );
    }
}

/// Which way is better.
#[derive(Clone, Copy)]
enum Better {
    Higher,
    Lower,
}
use Better::{Higher, Lower};

/// One row of the side-by-side table.
fn table(
    report: &mut Report,
    header: &[&str],
    row: &str,
    unit: &str,
    figures: &Figures,
    show: impl Fn(f64) -> String,
) {
    let name = if unit.is_empty() {
        row.to_owned()
    } else {
        format!("{row} ({unit})")
    };
    let mut cells = vec![name];
    // Direct (the first path) has no proxy to measure in some rows.
    cells.extend(figures.iter().enumerate().map(|(i, v)| match v {
        Some(v) => show(*v),
        None if i == 0 => "-".to_owned(),
        None => "error".to_owned(),
    }));
    report.row(
        "Side by side with konnectivity and peers (same run, paths alternated)",
        header,
        cells,
    );
}

/// Bridgehead against each other path of `pairs` (konnectivity on the same frontend, every
/// peer from the Unix socket); the peers only on `targeted` rows.
fn compare(
    report: &mut Report,
    pairs: &[Pair],
    targeted: bool,
    row: &str,
    labels: &[&str],
    (what, figures, rounds, better, show): Checked,
) {
    for pair in pairs {
        if pair.targeted_rows_only && !targeted {
            continue;
        }
        let (Some(a), Some(b)) = (figures[pair.ours], figures[pair.theirs]) else {
            continue;
        };
        let ahead = match better {
            Higher => a >= b,
            Lower => a <= b,
        };
        let against = &pair.against;
        let _ = report.check(Check {
            what: format!("{what} vs {against}, {row}, {}", labels[pair.ours]),
            bridgehead: show(a),
            direct: format!("{} ({against})", show(b)),
            // With several turns, the range of the turns' own ratios beside the medians'.
            ratio: match rounds.and_then(|r| r.ratio_range(pair.ours, pair.theirs)) {
                Some((low, high)) => {
                    format!("{:.2} (turns {low:.2}-{high:.2})", a / b.max(1e-12))
                }
                None => format!("{:.2}", a / b.max(1e-12)),
            },
            target: match better {
                Higher => format!("≥ {against}"),
                Lower => format!("≤ {against}"),
            },
            outcome: Outcome::of(ahead),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_rounds() {
        let mut rounds = Rounds::new(3);
        for (index, value) in [(0, 3.0), (0, 1.0), (0, 2.0), (1, 4.0), (1, 2.0)] {
            rounds.push(index, Some(value));
        }
        rounds.push(2, None);
        rounds.push(7, Some(1.0));
        assert_eq!(rounds.medians(), vec![Some(2.0), Some(3.0), None]);
    }

    #[test]
    fn ratio_ranges_pair_the_same_rounds() {
        let mut rounds = Rounds::new(2);
        // Round 1 of path 1 failed: only rounds 0 and 2 pair.
        for (ours, theirs) in [
            (Some(2.0), Some(4.0)),
            (Some(9.0), None),
            (Some(3.0), Some(2.0)),
        ] {
            rounds.push(0, ours);
            rounds.push(1, theirs);
        }
        assert_eq!(rounds.ratio_range(0, 1), Some((0.5, 1.5)));
        assert_eq!(rounds.medians(), vec![Some(3.0), Some(3.0)]);
        // One pair is no range; an unknown path none either.
        let mut single = Rounds::new(2);
        single.push(0, Some(1.0));
        single.push(1, Some(2.0));
        assert_eq!(single.ratio_range(0, 1), None);
        assert_eq!(rounds.ratio_range(0, 5), None);
    }

    #[test]
    fn lowest_skips_failed_rounds() {
        let mut rounds = Rounds::new(2);
        for (direct, other) in [(Some(0.6), None), (None, None), (Some(0.3), None)] {
            rounds.push(0, direct);
            rounds.push(1, other);
        }
        assert_eq!(rounds.lowest(0), Some(0.3));
        assert_eq!(rounds.lowest(1), None);
        assert_eq!(rounds.lowest(7), None);
    }
}
