//! The images of a test cluster: Bridgehead's own (the release's image: `scripts/release.sh
//! --image-only --platform linux/amd64` of this tree's sources, through `scripts/image.sh`),
//! which the cluster pushes to its registry and its nodes pull, and the test-only ones a node
//! imports (pause, busybox, testserver, konnectivity). Built once per test process into
//! `images/` beside the binaries.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{bail, Context};

/// One OCI archive and the image name `scripts/image.sh` gives it.
#[derive(Debug, Clone)]
pub struct Archive {
    pub path: PathBuf,
    pub name: String,
}

/// The archives.
#[derive(Debug, Clone)]
pub struct Images {
    /// `docker.io/library/bridgehead:<version>`; its tag is what the registry serves it under.
    pub bridgehead: Archive,
    /// The pod sandbox.
    pub pause: Archive,
    /// A shell and tools for the tests' pods.
    pub busybox: Archive,
    /// e2e/go/testserver: the backend of the proxy subresources, webhook and aggregated API.
    pub testserver: Archive,
    /// konnectivity's proxy-server and proxy-agent, where asked for ([`Images::with_konnectivity`]).
    pub konnectivity: Option<Archive>,
}

impl Images {
    /// Builds the archives from the binaries this test runs (once per process).
    pub fn get() -> anyhow::Result<Images> {
        static BUILT: OnceLock<Result<Images, String>> = OnceLock::new();
        BUILT
            .get_or_init(|| Images::build(false).map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(anyhow::Error::msg)
    }

    /// The archives and konnectivity's (`scripts/image.sh --konnectivity`, which builds it
    /// from its Go module with `scripts/anp-build.sh`), once per process.
    pub fn with_konnectivity() -> anyhow::Result<Images> {
        static BUILT: OnceLock<Result<Images, String>> = OnceLock::new();
        BUILT
            .get_or_init(|| Images::build(true).map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(anyhow::Error::msg)
    }

    fn build(konnectivity: bool) -> anyhow::Result<Images> {
        let out = crate::process::bin_dir().join("images");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/image.sh");
        let mut command = Command::new(&script);
        // It runs cargo (scripts/release.sh): this test's package environment stays here.
        crate::process::without_package_env(&mut command);
        if konnectivity {
            command.arg("--konnectivity");
        }
        let output = command
            .arg(&out)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        if !output.status.success() {
            bail!(
                "{}: {}",
                script.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        // One line per archive: its path and its image name.
        let stdout = String::from_utf8_lossy(&output.stdout);
        let archive = |file: &str| -> anyhow::Result<Archive> {
            let line = stdout
                .lines()
                .find(|line| {
                    line.split_whitespace()
                        .next()
                        .is_some_and(|p| p.ends_with(file))
                })
                .with_context(|| format!("{} wrote no {file}: {stdout}", script.display()))?;
            let (path, name) = line.split_once(' ').context("archive line")?;
            Ok(Archive {
                path: path.into(),
                name: name.trim().to_owned(),
            })
        };
        Ok(Images {
            bridgehead: archive("/bridgehead.oci.tar")?,
            pause: archive("/pause.oci.tar")?,
            busybox: archive("/busybox.oci.tar")?,
            testserver: archive("/testserver.oci.tar")?,
            konnectivity: if konnectivity {
                Some(archive("/konnectivity.oci.tar")?)
            } else {
                None
            },
        })
    }
}
