//! A PKI made at test time: the CAs and every certificate `bridgehead-certs init` writes.

use std::path::{Path, PathBuf};

/// A fresh PKI on disk.
#[derive(Debug)]
pub struct Pki {
    dir: tempfile::TempDir,
    /// The same PKI in memory, to issue more certificates.
    pub pki: bridgehead_certs::Pki,
}

impl Pki {
    pub fn new() -> anyhow::Result<Pki> {
        Pki::with_sans(&[])
    }

    /// A PKI whose server certificates also name `sans` (addresses the frontend or the agent
    /// endpoint are reached at besides loopback).
    pub fn with_sans(sans: &[String]) -> anyhow::Result<Pki> {
        let pki = bridgehead_certs::Pki::generate(sans)?;
        let dir = tempfile::tempdir()?;
        pki.write_dir(dir.path(), true)?;
        Ok(Pki { dir, pki })
    }

    /// `frontend-ca.crt`, `cluster-ca.crt`, `client.key`, ... in the PKI directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
