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
        let pki = bridgehead_certs::Pki::generate(&[])?;
        let dir = tempfile::tempdir()?;
        pki.write_dir(dir.path(), true)?;
        Ok(Pki { dir, pki })
    }

    /// `ca.crt`, `client.key`, ... in the PKI directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
