//! `scripts/push-image.sh` against a real image registry (CNCF Distribution, TLS with a CA made at
//! test time, on loopback): an OCI archive of one image, of several platforms side by side in
//! its index.json, and of one image index (buildah's shape, and the release's) each arrive
//! whole, the digests kept, every platform under the one tag; a registry whose certificate
//! the pusher cannot verify, and a reference without a registry, are refused with a reason.
//! Needs `scripts/registry-build.sh` and skopeo; skipped loudly otherwise.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;

use bridgehead_e2e::image_registry::{self as registry, Registry};
use serde_json::{json, Value};

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn require(test: &str) -> bool {
    let missing = registry::missing();
    if missing.is_empty() {
        return true;
    }
    bridgehead_e2e::skip::skip(test, &format!("needs {}", missing.join(", ")));
    false
}

fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

fn push_image() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/push-image.sh")
}

/// An OCI image layout being written in a folder.
struct Layout {
    dir: tempfile::TempDir,
}

impl Layout {
    fn new() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("blobs/sha256")).unwrap();
        std::fs::write(
            dir.path().join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        Layout { dir }
    }

    /// Stores `bytes` as a blob; its descriptor.
    fn blob(&self, media_type: &str, bytes: &[u8]) -> Value {
        let digest = hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
        std::fs::write(self.dir.path().join("blobs/sha256").join(&digest), bytes).unwrap();
        json!({"mediaType": media_type, "digest": format!("sha256:{digest}"), "size": bytes.len()})
    }

    /// A one-layer image for `linux/<arch>` (its layer a tar holding a file naming the
    /// architecture); its manifest's descriptor, with the platform.
    fn image(&self, arch: &str) -> Value {
        let layer = self.blob("application/vnd.oci.image.layer.v1.tar", &tar_of(arch));
        let config = json!({
            "architecture": arch,
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
        });
        let config = self.blob(
            "application/vnd.oci.image.config.v1+json",
            config.to_string().as_bytes(),
        );
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": config,
            "layers": [layer],
        });
        let mut descriptor = self.blob(MANIFEST, manifest.to_string().as_bytes());
        descriptor["platform"] = json!({"architecture": arch, "os": "linux"});
        descriptor
    }

    /// Writes index.json naming `manifests`, and the layout as a tar, as `*.oci.tar` are.
    fn archive(&self, manifests: Vec<Value>) -> PathBuf {
        let index = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests});
        std::fs::write(self.dir.path().join("index.json"), index.to_string()).unwrap();
        let archive = self.dir.path().join("image.oci.tar");
        let out = Command::new("tar")
            .arg("-C")
            .arg(self.dir.path())
            .args(["-cf"])
            .arg(&archive)
            .args(["oci-layout", "index.json", "blobs"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        archive
    }
}

/// A tar holding one file, `arch`, whose contents are `arch`.
fn tar_of(arch: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(arch), arch).unwrap();
    let out = Command::new("tar")
        .arg("-C")
        .arg(dir.path())
        .args(["--owner=0", "--group=0", "--mtime=@0", "-cf", "-", arch])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    out.stdout
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The tag's manifest, and that every blob of every platform it names is served.
fn check_served(registry: &Registry, repository: &str, tag: &str, platforms: &[&Value]) -> Value {
    let top = registry.manifest(repository, tag).unwrap();
    let images: Vec<Value> = if platforms.len() == 1 {
        assert_eq!(top["mediaType"], MANIFEST, "{top}");
        vec![top.clone()]
    } else {
        assert_eq!(top["mediaType"], INDEX, "{top}");
        let listed = top["manifests"].as_array().unwrap();
        assert_eq!(listed.len(), platforms.len(), "{top}");
        for (entry, platform) in listed.iter().zip(platforms) {
            assert_eq!(entry["digest"], platform["digest"], "{top}");
            assert_eq!(entry["platform"], platform["platform"], "{top}");
        }
        platforms
            .iter()
            .map(|p| {
                registry
                    .manifest(repository, p["digest"].as_str().unwrap())
                    .unwrap()
            })
            .collect()
    };
    for image in images {
        let mut blobs = vec![image["config"]["digest"].as_str().unwrap().to_owned()];
        for layer in image["layers"].as_array().unwrap() {
            blobs.push(layer["digest"].as_str().unwrap().to_owned());
        }
        for digest in blobs {
            let (status, body) = registry
                .get(&format!("/v2/{repository}/blobs/{digest}"))
                .unwrap();
            assert_eq!(status, 200, "blob {digest}");
            let got = hex(ring::digest::digest(&ring::digest::SHA256, &body).as_ref());
            assert_eq!(format!("sha256:{got}"), digest, "the blob's bytes");
        }
    }
    top
}

#[test]
fn an_archive_of_one_image_of_platforms_side_by_side_or_of_an_index_arrives_whole() {
    let test = "an_archive_of_one_image_of_platforms_side_by_side_or_of_an_index_arrives_whole";
    if !require(test) {
        return;
    }
    let registry = Registry::start(loopback(), None).unwrap_or_else(|e| panic!("{e:#}"));

    // One image: the tag names its manifest, by the archive's digest.
    let layout = Layout::new();
    let amd64 = layout.image("amd64");
    let archive = layout.archive(vec![amd64.clone()]);
    let pushed = registry.push(&archive, "test/one:1").unwrap();
    assert_eq!(
        pushed,
        format!(
            "{}/test/one@{}",
            registry.host,
            amd64["digest"].as_str().unwrap()
        )
    );
    check_served(&registry, "test/one", "1", &[&amd64]);

    // Two platforms side by side in index.json: one image index under the tag.
    let layout = Layout::new();
    let (amd64, arm64) = (layout.image("amd64"), layout.image("arm64"));
    let archive = layout.archive(vec![amd64.clone(), arm64.clone()]);
    registry.push(&archive, "test/side-by-side:1").unwrap();
    check_served(&registry, "test/side-by-side", "1", &[&amd64, &arm64]);
    // What a node of this machine's platform fetches, found through the index.
    let pulled = registry.pulled_blobs("test/side-by-side", "1").unwrap();
    let ours = if registry::oci_architecture() == "arm64" {
        &arm64
    } else {
        &amd64
    };
    let ours = registry
        .manifest("test/side-by-side", ours["digest"].as_str().unwrap())
        .unwrap();
    assert_eq!(pulled[0], ours["config"]["digest"].as_str().unwrap());

    // One image index (buildah's `manifest push --all` shape): pushed as it is, its digest
    // kept.
    let layout = Layout::new();
    let (amd64, arm64) = (layout.image("amd64"), layout.image("arm64"));
    let nested = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [amd64, arm64]});
    let nested = layout.blob(INDEX, nested.to_string().as_bytes());
    let archive = layout.archive(vec![nested.clone()]);
    let pushed = registry.push(&archive, "test/index:1").unwrap();
    assert_eq!(
        pushed,
        format!(
            "{}/test/index@{}",
            registry.host,
            nested["digest"].as_str().unwrap()
        )
    );
    check_served(&registry, "test/index", "1", &[&amd64, &arm64]);

    // Every push came from here: the access log has them, from loopback.
    let requests = registry.requests();
    assert!(
        requests.iter().any(|r| r.method == "PUT"
            && r.path == "/v2/test/index/manifests/1"
            && r.status == 201),
        "{requests:#?}"
    );
    assert!(requests.iter().all(|r| r.client == loopback()));
}

#[test]
fn a_push_is_refused_with_a_reason_when_the_registry_is_unverified_or_unnamed() {
    let test = "a_push_is_refused_with_a_reason_when_the_registry_is_unverified_or_unnamed";
    if !require(test) {
        return;
    }
    let registry = Registry::start(loopback(), None).unwrap_or_else(|e| panic!("{e:#}"));
    let layout = Layout::new();
    let archive = layout.archive(vec![layout.image("amd64")]);
    let run = |args: &[&str]| {
        let out = Command::new(push_image())
            .arg(&archive)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // Without the registry's CA: TLS is verified, so the push fails, saying why, and nothing
    // reached the registry's API.
    let (code, stderr) = run(&[&registry.image("test/unverified:1")]);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("certificate"), "{stderr}");
    assert!(
        registry
            .requests()
            .iter()
            .all(|r| !r.path.starts_with("/v2/test/unverified")),
        "{:#?}",
        registry.requests()
    );

    // A reference with no registry host (skopeo would go to docker.io) or no tag, a missing
    // archive, and an unknown option: refused before anything is sent.
    let cert_dir = registry.cert_dir.to_string_lossy().into_owned();
    for (args, code, reason) in [
        (
            vec!["bridgehead/bridgehead:1"],
            64,
            "names no registry host",
        ),
        (vec!["bridgehead:1"], 64, "names no registry host"),
        (vec![&registry.image("test/untagged")[..]], 64, "has no tag"),
        (
            vec!["--insecure", &registry.image("test/x:1")[..]],
            64,
            "unknown option",
        ),
    ] {
        let mut args = args;
        args.extend(["--cert-dir", &cert_dir]);
        let (got, stderr) = run(&args);
        assert_eq!(got, Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
    }
    let out = Command::new(push_image())
        .arg(Path::new("/nonexistent/image.oci.tar"))
        .arg(registry.image("test/x:1"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(66), "{out:?}");
}
