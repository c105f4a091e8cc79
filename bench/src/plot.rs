//! SVG plots of a run: throughput against tunnel count, setup latency per route, and the
//! side-by-side paths' bulk rates and CPU per GiB against their cost floors.

use std::path::Path;

use anyhow::anyhow;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::report::{SetupPoint, ThroughputPoint};

const SIZE: (u32, u32) = (900, 540);

/// `throughput.svg`: aggregate MiB/s against concurrent tunnels (log2 axis), one line per
/// route and direction.
pub fn throughput(points: &[ThroughputPoint], path: &Path) -> anyhow::Result<()> {
    // Head room above the highest point keeps the legend clear of the lines.
    let top = points.iter().map(|p| p.mib_per_s).fold(1.0, f64::max) * 1.35;
    let max_x = points
        .iter()
        .map(|p| (p.tunnels as f64).log2())
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e:?}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Bulk throughput against concurrent tunnels (loopback)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.2f64..max_x + 0.2, 0f64..top)
        .map_err(|e| anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .x_desc("concurrent tunnels")
        .y_desc("aggregate MiB/s")
        .light_line_style(RGBColor(238, 238, 238))
        .x_labels(max_x as usize + 1)
        .x_label_formatter(&|x| format!("{:.0}", 2f64.powf(x.round())))
        .draw()
        .map_err(|e| anyhow!("{e:?}"))?;
    // Bridgehead's frontend of the run (`--frontend`).
    let ours = points
        .iter()
        .map(|p| p.route)
        .find(|route| *route != "direct")
        .unwrap_or("bridgehead-mtls");
    let series = [
        (ours, "upload", RED, "bridgehead upload"),
        (ours, "download", MAGENTA, "bridgehead download"),
        ("direct", "upload", BLUE, "direct upload"),
        ("direct", "download", CYAN, "direct download"),
    ];
    for (route, direction, color, label) in series {
        let line: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.route == route && p.direction == direction)
            .map(|p| ((p.tunnels as f64).log2(), p.mib_per_s))
            .collect();
        if line.is_empty() {
            continue;
        }
        draw_line(&mut chart, line, color, label, 4)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow!("{e:?}"))?;
    Ok(())
}

/// `setup.svg`: p50 and p99 setup latency (log axis) per route and concurrency.
pub fn setup(points: &[SetupPoint], path: &Path) -> anyhow::Result<()> {
    if points.is_empty() {
        return Ok(());
    }
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    let low = points
        .iter()
        .map(|p| us(p.p50))
        .fold(f64::MAX, f64::min)
        .max(1.0)
        / 2.0;
    let high = points.iter().map(|p| us(p.p99)).fold(1.0, f64::max) * 2.0;
    let names: Vec<String> = points
        .iter()
        .map(|p| {
            let route = match p.route {
                "bridgehead-mtls" => "mTLS",
                "bridgehead-uds" => "UDS",
                other => other,
            };
            format!("{route} ×{}", p.concurrency)
        })
        .collect();
    let n = points.len();
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e:?}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Tunnel setup latency (fresh connection per tunnel; ×N = concurrency)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, (low..high).log_scale())
        .map_err(|e| anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("latency, µs (log scale)")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| anyhow!("{e:?}"))?;
    for (offset, color, label, pick) in [(-0.38, BLUE, "p50", 0usize), (0.02, RED, "p99", 1usize)] {
        chart
            .draw_series(points.iter().enumerate().map(|(i, p)| {
                let value = if pick == 0 { us(p.p50) } else { us(p.p99) };
                let x = i as f64 + offset;
                Rectangle::new([(x, low), (x + 0.36, value.max(low))], color.filled())
            }))
            .map_err(|e| anyhow!("{e:?}"))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow!("{e:?}"))?;
    Ok(())
}

/// Both plots into `out_dir` (`throughput.svg`, `setup.svg`); a plot without points is skipped.
pub fn write_all(
    throughput_points: &[ThroughputPoint],
    setup_points: &[SetupPoint],
    out_dir: &Path,
) -> anyhow::Result<()> {
    if !throughput_points.is_empty() {
        let path = out_dir.join("throughput.svg");
        throughput(throughput_points, &path)?;
        eprintln!("plot: {}", path.display());
    }
    if !setup_points.is_empty() {
        let path = out_dir.join("setup.svg");
        setup(setup_points, &path)?;
        eprintln!("plot: {}", path.display());
    }
    Ok(())
}

/// A labelled line with a dot at each point, sorted by x.
fn draw_line<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    mut line: Vec<(f64, f64)>,
    color: RGBColor,
    label: &str,
    dot: u32,
) -> anyhow::Result<()> {
    line.sort_by(|a, b| a.0.total_cmp(&b.0));
    chart
        .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
        .map_err(|e| anyhow!("{e:?}"))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart
        .draw_series(line.iter().map(|&p| Circle::new(p, dot, color.filled())))
        .map_err(|e| anyhow!("{e:?}"))?;
    Ok(())
}

/// One side-by-side bulk figure: a path, a direction, a tunnel count.
#[derive(Debug, Clone, Default)]
struct PathPoint {
    route: String,
    upload: bool,
    tunnels: f64,
    mib_per_s: Option<f64>,
    cpu_per_gib: Option<f64>,
    floor: Option<f64>,
}

/// `side_by_side.svg` from a run's JSON lines, if it has side-by-side bulk rows: four panels,
/// MiB/s and CPU s/GiB against tunnels, upload and download, one line per proxy path; the CPU
/// panels draw each path's cost floor dashed in its colour.
pub fn side_by_side(results: &Path, out_dir: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(results)
        .map_err(|e| anyhow!("reading {}: {e}", results.display()))?;
    let points = path_points(&text)?;
    if points.is_empty() {
        return Ok(());
    }
    let mut routes: Vec<String> = Vec::new();
    for p in &points {
        if !routes.contains(&p.route) {
            routes.push(p.route.clone());
        }
    }
    let path = out_dir.join("side_by_side.svg");
    let root = SVGBackend::new(&path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e:?}"))?;
    let panels = root.split_evenly((2, 2));
    for (panel, (upload, cpu)) in
        panels
            .iter()
            .zip([(true, false), (false, false), (true, true), (false, true)])
    {
        side_by_side_panel(panel, &points, &routes, upload, cpu)?;
    }
    root.present().map_err(|e| anyhow!("{e:?}"))?;
    eprintln!("plot: {}", path.display());
    Ok(())
}

/// The side-by-side bulk rows of a run's JSON lines, one point per path, direction and
/// tunnel count.
fn path_points(text: &str) -> anyhow::Result<Vec<PathPoint>> {
    let mut points: Vec<PathPoint> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        if v["measurement"].as_str() != Some("side_by_side") {
            continue;
        }
        let (Some(row), Some(route)) = (v["row"].as_str(), v["route"].as_str()) else {
            continue;
        };
        // "bulk, 16 tunnel(s), download"
        let Some((tunnels, direction)) = row
            .strip_prefix("bulk, ")
            .and_then(|rest| rest.split_once(" tunnel(s), "))
        else {
            continue;
        };
        let Ok(tunnels) = tunnels.parse::<f64>() else {
            continue;
        };
        let upload = direction == "upload";
        let at = points
            .iter()
            .position(|p| p.route == route && p.upload == upload && p.tunnels == tunnels);
        let point = match at {
            Some(i) => &mut points[i],
            None => {
                points.push(PathPoint {
                    route: route.to_owned(),
                    upload,
                    tunnels,
                    ..PathPoint::default()
                });
                points.last_mut().ok_or_else(|| anyhow!("no point"))?
            }
        };
        if let Some(rate) = v["bytes_per_s"].as_f64() {
            point.mib_per_s = Some(rate / (1024.0 * 1024.0));
        }
        if let Some(cpu) = v["cpu_s_per_gib"].as_f64() {
            point.cpu_per_gib = Some(cpu);
        }
        if let Some(floor) = v["floor_s_per_gib"].as_f64() {
            point.floor = Some(floor);
        }
    }
    Ok(points)
}

/// One panel of `side_by_side.svg`: `upload` or download, CPU per GiB (`cpu`, with each
/// path's floor dashed) or MiB/s, one line per route.
fn side_by_side_panel(
    panel: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    points: &[PathPoint],
    routes: &[String],
    upload: bool,
    cpu: bool,
) -> anyhow::Result<()> {
    let palette = [
        BLUE,
        RED,
        MAGENTA,
        RGBColor(0, 140, 0),
        RGBColor(230, 140, 0),
        BLACK,
        CYAN,
    ];
    let colour =
        |route: &str| palette[routes.iter().position(|r| r == route).unwrap_or(0) % palette.len()];
    let max_x = points.iter().map(|p| p.tunnels.log2()).fold(1.0, f64::max);
    let value = |p: &PathPoint| if cpu { p.cpu_per_gib } else { p.mib_per_s };
    let shown: Vec<&PathPoint> = points
        .iter()
        // Direct, ten times faster, would flatten every proxy's line: it is in the table.
        .filter(|p| p.upload == upload && p.route != "direct")
        .collect();
    let top = shown
        .iter()
        .flat_map(|p| [value(p), if cpu { p.floor } else { None }])
        .flatten()
        .fold(1.0, f64::max)
        * 1.3;
    let caption = format!(
        "{} {}",
        if upload { "upload" } else { "download" },
        if cpu {
            "CPU s/GiB (server + agent), floor dashed"
        } else {
            "MiB/s"
        }
    );
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.2f64..max_x + 0.2, 0f64..top)
        .map_err(|e| anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .x_desc("concurrent tunnels")
        .light_line_style(RGBColor(238, 238, 238))
        .x_label_formatter(&|x| format!("{:.0}", 2f64.powf(x.round())))
        .draw()
        .map_err(|e| anyhow!("{e:?}"))?;
    for route in routes {
        let color = colour(route);
        let of_route = || shown.iter().filter(move |p| &p.route == route);
        let line: Vec<(f64, f64)> = of_route()
            .filter_map(|p| Some((p.tunnels.log2(), value(p)?)))
            .collect();
        if !line.is_empty() {
            draw_line(&mut chart, line, color, route, 3)?;
        }
        if cpu {
            let mut floor: Vec<(f64, f64)> = of_route()
                .filter_map(|p| Some((p.tunnels.log2(), p.floor?)))
                .collect();
            floor.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(DashedLineSeries::new(floor, 6, 4, color.stroke_width(1)))
                .map_err(|e| anyhow!("{e:?}"))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(|e| anyhow!("{e:?}"))?;
    Ok(())
}

/// Re-renders the plots of an earlier run from its JSON lines (`--replot`).
pub fn replot(results: &Path, out_dir: &Path) -> anyhow::Result<()> {
    side_by_side(results, out_dir)?;
    let text = std::fs::read_to_string(results)
        .map_err(|e| anyhow!("reading {}: {e}", results.display()))?;
    let label = |v: &serde_json::Value| match v.as_str() {
        Some("direct") => Some("direct"),
        Some("bridgehead-mtls") => Some("bridgehead-mtls"),
        Some("bridgehead-uds") => Some("bridgehead-uds"),
        Some("upload") => Some("upload"),
        Some("download") => Some("download"),
        _ => None,
    };
    let mut throughput_points = Vec::new();
    let mut setup_points = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        match v["measurement"].as_str() {
            Some("throughput") => {
                if let (Some(route), Some(direction), Some(tunnels), Some(rate)) = (
                    label(&v["route"]),
                    label(&v["direction"]),
                    v["tunnels"].as_u64(),
                    v["bytes_per_s"].as_f64(),
                ) {
                    throughput_points.push(ThroughputPoint {
                        route,
                        direction,
                        tunnels: tunnels as usize,
                        mib_per_s: rate / (1024.0 * 1024.0),
                    });
                }
            }
            Some("setup") if v["opened"].as_u64().unwrap_or(0) > 0 => {
                if let (Some(route), Some(concurrency), Some(p50), Some(p99)) = (
                    label(&v["route"]),
                    v["concurrency"].as_u64(),
                    v["p50_us"].as_f64(),
                    v["p99_us"].as_f64(),
                ) {
                    setup_points.push(SetupPoint {
                        route,
                        concurrency: concurrency as usize,
                        p50: std::time::Duration::from_secs_f64(p50 / 1e6),
                        p99: std::time::Duration::from_secs_f64(p99 / 1e6),
                    });
                }
            }
            _ => {}
        }
    }
    write_all(&throughput_points, &setup_points, out_dir)
}
