//! Sets `BRIDGEHEAD_COMMIT` for the crate: the environment's `BRIDGEHEAD_COMMIT` when set (a
//! build from a source tarball, or `scripts/release.sh` marking a dirty tree), else the first
//! 12 hex digits of `git rev-parse HEAD`, else `unknown` (no git, no repository).
//!
//! And `BRIDGEHEAD_VERSION`: the environment's when set (`scripts/release.sh --version`, a
//! release candidate or the upgrade drill's second build), else the workspace's version. An
//! override beside the commit, rather than an edit of `Cargo.toml`, so that only the crates
//! above this one build again, not every dependency (whose metadata the version would change).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Hex digits of the commit kept: as many in every clone (git's `--short` grows with the
/// repository), so two builds of one commit print and embed the same string.
const SHORT: usize = 12;

fn main() {
    println!("cargo:rerun-if-env-changed=BRIDGEHEAD_COMMIT");
    let commit = match std::env::var("BRIDGEHEAD_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => {
            let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
            from_git(&dir).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=BRIDGEHEAD_COMMIT={commit}");

    println!("cargo:rerun-if-env-changed=BRIDGEHEAD_VERSION");
    let version = match std::env::var("BRIDGEHEAD_VERSION") {
        Ok(version) if !version.trim().is_empty() => version.trim().to_owned(),
        _ => std::env::var("CARGO_PKG_VERSION").unwrap_or_default(),
    };
    // It becomes a Prometheus label value, an image tag and part of `--version`: refuse what
    // would not fit them, with the reason, rather than build a binary that prints it.
    if !valid_version(&version) {
        panic!(
            "BRIDGEHEAD_VERSION={version:?} is not a version: digits, letters, '.', '-' and '+', starting with a digit"
        );
    }
    println!("cargo:rustc-env=BRIDGEHEAD_VERSION={version}");
}

/// A SemVer-shaped version (`0.1.1`, `0.2.0-rc.1`, `0.1.1-drill+build.5`): what a tag and a
/// label value take without quoting.
fn valid_version(version: &str) -> bool {
    version.len() <= 64
        && version.starts_with(|c: char| c.is_ascii_digit())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
}

/// The commit of HEAD, and a rerun of this script whenever HEAD moves: the HEAD file (a
/// checkout), the branch's ref (a commit) and packed-refs (a `git gc`). Worktrees included:
/// git names the files.
fn from_git(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let output = Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "HEAD"])?;
    let branch = git(&["rev-parse", "--symbolic-full-name", "HEAD"]).unwrap_or_default();
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if branch.starts_with("refs/") {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let short: String = head.chars().take(SHORT).collect();
    (short.len() == SHORT && short.chars().all(|c| c.is_ascii_hexdigit())).then_some(short)
}
