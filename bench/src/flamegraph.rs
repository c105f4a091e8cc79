//! SVG flame graphs of the `perf record` call graphs that `--perf DIR` makes: `perf script`
//! prints the samples, inferno folds them (its `collapse-perf`) and draws them, in this
//! process.

use std::io::BufReader;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use inferno::collapse::perf::{Folder, Options as FoldOptions};
use inferno::collapse::Collapse;
use inferno::flamegraph::color::{MultiPalette, Palette};
use inferno::flamegraph::{self, Options as GraphOptions};

/// `perf script` may take this long (it resolves inlined frames with addr2line: seconds per
/// thousand samples).
const SCRIPT_LIMIT: Duration = Duration::from_secs(300);

/// Draws the samples of `data` (a `perf record -g` file) as a flame graph at `svg`.
pub fn render(data: &Path, svg: &Path, title: &str) -> anyhow::Result<()> {
    let mut script = Command::new("perf")
        .arg("script")
        .arg("-i")
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf script")?;
    let stdout = script.stdout.take().context("no stdout from perf script")?;
    // A watchdog ends perf script after the bound; the fold then sees the end of its input.
    let watchdog = std::thread::spawn(move || wait_bounded(script, SCRIPT_LIMIT));

    let mut fold_options = FoldOptions::default();
    fold_options.annotate_kernel = true;
    fold_options.nthreads = 1;
    let mut folded = Vec::new();
    let collapsed = Folder::from(fold_options).collapse(BufReader::new(stdout), &mut folded);
    let status = watchdog
        .join()
        .map_err(|_| anyhow::anyhow!("the perf script watchdog panicked"))??;
    if !status.success() {
        bail!("perf script -i {} failed: {status}", data.display());
    }
    collapsed.context("folding perf script's stacks")?;
    let folded = String::from_utf8_lossy(&folded);
    if folded.trim().is_empty() {
        bail!("{} holds no samples with call stacks", data.display());
    }

    let mut options = GraphOptions::default();
    options.title = title.to_owned();
    options.count_name = "samples".to_owned();
    options.colors = Palette::Multi(MultiPalette::Rust);
    let file = std::fs::File::create(svg).with_context(|| format!("creating {}", svg.display()))?;
    let mut lines: Vec<&str> = folded.lines().collect();
    // from_lines wants the folded stacks sorted.
    lines.sort_unstable();
    flamegraph::from_lines(&mut options, lines, std::io::BufWriter::new(file))
        .with_context(|| format!("drawing {}", svg.display()))?;
    Ok(())
}

/// Waits for `child` to exit, killing it after `limit`.
fn wait_bounded(mut child: Child, limit: Duration) -> anyhow::Result<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("perf script did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
