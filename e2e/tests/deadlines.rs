//! Every deadline of both binaries is named once, in `bridgehead_runtime::timeouts::DEADLINES`,
//! and what a reader and an operator see agrees with it: docs/architecture.md's Deadlines
//! table is that list row for row, each flag's default in `--help` is the listed one, and
//! every duration flag a binary takes is a listed deadline or one of the paces below.

use std::process::Command;

use bridgehead_e2e::process::binary;
use bridgehead_runtime::duration;
use bridgehead_runtime::timeouts::{Binary, Deadline, DEADLINES};

/// Duration flags that pace work rather than bound a wait (the module doc of
/// `runtime/src/timeouts.rs` says why they are not deadlines).
const PACES: [(&str, &str); 6] = [
    ("bridgehead-server", "--peer-sync-interval"),
    ("bridgehead-server", "--lease-duration"),
    ("bridgehead-server", "--token-review-cache-ttl"),
    ("bridgehead-server", "--frontend-keepalive-time"),
    ("bridgehead-agent", "--sync-interval"),
    ("bridgehead-agent", "--sync-interval-cap"),
];

const BINARIES: [(&str, Binary); 2] = [
    ("bridgehead-server", Binary::Server),
    ("bridgehead-agent", Binary::Agent),
];

fn keeps(binary: Binary, deadline: &Deadline) -> bool {
    deadline.binary == binary || deadline.binary == Binary::Both
}

/// `deadline` as a row of the Deadlines table.
fn row(deadline: &Deadline) -> String {
    format!(
        "| {} | {} | {} | {} |",
        deadline.what,
        deadline.binary.name(),
        deadline.source.name(),
        duration::format(deadline.default)
    )
}

/// The rows of the table under the heading `### Deadlines` of docs/architecture.md.
fn table_rows() -> Vec<String> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/architecture.md"
    ))
    .unwrap();
    let start = text
        .find("\n### Deadlines\n")
        .expect("docs/architecture.md has a Deadlines section");
    text[start..]
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(str::to_owned)
        .collect()
}

/// `binary --help`'s text.
fn help(name: &str) -> String {
    let output = Command::new(binary(name).unwrap())
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()
}

/// The flags of `help` that take a duration, each with its default (`None`: it has none).
fn duration_flags(help: &str) -> Vec<(String, Option<String>)> {
    let mut flags = Vec::new();
    for line in help.lines() {
        let line = line.trim();
        if line.starts_with("--") {
            let flag = line.split([' ', '=', '<']).next().unwrap_or(line);
            let takes_duration = line.ends_with("<DURATION>");
            flags.push((flag.to_owned(), None, takes_duration));
        } else if let Some(default) = line
            .strip_prefix("[default: ")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            if let Some(last) = flags.last_mut() {
                last.1 = Some(default.to_owned());
            }
        }
    }
    flags
        .into_iter()
        .filter(|(_, _, takes_duration)| *takes_duration)
        .map(|(flag, default, _)| (flag, default))
        .collect()
}

#[test]
fn the_architecture_docs_deadlines_table_is_the_list_row_for_row() {
    let expected: Vec<String> = DEADLINES.iter().map(row).collect();
    let rows = table_rows();
    assert!(
        rows == expected,
        "docs/architecture.md's Deadlines table differs from bridgehead_runtime::timeouts::DEADLINES; \
         its rows should read:\n{}\n\nthey read:\n{}",
        expected.join("\n"),
        rows.join("\n")
    );
}

#[test]
fn each_deadline_flag_defaults_in_help_to_the_listed_value() {
    for (name, binary) in BINARIES {
        let flags = duration_flags(&help(name));
        assert!(!flags.is_empty(), "{name} --help lists no duration flag");
        for deadline in DEADLINES.iter().filter(|d| keeps(binary, d)) {
            let Some((flag, times)) = deadline.source.flag() else {
                continue;
            };
            let default = flags
                .iter()
                .find(|(f, _)| f == flag)
                .unwrap_or_else(|| panic!("{name} --help has no {flag} <DURATION>"))
                .1
                .as_deref()
                .unwrap_or_else(|| panic!("{name} {flag} has no default"));
            let parsed = duration::parse(default).unwrap();
            assert_eq!(
                parsed * times,
                deadline.default,
                "{name} {flag} defaults to {default}, listed for {:?}",
                deadline.what
            );
        }
    }
}

#[test]
fn every_duration_flag_is_a_listed_deadline_or_a_pace() {
    for (name, binary) in BINARIES {
        for (flag, _) in duration_flags(&help(name)) {
            let listed = DEADLINES
                .iter()
                .filter(|d| keeps(binary, d))
                .any(|d| d.source.flag().is_some_and(|(f, _)| f == flag));
            let pace = PACES.contains(&(name, flag.as_str()));
            assert!(
                listed != pace,
                "{name} {flag}: {}",
                if listed {
                    "listed as a deadline and a pace"
                } else {
                    "a duration flag neither in bridgehead_runtime::timeouts::DEADLINES nor in PACES"
                }
            );
        }
    }
    for (name, flag) in PACES {
        assert!(
            duration_flags(&help(name)).iter().any(|(f, _)| f == flag),
            "{name} takes no {flag}: drop it from PACES"
        );
    }
}
