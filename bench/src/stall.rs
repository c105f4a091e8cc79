//! Head-of-line isolation: a bulk download's throughput alone, and with a neighbour on the
//! same agent whose client stopped reading once its window filled (ANP#881's scenario).

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use crate::report::{rate, Check, Outcome, Report};
use crate::rig::Rig;
use crate::route::Route;
use crate::throughput::{bulk, Bulk, Direction};
use crate::Budget;
use bridgehead_e2e::target::bulk::{self as target, Target};

/// The stalled neighbour may cost at most this share of the throughput.
const MAX_COST: f64 = 0.10;
/// How long the stalled tunnel's target keeps trying to write.
const STALL_FOR: Duration = Duration::from_secs(300);
/// The neighbour counts as stalled once its target wrote nothing for this long.
const QUIET: Duration = Duration::from_millis(300);
const STALL_MAX_WAIT: Duration = Duration::from_secs(10);

/// Alternates alone and stalled runs (`budget.stall_rounds` each), compares the totals.
pub async fn run(rig: &Rig, target: &Target, budget: &Budget, report: &mut Report) {
    eprintln!("== stalled neighbour ({} round(s))", budget.stall_rounds);
    let what = "throughput with a stalled neighbour (1 tunnel, download)";
    let mut alone = Vec::new();
    let mut stalled = Vec::new();
    let mut buffered = 0;
    for _ in 0..budget.stall_rounds {
        match one_round(&rig.mtls, target, budget).await {
            Ok((a, Ok(s), b)) => {
                alone.push(a);
                stalled.push(s);
                buffered = b;
            }
            Ok((_, Err(error), _)) | Err(error) => {
                report.failed(what, "cost < 10%", &error);
                return;
            }
        }
    }
    let total = |runs: &[Bulk]| {
        let bytes: u64 = runs.iter().map(|r| r.bytes).sum();
        let seconds: f64 = runs.iter().map(|r| r.seconds).sum();
        bytes as f64 / seconds.max(1e-9)
    };
    let (alone, with) = (total(&alone), total(&stalled));
    let cost = 1.0 - with / alone;
    eprintln!(
        "  alone {}, with a stalled neighbour {} (cost {:.1}%; the neighbour buffered {} KiB before it stalled)",
        rate(alone),
        rate(with),
        cost * 100.0,
        buffered >> 10
    );
    let _ = report.record(
        "stall",
        json!({
            "alone_bytes_per_s": alone,
            "stalled_bytes_per_s": with,
            "cost": cost,
            "rounds": budget.stall_rounds,
            "stalled_tunnel_buffered_bytes": buffered,
        }),
    );
    report.row(
        "Stalled neighbour (same agent, mTLS, one bulk download)",
        &[
            "alone",
            "with stalled neighbour",
            "cost",
            "neighbour buffered before stalling",
        ],
        vec![
            rate(alone),
            rate(with),
            format!("{:.1}%", cost * 100.0),
            format!("{} KiB", buffered >> 10),
        ],
    );
    let _ = report.check(Check {
        what: what.to_owned(),
        bridgehead: rate(with),
        direct: format!("{} alone", rate(alone)),
        ratio: format!("cost {:.1}%", cost * 100.0),
        target: "cost < 10%".to_owned(),
        outcome: Outcome::of(cost < MAX_COST),
    });
}

/// What a stalled neighbour costs a bulk download on `route`: 1 − beside / alone over
/// `budget.stall_rounds` rounds, and the bytes the neighbour took before it stalled. A download
/// that cannot open or finish beside it (every tunnel of the agent blocked behind the stalled
/// one, ANP#881) costs 1.
pub(crate) async fn cost(
    route: &Route,
    target: &Target,
    budget: &Budget,
) -> anyhow::Result<(f64, u64)> {
    let (mut alone, mut beside) = ((0u64, 0f64), (0u64, 0f64));
    let mut buffered = 0;
    for _ in 0..budget.stall_rounds {
        let (a, s, b) = one_round(route, target, budget).await?;
        buffered = b;
        match s {
            Ok(s) => {
                alone = (alone.0 + a.bytes, alone.1 + a.seconds);
                beside = (beside.0 + s.bytes, beside.1 + s.seconds);
            }
            Err(error) => {
                eprintln!(
                    "  {}: no download beside a stalled tunnel: {error:#}",
                    route.label()
                );
                return Ok((1.0, buffered));
            }
        }
    }
    let rate = |(bytes, seconds): (u64, f64)| bytes as f64 / seconds.max(1e-9);
    Ok((1.0 - rate(beside) / rate(alone).max(1e-9), buffered))
}

/// One download alone, then one beside a freshly stalled tunnel. Returns both (the second as
/// it went: a proxy that blocks behind the stalled tunnel fails it) and how many bytes the
/// stalled tunnel's target got out before it blocked.
async fn one_round(
    route: &Route,
    target: &Target,
    budget: &Budget,
) -> anyhow::Result<(Bulk, anyhow::Result<Bulk>, u64)> {
    let alone = bulk(
        route,
        target.addr,
        Direction::Download,
        1,
        budget.bulk_bytes,
        budget.bulk_time,
        &[],
    )
    .await?;
    let before = target.download_written();
    let mut neighbour = route.open(target.addr).await?;
    target::request_download(&mut neighbour, u64::MAX, STALL_FOR).await?;
    wait_stalled(target, before).await?;
    let buffered = target.download_written() - before;
    let with = bulk(
        route,
        target.addr,
        Direction::Download,
        1,
        budget.bulk_bytes,
        budget.bulk_time,
        &[],
    )
    .await;
    drop(neighbour);
    Ok((alone, with, buffered))
}

/// Waits until the neighbour's target wrote something and then nothing for [`QUIET`]
/// (bounded).
async fn wait_stalled(target: &Target, before: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + STALL_MAX_WAIT;
    let mut last = target.download_written();
    let mut quiet_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = target.download_written();
        if now != last {
            last = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= QUIET && now > before {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the neighbour never stalled: its target kept writing for {STALL_MAX_WAIT:?}"
            );
        }
    }
}
