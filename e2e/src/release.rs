//! What the release tests share: running the release scripts (scripts/build-static.sh,
//! scripts/release.sh) and reading what they write (ELF headers, OCI layouts).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context};

use crate::process::{output_within, without_package_env};

/// A cold release build of the whole stack for one platform takes many minutes on a small,
/// busy machine (docs/release.md has the measured times); this only stops a hung build.
const BUILD: Duration = Duration::from_secs(3600);

/// `scripts/NAME` of this repository.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name)
}

/// Runs `command` (a release script, or a tool) in the repository to its end; its standard
/// output. The scripts run cargo: this test's package environment is left out.
pub fn run_script(mut command: Command) -> anyhow::Result<String> {
    command.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    without_package_env(&mut command);
    let output = output_within(command, BUILD)?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// The platforms a release builds and the Rust target of each.
pub const TRIPLES: [(&str, &str); 2] = [
    ("linux/amd64", "x86_64-unknown-linux-gnu"),
    ("linux/arm64", "aarch64-unknown-linux-gnu"),
];

/// The directory of the release binaries of `platform` (`linux/arm64`), built as the release
/// builds them (`scripts/build-static.sh`).
pub fn static_binaries(platform: &str) -> anyhow::Result<PathBuf> {
    let mut command = Command::new(script("build-static.sh"));
    command.arg(platform);
    Ok(PathBuf::from(run_script(command)?.trim()))
}

/// What this machine lacks to build `platforms` with `scripts/build-static.sh` and package
/// them with `scripts/release.sh` (buildah, the image base's apt-get, Go for the chart's helm,
/// the Rust targets, the arm64 C compiler and C library): empty when it can.
pub fn missing_for<S: AsRef<str>>(platforms: &[S]) -> Vec<String> {
    let mut missing: Vec<String> = ["buildah", "apt-get", "dpkg-deb", "python3", "git", "go"]
        .into_iter()
        .filter(|tool| !crate::kubernetes::on_path(tool))
        .map(str::to_owned)
        .collect();
    missing.extend(missing_to_build(platforms));
    missing
}

/// What this machine lacks for `scripts/build-static.sh` of `platforms`: the Rust targets
/// (rustup's, for the toolchain rust-toolchain.toml names), and for linux/arm64 Debian's
/// cross C compiler and static C library.
pub fn missing_to_build<S: AsRef<str>>(platforms: &[S]) -> Vec<String> {
    let mut installed = Command::new("rustup");
    installed.args(["target", "list", "--installed"]);
    let installed = run_script(installed).unwrap_or_default();
    let mut missing = Vec::new();
    for platform in platforms {
        let platform = platform.as_ref();
        let Some((_, triple)) = TRIPLES.iter().find(|(p, _)| *p == platform) else {
            missing.push(format!("a platform it builds (not {platform})"));
            continue;
        };
        if !installed.lines().any(|line| line.trim() == *triple) {
            missing.push(format!("rustup target add {triple}"));
        }
        if platform == "linux/arm64" {
            for (tool, package) in [
                ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
                ("/usr/aarch64-linux-gnu/lib/libc.a", "libc6-dev-arm64-cross"),
            ] {
                if !crate::kubernetes::on_path(tool) {
                    missing.push(format!("{tool} (Debian's {package})"));
                }
            }
        }
    }
    missing
}

/// The ELF machine of `platform`'s binaries.
pub fn platform_machine(platform: &str) -> Option<u16> {
    match platform {
        "linux/amd64" => Some(EM_X86_64),
        "linux/arm64" => Some(EM_AARCH64),
        _ => None,
    }
}

/// `e_machine` of an ELF file for arm64.
pub const EM_AARCH64: u16 = 183;
/// `e_machine` of an ELF file for amd64.
pub const EM_X86_64: u16 = 62;

/// What the 64-bit little-endian ELF file at `path` is: its machine, and whether it names a
/// program interpreter (a dynamic loader: it is not static).
pub fn elf(path: &Path) -> anyhow::Result<(u16, bool)> {
    const PT_INTERP: u32 = 3;
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        bytes.len() > 64 && bytes[..6] == *b"\x7fELF\x02\x01",
        "{} is no 64-bit little-endian ELF",
        path.display()
    );
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(word)
    };
    let (phoff, size, count) = (u64_at(32) as usize, usize::from(u16_at(54)), u16_at(56));
    let mut interpreted = false;
    for i in 0..usize::from(count) {
        let kind = u32_at(phoff + i * size).context("program header past the end")?;
        interpreted |= kind == PT_INTERP;
    }
    Ok((u16_at(18), interpreted))
}

/// An unpacked OCI image layout: its blobs by digest.
#[derive(Debug)]
pub struct Layout {
    dir: tempfile::TempDir,
}

impl Layout {
    /// Unpacks the OCI archive at `archive`.
    pub fn unpack(archive: &Path) -> anyhow::Result<Layout> {
        let dir = tempfile::tempdir()?;
        let mut tar = Command::new("tar");
        tar.arg("-xf").arg(archive).arg("-C").arg(dir.path());
        run_script(tar)?;
        Ok(Layout { dir })
    }

    /// `index.json`.
    pub fn index(&self) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_slice(&std::fs::read(
            self.dir.path().join("index.json"),
        )?)?)
    }

    /// The path of the blob `digest` (`sha256:...`), checked against its digest.
    pub fn blob(&self, digest: &str) -> anyhow::Result<PathBuf> {
        let hex = digest
            .strip_prefix("sha256:")
            .context("not a sha256 digest")?;
        let path = self.dir.path().join("blobs/sha256").join(hex);
        let mut sum = Command::new("sha256sum");
        sum.arg(&path);
        let line = run_script(sum)?;
        ensure!(
            line.starts_with(hex),
            "blob {digest} does not match its digest"
        );
        Ok(path)
    }

    /// The blob `digest` as JSON.
    pub fn json(&self, digest: &str) -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_slice(&std::fs::read(self.blob(digest)?)?)?)
    }
}
