//! `scripts/release.sh`: what it writes verifies (`sha256sum -c`), each tarball holds the three
//! static binaries of its platform, the image index holds one image per platform of the
//! binaries the tarballs hold, run as 65532 on a base with no host library, the SBOM names
//! every crate in the binaries and every Debian package in the image, the chart is there, and
//! packing the same binaries again writes the same bytes.
//!
//! Which platforms: `BRIDGEHEAD_RELEASE_PLATFORMS` (comma-separated), by default
//! [`DEFAULT_PLATFORMS`], what CI runs (docs/release.md, "CI", says why and what the by-hand
//! release adds).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use bridgehead_e2e::release::{
    elf, missing_for, platform_machine, run_script, script, Layout, TRIPLES,
};

const TEST: &str = "release_verifies_and_packs_reproducibly";
const VERSION: &str = env!("CARGO_PKG_VERSION");
const BINARIES: [&str; 3] = ["bridgehead-server", "bridgehead-agent", "bridgehead-certs"];
/// What CI releases: both platforms, as a release is made. The linux/amd64 build is the one
/// the real-cluster tests' image holds and the linux/arm64 one the one e2e/tests/arm64.rs runs
/// under qemu-user, so the release adds no build of its own (docs/release.md, "CI").
const DEFAULT_PLATFORMS: &str = "linux/amd64,linux/arm64";

/// The platforms this run releases.
fn platforms() -> Vec<String> {
    let list = std::env::var("BRIDGEHEAD_RELEASE_PLATFORMS")
        .unwrap_or_else(|_| DEFAULT_PLATFORMS.to_owned());
    list.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Runs `scripts/release.sh --out OUT` for `platforms`.
fn release(out: &Path, platforms: &[String]) {
    let mut command = Command::new(script("release.sh"));
    command.arg("--out").arg(out);
    for platform in platforms {
        command.args(["--platform", platform]);
    }
    run_script(command).unwrap();
}

/// Every crate in the binaries, as `cargo tree` (not the SBOM's generator) resolves them:
/// normal dependencies of the three packages on the released targets, the workspace's own left
/// out.
fn crates_in_binaries(platforms: &[String]) -> BTreeSet<String> {
    let mut crates = BTreeSet::new();
    for platform in platforms {
        let target = TRIPLES
            .iter()
            .find(|(p, _)| p == platform)
            .map(|(_, triple)| *triple)
            .unwrap();
        let mut tree = Command::new("cargo");
        tree.args(["tree", "--locked", "-e", "normal", "--prefix", "none"]);
        tree.args(["--format", "{p}", "--target", target]);
        for binary in BINARIES {
            tree.args(["-p", binary]);
        }
        for line in run_script(tree).unwrap().lines() {
            let mut words = line.split_whitespace();
            if let (Some(name), Some(version)) = (words.next(), words.next()) {
                // Workspace crates print their path after the version; registry ones do not.
                if !line.contains("(/") {
                    crates.insert(format!("{name} {}", version.trim_start_matches('v')));
                }
            }
        }
    }
    crates
}

/// The Debian packages pinned for the image's base: `name version`.
fn pinned_packages() -> BTreeSet<String> {
    let pins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/image/packages.txt");
    std::fs::read_to_string(pins)
        .unwrap()
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| {
            line.split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// The chart's version, from charts/bridgehead/Chart.yaml.
fn chart_version() -> String {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/bridgehead/Chart.yaml");
    std::fs::read_to_string(chart)
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("version:"))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .unwrap()
}

/// The files of gzip-compressed (or plain) tar `path`, and the tree unpacked into `into`.
fn untar(path: &Path, into: &Path) -> Vec<String> {
    std::fs::create_dir_all(into).unwrap();
    let mut list = Command::new("tar");
    list.arg("-tf").arg(path);
    let names = run_script(list)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let mut unpack = Command::new("tar");
    unpack.arg("-xf").arg(path).arg("-C").arg(into);
    run_script(unpack).unwrap();
    names
}

fn sha256(path: &Path) -> String {
    let mut sum = Command::new("sha256sum");
    sum.arg(path);
    run_script(sum).unwrap()[..64].to_owned()
}

/// Checks the release in `dist` of `platforms`, unpacking into `scratch`; `SHA256SUMS`.
fn verify(dist: &Path, scratch: &Path, platforms: &[String]) -> String {
    // SHA256SUMS covers every other file, and they verify.
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap();
    let summed: BTreeSet<&str> = sums.lines().map(|l| &l[66..]).collect();
    let written: BTreeSet<String> = std::fs::read_dir(dist)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "SHA256SUMS")
        .collect();
    assert_eq!(
        summed,
        written.iter().map(String::as_str).collect(),
        "{sums}"
    );
    let mut check = Command::new("sha256sum");
    check
        .args(["-c", "--strict", "SHA256SUMS"])
        .current_dir(dist);
    assert!(check.status().unwrap().success(), "sha256sum -c fails");
    let mut expected: BTreeSet<String> = platforms
        .iter()
        .map(|p| format!("bridgehead-{VERSION}-{}.tar.gz", p.replace('/', "-")))
        .collect();
    expected.insert("bridgehead.oci.tar".to_owned());
    expected.insert(format!("bridgehead-{VERSION}.spdx.json"));
    expected.insert(format!("bridgehead-{}.tgz", chart_version()));
    assert_eq!(written, expected);

    // Each tarball: the three binaries, static, for its platform.
    let unpacked = scratch.join("unpacked");
    let mut shipped = BTreeSet::new();
    for platform in platforms {
        let name = format!("bridgehead-{VERSION}-{}", platform.replace('/', "-"));
        let files = untar(&dist.join(format!("{name}.tar.gz")), &unpacked);
        assert!(
            files.iter().all(|f| f.starts_with(&format!("{name}/"))),
            "{files:?}"
        );
        for binary in BINARIES {
            let path = unpacked.join(&name).join(binary);
            let machine = platform_machine(platform).unwrap();
            assert_eq!(elf(&path).unwrap(), (machine, false), "{name}/{binary}");
            shipped.insert(sha256(&path));
        }
    }

    // The image: one index of the platforms, each the Containerfile's image.
    let layout = Layout::unpack(&dist.join("bridgehead.oci.tar")).unwrap();
    let top = layout.index().unwrap();
    let entry = &top["manifests"][0];
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        format!("docker.io/library/bridgehead:{VERSION}")
    );
    let index = layout.json(entry["digest"].as_str().unwrap()).unwrap();
    let mut in_index = BTreeSet::new();
    for manifest in index["manifests"].as_array().unwrap() {
        let arch = manifest["platform"]["architecture"].as_str().unwrap();
        in_index.insert(format!(
            "{}/{arch}",
            manifest["platform"]["os"].as_str().unwrap()
        ));
        let image = layout.json(manifest["digest"].as_str().unwrap()).unwrap();
        let config = layout
            .json(image["config"]["digest"].as_str().unwrap())
            .unwrap();
        assert_eq!(config["architecture"], arch);
        assert_eq!(config["config"]["User"], "65532:65532", "{config}");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/bridgehead-server"])
        );
        let root = scratch.join(format!("image-{arch}"));
        let mut files = Vec::new();
        for layer in image["layers"].as_array().unwrap() {
            let blob = layout.blob(layer["digest"].as_str().unwrap()).unwrap();
            files.extend(untar(&blob, &root));
        }
        // No shared library or loader of any machine: the binaries are all there is to run.
        for file in &files {
            let name = file.rsplit('/').next().unwrap_or(file);
            let library = name.ends_with(".so") || name.contains(".so.");
            assert!(
                !library && !name.starts_with("ld-linux"),
                "{arch} image holds {file}"
            );
        }
        for binary in ["bridgehead-server", "bridgehead-agent"] {
            assert!(
                shipped.contains(&sha256(&root.join(binary))),
                "{arch} image's {binary} is not a tarball's"
            );
        }
        for file in [
            "etc/ssl/certs/ca-certificates.crt",
            "etc/passwd",
            "var/lib/dpkg/status.d/ca-certificates",
        ] {
            assert!(root.join(file).is_file(), "{arch} image has no {file}");
        }
    }
    assert_eq!(in_index, platforms.iter().cloned().collect());

    // The SBOM names every crate and every Debian package.
    let sbom: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dist.join(format!("bridgehead-{VERSION}.spdx.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
    let named: BTreeSet<String> = sbom["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{} {}",
                p["name"].as_str().unwrap(),
                p["versionInfo"].as_str().unwrap()
            )
        })
        .collect();
    let crates = crates_in_binaries(platforms);
    assert!(crates.len() > 100, "{crates:?}");
    let missing: Vec<_> = crates.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "crates missing from the SBOM: {missing:?}"
    );
    let missing: Vec<_> = pinned_packages()
        .into_iter()
        .filter(|p| !named.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        "Debian packages missing from the SBOM: {missing:?}"
    );
    sums
}

#[test]
fn release_verifies_and_packs_reproducibly() {
    let platforms = platforms();
    let missing = missing_for(&platforms);
    if !missing.is_empty() {
        let reason = format!(
            "scripts/release.sh needs {}: scripts/install-test-deps.sh (as root) installs all but Go",
            missing.join(", ")
        );
        return bridgehead_e2e::skip::skip(TEST, &reason);
    }
    let runs = tempfile::tempdir().unwrap();
    let dist = runs.path().join("dist");
    release(&dist, &platforms);
    let sums = verify(&dist, runs.path(), &platforms);

    // Reproducible packing: a second run from the same tree (cargo has nothing to build)
    // writes the same bytes, every archive, layer and the SBOM included. Two cold builds of
    // the binaries are compared by hand (docs/release.md, "Reproducible").
    let again = runs.path().join("again");
    release(&again, &platforms);
    assert_eq!(
        std::fs::read_to_string(again.join("SHA256SUMS")).unwrap(),
        sums,
        "a second run from the same tree differs"
    );
}
