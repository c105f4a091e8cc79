//! The version and the commit every Bridgehead binary was built from, in one place: the
//! version is the workspace's (`[workspace.package] version` in the root `Cargo.toml`) unless
//! `BRIDGEHEAD_VERSION` set another at build time (`scripts/release.sh --version`), the
//! commit what `build.rs` found (`git rev-parse HEAD`, or `BRIDGEHEAD_COMMIT` from the
//! environment when building from a source tarball). `--version`, the first log line and the
//! `bridgehead_build_info` metric all read these constants.
//!
//! A crate of its own, with no dependencies, so `bridgehead-certs` gets it without the run-time
//! stack; what logs and exports it is `bridgehead_runtime::build`.

/// The release version, e.g. `0.1.0`.
pub const VERSION: &str = env!("BRIDGEHEAD_VERSION");

/// The first 12 hex digits of the commit built, or `unknown`.
pub const COMMIT: &str = env!("BRIDGEHEAD_COMMIT");

/// What `--version` prints after the program's name: `0.1.0 (commit 0123456789ab)`.
pub const VERSION_AND_COMMIT: &str = concat!(
    env!("BRIDGEHEAD_VERSION"),
    " (commit ",
    env!("BRIDGEHEAD_COMMIT"),
    ")"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_the_workspace_one_and_the_line_names_the_commit() {
        assert!(!VERSION.is_empty());
        assert!(!COMMIT.is_empty());
        assert_eq!(VERSION_AND_COMMIT, format!("{VERSION} (commit {COMMIT})"));
    }
}
