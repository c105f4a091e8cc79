//! The docs that walk a reader through the code name its files, and a reader follows those
//! names: every Rust file they cite exists. A path (`server/src/routing/router/lookup.rs`) is
//! taken from the repository's root, or as the end of a path when it starts below a crate
//! (`src/frontend.rs`); a bare name (`upgrade.rs`, where the text gives the crate) must be
//! some file's name. History names files that are gone on purpose: docs/benchmark-history.md
//! is not checked, and what docs/testing.md says is gone is listed in [`GONE`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The docs that describe the code as it is.
const CURRENT: [&str; 3] = ["docs/architecture.md", "docs/routing.md", "docs/testing.md"];

/// Files a doc names as gone (in its history of a change): each must really be gone.
const GONE: [(&str, &str); 1] = [("docs/testing.md", "session_state.rs")];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// Every `.rs` file below `dir`, as paths relative to the root (build output and fuzz
/// corpora left out).
fn rust_files(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && !["target", "corpus", "artifacts"].contains(&&*name) {
                rust_files(root, &path, out);
            }
        } else if name.ends_with(".rs") {
            let relative = path.strip_prefix(root).unwrap();
            out.insert(relative.to_string_lossy().into_owned());
        }
    }
}

/// The words of `text` that name a Rust file: letters, digits, `_`, `-`, `.` and `/` ending
/// in `.rs` (so `upgrade.rs::pre_auth` names `upgrade.rs`, and `https://mutants.rs` is not
/// one: it holds `:`).
fn cited(text: &str) -> BTreeSet<String> {
    let is_path = |c: char| c.is_ascii_alphanumeric() || "_-./:".contains(c);
    text.split(|c: char| !is_path(c))
        .flat_map(|word| word.split("::"))
        .filter(|word| !word.contains(':'))
        .filter_map(|word| {
            let word = word.trim_end_matches('.');
            let end = word.find(".rs")? + 3;
            (end == word.len()).then(|| word.to_owned())
        })
        .filter(|word| word.len() > 3)
        .collect()
}

/// Whether `name` is a file of `files`, or the end of one's path at a `/`.
fn exists(name: &str, files: &BTreeSet<String>) -> bool {
    let tail = format!("/{name}");
    files
        .iter()
        .any(|file| file == name || file.ends_with(&tail))
}

#[test]
fn every_rust_file_the_architecture_docs_cite_exists() {
    let root = root();
    let mut files = BTreeSet::new();
    rust_files(&root, &root, &mut files);
    assert!(
        files.contains("server/src/routing/registry.rs"),
        "{} files",
        files.len()
    );
    let mut missing = Vec::new();
    for doc in CURRENT {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let names = cited(&text);
        assert!(!names.is_empty(), "{doc} cites no file");
        for name in names {
            let gone = GONE.contains(&(doc, name.as_str()));
            assert!(
                !(gone && exists(&name, &files)),
                "{doc}: {name} is listed as gone but is there"
            );
            if !gone && !exists(&name, &files) {
                missing.push(format!("{doc}: {name}"));
            }
        }
    }
    assert!(missing.is_empty(), "cited but not there: {missing:#?}");
}

/// What counts as a citation: paths and bare names, a function after the name, the end of a
/// sentence; not a web address or a word that only contains `.rs`.
#[test]
fn citations_are_read_as_a_reader_reads_them() {
    let text = "the client's in `runtime/src/upgrade.rs` (and `upgrade.rs::pre_auth`), \
        see agent/src/dial.rs. [cargo-mutants](https://mutants.rs) reads .rsync files";
    assert_eq!(
        cited(text),
        BTreeSet::from([
            "runtime/src/upgrade.rs".to_owned(),
            "upgrade.rs".to_owned(),
            "agent/src/dial.rs".to_owned(),
        ])
    );
    let files = BTreeSet::from(["runtime/src/upgrade.rs".to_owned()]);
    assert!(exists("runtime/src/upgrade.rs", &files));
    assert!(exists("src/upgrade.rs", &files));
    assert!(exists("upgrade.rs", &files));
    assert!(!exists("agent/src/upgrade.rs", &files));
    assert!(!exists("grade.rs", &files));
}
