//! Skipping a test that cannot run on this machine, so that nobody can miss it.
//!
//! A skipped test still passes, but [`skip`] writes its line straight to the terminal's
//! stderr (past the test harness's output capture), appends it to the file named by
//! `BRIDGEHEAD_SKIP_LOG` (which `scripts/test.sh` counts and lists at the end), and, when
//! `BRIDGEHEAD_FORBID_SKIPS` is set (CI sets it), fails the test instead.

use std::io::Write;

/// The file that collects skip lines.
pub const LOG_VAR: &str = "BRIDGEHEAD_SKIP_LOG";
/// Set (to anything) to make every skip a failure.
pub const FORBID_VAR: &str = "BRIDGEHEAD_FORBID_SKIPS";

/// Reports `test` as skipped for `reason`; the caller returns right after. Panics instead when
/// skips are forbidden.
pub fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED ({reason}): {test}\n");
    if std::env::var_os(FORBID_VAR).is_some() {
        panic!("{FORBID_VAR} is set and this test would be skipped: {line}");
    }
    // Not eprintln!: the harness captures that; a direct write to the descriptor is not.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os(LOG_VAR) {
        if let Ok(mut log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = log.write_all(line.as_bytes());
        }
    }
}

/// True when the process runs as root; otherwise [`skip`]s `test` and returns false.
pub fn require_root(test: &str) -> bool {
    if crate::netns::is_root() {
        return true;
    }
    skip(test, "needs root for network namespaces");
    false
}
