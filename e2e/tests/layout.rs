//! The server's folders are its parts, and a part uses only the parts below it: the order is
//! the line of docs/architecture.md that starts with [`ORDER_LINE`], and every `crate::` and
//! `super::` path in `server/src` (tests aside) is checked against it. The crate's root
//! modules are the composition every part may read (`context`'s shared state, `config`'s
//! validated flags); what they are built from must never use them back, so no file of the
//! server sits in an import circle through them either.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// How the line of docs/architecture.md that lists the folders, top first, starts.
const ORDER_LINE: &str = "Folders of `server/src`, each using only those after it:";

/// The root modules every part may use: the composition of the parts.
const COMPOSITION: [&str; 2] = ["context", "config"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// A module path (`["routing", "registry", "peers"]`) for each non-test source file of
/// `server/src`, lib.rs and main.rs aside.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<Vec<String>, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "tests" {
                    let mut inner = prefix.to_vec();
                    inner.push(name);
                    walk(&path, &inner, out);
                }
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let skipped = ["tests", "test_util"].contains(&stem)
                    || (prefix.is_empty() && ["lib", "main"].contains(&stem));
                if !skipped {
                    let mut module = prefix.to_vec();
                    module.push(stem.to_owned());
                    out.insert(module, path);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &[], &mut out);
    out
}

/// The code of a source file without comments and without its `#[cfg(test)] mod tests { .. }`.
fn code(text: &str) -> String {
    let mut kept = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed == "#[cfg(test)]" {
            match lines.peek().map(|next| next.trim()) {
                Some(next) if next.starts_with("mod ") && next.ends_with('{') => break,
                _ => continue,
            }
        }
        if !trimmed.starts_with("//") {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// Every path that starts with `start` (`crate::` or `super::`) in `code`, groups
/// (`crate::{a::b, c}`) expanded, as its segments after `start`.
fn paths(code: &str, start: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(start) {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + start.len()..];
        rest = after;
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            rest = read_path(after, Vec::new(), &mut found);
        }
    }
    found
}

/// Reads one path (or group of paths) at the start of `text`, each found one pushed onto
/// `out` after `prefix`; returns what follows it.
fn read_path<'a>(
    mut text: &'a str,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> &'a str {
    loop {
        text = text.trim_start();
        if let Some(group) = text.strip_prefix('{') {
            text = group;
            loop {
                text = read_path(text, prefix.clone(), out).trim_start();
                if let Some(next) = text.strip_prefix(',') {
                    text = next;
                    if let Some(end) = text.trim_start().strip_prefix('}') {
                        return end;
                    }
                } else {
                    return text.strip_prefix('}').unwrap_or(text);
                }
            }
        }
        let end = text
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(text.len());
        if end > 0 {
            prefix.push(text[..end].to_owned());
        }
        text = &text[end..];
        match text.strip_prefix("::") {
            Some(next) => text = next,
            None => {
                if !prefix.is_empty() {
                    out.push(prefix);
                }
                return text;
            }
        }
    }
}

/// The modules `module`'s file uses: each path resolved to the longest module path of `all`
/// it starts with.
fn uses(
    module: &[String],
    file: &Path,
    all: &BTreeMap<Vec<String>, PathBuf>,
) -> BTreeSet<Vec<String>> {
    let code = code(&std::fs::read_to_string(file).unwrap());
    let mut absolute = paths(&code, "crate::");
    for relative in paths(&code, "super::") {
        let mut path = module[..module.len() - 1].to_vec();
        let mut segments = relative.as_slice();
        while segments.first().is_some_and(|s| s == "super") {
            path.pop();
            segments = &segments[1..];
        }
        path.extend(segments.iter().cloned());
        absolute.push(path);
    }
    absolute
        .into_iter()
        .filter_map(|path| {
            (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|prefix| all.contains_key(prefix))
        })
        .filter(|used| used != module)
        .collect()
}

/// The folders in the order docs/architecture.md gives.
fn documented_order() -> Vec<String> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let line = doc
        .lines()
        .find(|line| line.starts_with(ORDER_LINE))
        .unwrap_or_else(|| panic!("docs/architecture.md has no line starting {ORDER_LINE:?}"));
    line[ORDER_LINE.len()..]
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn each_server_folder_uses_only_the_folders_after_it() {
    let src = root().join("server/src");
    let all = modules(&src);
    let order = documented_order();
    let folders: BTreeSet<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        order.iter().cloned().collect::<BTreeSet<_>>(),
        folders,
        "docs/architecture.md's order names every folder of server/src, and only those"
    );
    let rank = |module: &[String]| order.iter().position(|folder| *folder == module[0]);
    let mut wrong = Vec::new();
    for (module, file) in &all {
        let Some(from) = rank(module) else { continue };
        for used in uses(module, file, &all) {
            if COMPOSITION.contains(&used[0].as_str()) {
                continue;
            }
            match rank(&used) {
                Some(to) if to < from => wrong.push(format!(
                    "{} uses {}, a folder before its own",
                    file.display(),
                    used.join("::")
                )),
                Some(_) => {}
                None => wrong.push(format!(
                    "{} uses {}, a root module that is not the composition",
                    file.display(),
                    used.join("::")
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "uses against the folders' order: {wrong:#?}"
    );
}

#[test]
fn nothing_the_composition_is_built_from_uses_it_back() {
    let src = root().join("server/src");
    let all = modules(&src);
    for composition in COMPOSITION {
        let start = vec![composition.to_owned()];
        let mut seen = BTreeSet::new();
        let mut next = vec![start.clone()];
        while let Some(module) = next.pop() {
            for used in uses(&module, &all[&module], &all) {
                assert!(
                    used != start,
                    "{composition} is built from {}, which uses {composition}: an import circle",
                    module.join("::")
                );
                if seen.insert(used.clone()) {
                    next.push(used);
                }
            }
        }
        assert!(seen.len() > 3, "{composition} uses {seen:?}");
    }
}

/// Paths as the check reads them: groups expanded, `super::` resolved, comments and the test
/// module left out.
#[test]
fn paths_are_read_as_the_compiler_reads_them() {
    let text = "use crate::{routing::router::{self, Target}, process::metrics};\n\
        // crate::peering in a comment\n\
        fn f(x: crate::agents::auth::AgentAuth) {}\n\
        #[cfg(test)]\nmod tests {\n    use crate::frontend::x;\n}\n";
    let code = code(text);
    let found: Vec<String> = paths(&code, "crate::")
        .into_iter()
        .map(|path| path.join("::"))
        .collect();
    assert_eq!(
        found,
        [
            "routing::router::self",
            "routing::router::Target",
            "process::metrics",
            "agents::auth::AgentAuth"
        ]
    );
    assert_eq!(paths("use super::super::a::B;", "super::").len(), 1);
    assert_eq!(paths("use bridgehead_crate::x;", "crate::").len(), 0);
}
