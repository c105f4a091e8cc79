//! The drill loop's long request: `kubectl logs -f`, followed until the loop stops, each end
//! of it counted as loud or silent.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use super::requests::tick;
use super::{Kind, Shared, FOLLOW_STALL, PACE};

/// Follows `pod`'s logs until the loop stops, starting again each time the stream ends; each
/// end counted, loud or silent.
pub(super) fn follow_until_stopped(shared: &Shared, pod: &str) {
    while !shared.stopping() {
        let since = Instant::now();
        let end = follow(shared, pod);
        match end {
            Ok(()) => shared.counts(Kind::Follow, |counts| counts.ok += 1),
            Err(FollowEnd::Failed(message)) => {
                shared.counts(Kind::Follow, |counts| counts.failed += 1);
                shared.fail(Kind::Follow, pod, since, false, message);
            }
            Err(FollowEnd::Loud(message)) => {
                shared.counts(Kind::Follow, |counts| counts.ended_loudly += 1);
                shared.fail(Kind::Follow, pod, since, false, message);
            }
            Err(FollowEnd::Silent(message)) => {
                shared.counts(Kind::Follow, |counts| counts.ended_silently += 1);
                shared.fail(Kind::Follow, pod, since, true, message);
            }
        }
        std::thread::sleep(PACE);
    }
}

/// How a followed stream ended before the loop stopped.
#[derive(Debug)]
enum FollowEnd {
    /// It never started, or delivered ticks out of order.
    Failed(String),
    /// kubectl exited non-zero, saying why.
    Loud(String),
    /// kubectl exited 0, or no tick came for [`FOLLOW_STALL`].
    Silent(String),
}

/// One `kubectl logs -f --tail=1 POD`, its ticks checked in order, until the loop stops (Ok)
/// or the stream ends.
fn follow(shared: &Shared, pod: &str) -> Result<(), FollowEnd> {
    let mut child = shared
        .kubectl(&["logs", "-f", "--tail=1", pod])
        .spawn()
        .map_err(|error| FollowEnd::Failed(format!("running kubectl: {error}")))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(FollowEnd::Failed("no stdout".into()));
    };
    // Lines arrive on a channel, so that a stall is seen while kubectl runs.
    let (sender, receiver) = std::sync::mpsc::sync_channel(64);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    let mut last: Option<u64> = None;
    let mut lines = 0u64;
    let mut last_line_at = Instant::now();
    let ended = loop {
        if shared.stopping() {
            break None;
        }
        match receiver.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(line)) => {
                let Some(n) = tick(&line) else {
                    break Some(FollowEnd::Failed(format!("not a tick: {line:?}")));
                };
                if let Some(previous) = last {
                    if n != previous + 1 {
                        break Some(FollowEnd::Failed(format!("tick {n} after tick {previous}")));
                    }
                }
                last = Some(n);
                lines += 1;
                last_line_at = Instant::now();
            }
            Ok(Err(error)) => break Some(FollowEnd::Loud(format!("reading: {error}"))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            // kubectl closed its output: it is exiting.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                break Some(FollowEnd::Silent(String::new()))
            }
        }
        // Once kubectl exited, its last lines may still be in the pipe: the reader drains
        // them, then Disconnected ends the loop.
        let running = matches!(child.try_wait(), Ok(None));
        if running && last_line_at.elapsed() > FOLLOW_STALL {
            break Some(FollowEnd::Silent(format!(
                "no tick for {FOLLOW_STALL:?} after tick {last:?} while kubectl ran"
            )));
        }
    };
    let _ = child.kill();
    let output = child.wait_with_output();
    let _ = reader.join();
    let Some(end) = ended else {
        return Ok(());
    };
    match (end, output) {
        (FollowEnd::Silent(message), Ok(output)) if message.is_empty() => {
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            if output.status.success() {
                Err(FollowEnd::Silent(format!(
                    "kubectl exited 0 after {lines} ticks (last {last:?}): {stderr}"
                )))
            } else {
                Err(FollowEnd::Loud(format!(
                    "kubectl exited {:?} after {lines} ticks: {stderr}",
                    output.status.code()
                )))
            }
        }
        (end, _) => Err(end),
    }
}
