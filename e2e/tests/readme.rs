//! docs/flags.md's tables are the operator's reference: every long flag a binary's `--help`
//! lists is in a table row (its own table, or the konnectivity-compatibility and logging
//! tables), and each binary's own table names no flag the binary does not take. The README
//! sends an operator there, and to the install before the flags.

use std::collections::BTreeSet;
use std::process::Command;

use bridgehead_e2e::process::binary;

fn flags_page() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/flags.md")).unwrap()
}

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap()
}

/// The long flags `binary --help` lists (`--help` itself aside).
fn help_flags(name: &str) -> BTreeSet<String> {
    let output = Command::new(binary(name).unwrap())
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("-v, ").unwrap_or(line);
            let flag = line.strip_prefix("--")?;
            let end = flag.find([' ', '=', '<', '[']).unwrap_or(flag.len());
            Some(format!("--{}", &flag[..end]))
        })
        .filter(|flag| flag != "--help" && flag != "--version")
        .collect()
}

/// The flags named in the first column of the table rows of `text`.
fn table_flags(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| line.starts_with("| "))
        .filter_map(|line| line.split('|').nth(1))
        .flat_map(|cell| {
            cell.split('`')
                .filter(|word| word.starts_with("--") && word.len() > 2)
                .map(|word| word.split(['=', ' ']).next().unwrap_or(word).to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The section of `text` that starts with the heading `title`, up to the next heading of the
/// same or a higher level.
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text
        .find(title)
        .unwrap_or_else(|| panic!("{title} in docs/flags.md"));
    let rest = &text[start + title.len()..];
    let end = rest
        .find("\n## ")
        .into_iter()
        .chain(rest.find("\n### "))
        .min();
    &rest[..end.unwrap_or(rest.len())]
}

#[test]
fn the_flag_tables_match_each_binarys_help() {
    let page = flags_page();
    let documented = table_flags(&page);
    for (name, heading) in [
        ("bridgehead-server", "### bridgehead-server"),
        ("bridgehead-agent", "### bridgehead-agent"),
    ] {
        let takes = help_flags(name);
        assert!(takes.len() > 20, "{name}: {takes:?}");
        let missing: Vec<_> = takes.difference(&documented).collect();
        assert!(
            missing.is_empty(),
            "{name} takes flags docs/flags.md's tables do not list: {missing:?}"
        );
        let own = table_flags(section(&page, heading));
        let stale: Vec<_> = own.difference(&takes).collect();
        assert!(
            stale.is_empty(),
            "docs/flags.md's {name} table lists flags it does not take: {stale:?}"
        );
    }
}

/// An operator's first screen: what it is and why (a measured table), then Install with the
/// `helm install` and `kubectl apply -k` lines, before any developer command; no flag table.
#[test]
fn the_readme_opens_with_why_and_install() {
    let readme = readme();
    let install = readme.find("\n## Install\n").expect("an Install section");
    let why = readme.find("| konnectivity |").expect("the measured table");
    assert!(why < install, "the measured table comes before Install");
    let helm = readme
        .find("helm install bridgehead charts/bridgehead")
        .expect("helm install");
    let kustomize = readme
        .find("kubectl apply -k deploy/")
        .expect("kubectl apply -k");
    let developer = readme
        .find("scripts/quickstart.sh")
        .expect("the quickstart");
    assert!(
        install < helm && install < kustomize,
        "the install lines are under Install"
    );
    assert!(
        helm < developer && kustomize < developer,
        "install before developer commands"
    );
    assert!(
        table_flags(&readme).is_empty(),
        "the flag tables live in docs/flags.md, not the README"
    );
}
