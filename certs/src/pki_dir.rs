//! A PKI on disk: PEM files in one directory, keys readable by their owner only.

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::CertError;

/// Mode of a directory this module creates.
const DIR_MODE: u32 = 0o700;
/// Mode of a certificate file.
const CERT_MODE: u32 = 0o644;
/// Mode of a private key file.
const KEY_MODE: u32 = 0o600;

/// One file to write: its name inside the directory, its contents and its mode.
#[derive(Debug)]
pub(crate) struct PkiFile<'a> {
    name: String,
    contents: &'a str,
    mode: u32,
}

impl<'a> PkiFile<'a> {
    pub(crate) fn certificate(name: String, contents: &'a str) -> Self {
        PkiFile {
            name,
            contents,
            mode: CERT_MODE,
        }
    }

    pub(crate) fn private_key(name: String, contents: &'a str) -> Self {
        PkiFile {
            name,
            contents,
            mode: KEY_MODE,
        }
    }
}

/// Writes `files` into `dir` (created with mode 0700 if missing) and returns their paths.
///
/// Unless `force`, fails with [`CertError::Exists`] before writing anything if one of them is
/// already there. With `force`, an existing file (or symlink) is removed and written anew, so
/// the new file never inherits a looser mode or writes through a link.
pub(crate) fn write(
    dir: &Path,
    files: &[PkiFile<'_>],
    force: bool,
) -> Result<Vec<PathBuf>, CertError> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|source| io_error("create directory", dir, source))?;

    if !force {
        for file in files {
            let path = dir.join(&file.name);
            match fs::symlink_metadata(&path) {
                Ok(_) => return Err(CertError::Exists(path)),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(io_error("inspect", &path, source)),
            }
        }
    }

    files
        .iter()
        .map(|file| {
            let path = dir.join(&file.name);
            if force {
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                    Err(source) => return Err(io_error("replace", &path, source)),
                }
            }
            write_new(&path, file.contents, file.mode)?;
            Ok(path)
        })
        .collect()
}

/// Creates `path`, which must not exist, with exactly `mode` whatever the umask, and writes
/// `contents`.
fn write_new(path: &Path, contents: &str, mode: u32) -> Result<(), CertError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| match source.kind() {
            io::ErrorKind::AlreadyExists => CertError::Exists(path.to_owned()),
            _ => io_error("create", path, source),
        })?;
    file.set_permissions(Permissions::from_mode(mode))
        .and_then(|()| file.write_all(contents.as_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(|source| io_error("write", path, source))
}

fn io_error(action: &'static str, path: &Path, source: io::Error) -> CertError {
    CertError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}
