//! Every deadline of both binaries is named once, in `bridgehead_runtime::timeouts::DEADLINES`,
//! and what a reader and an operator see agrees with it: docs/architecture.md's Deadlines
//! table is that list row for row, each flag's default in `--help` is the listed one, every
//! duration flag a binary takes is a listed deadline or one of the paces below, and every
//! `Duration` constant of the binaries' code is a listed deadline or one of the constants
//! below that bound no wait.

use std::process::Command;

use bridgehead_e2e::process::binary;
use bridgehead_runtime::duration;
use bridgehead_runtime::timeouts::{Binary, Deadline, Source, DEADLINES};

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

/// Duration constants of the binaries' code that bound no wait on a peer, each with why; the
/// rest are deadlines and live in `runtime/src/timeouts.rs`, listed in `DEADLINES` (one line
/// each, a table: kept out of rustfmt's way as `DEADLINES` is).
#[rustfmt::skip]
const NOT_DEADLINES: [(&str, &str, &str); 22] = [
    ("agent/src/server_connection.rs", "MAX_RETRY_AFTER", "caps the wait a server's Retry-After asks for"),
    ("agent/src/servers.rs", "HEALTHY_SESSION", "how long a session must last to reset the backoff"),
    ("server/src/config.rs", "DEFAULT_DIAL_TIMEOUT", "--dial-timeout's default (a listed flag), taken for ANP's 0"),
    ("server/src/peering/accepted.rs", "VIEW_BATCH", "paces the view's lines"),
    ("server/src/agents/auth.rs", "UNCLAIMED_TTL", "how long an answer nobody came for is kept"),
    ("server/src/agents/auth.rs", "MAX_RETRY_AFTER", "caps the Retry-After this server asks for"),
    ("server/src/agents/auth.rs", "ANSWER_TIME", "an estimate in the Retry-After, not a wait"),
    ("server/src/agents/revocation.rs", "RECHECK", "paces the rechecks"),
    ("server/src/agents/revocation.rs", "GATHER", "paces the passes"),
    ("server/src/agents/admission/pace.rs", "WINDOW", "a window of samples"),
    ("server/src/process/tls_config.rs", "RELOAD_INTERVAL", "paces the reloads"),
    ("runtime/src/accept.rs", "BACKOFF", "paces accepting after an error"),
    ("kubeapi/src/leases.rs", "DEFAULT_DURATION", "a Lease's lifetime (--lease-duration)"),
    ("kubeapi/src/serviceaccount.rs", "DEFAULT_MAX_STALENESS", "how long a failing watch's state still decides"),
    ("kubeapi/src/serviceaccount.rs", "DEFAULT_KEY_REFRESH", "paces the key fetches"),
    ("kubeapi/src/serviceaccount.rs", "DEFAULT_MAX_KEY_AGE", "how long fetched keys are trusted"),
    ("kubeapi/src/serviceaccount/keys.rs", "MIN_REFETCH_INTERVAL", "paces the key fetches"),
    ("kubeapi/src/serviceaccount/liveness.rs", "TOMBSTONE_TTL", "how long a deleted object's UID is kept"),
    ("kubeapi/src/serviceaccount/verifier.rs", "KEY_RETRY", "paces the key fetches after a failure"),
    ("kubeapi/src/serviceaccount/verifier.rs", "STARTUP_REPORT", "when the startup line is written, waiting on nothing"),
    ("kubeapi/src/serviceaccount/watches.rs", "MIN_BACKOFF", "paces a failing watch's retries"),
    ("kubeapi/src/serviceaccount/watches.rs", "MAX_BACKOFF", "paces a failing watch's retries"),
];

/// Every `const NAME: Duration` of the shipping code under `dir` (tests left out: a file's
/// `#[cfg(test)] mod tests` and what follows it, and `tests.rs`), as (path from the root,
/// name).
fn duration_constants(root: &std::path::Path, dir: &str, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(dir))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let relative = format!("{dir}/{name}");
        if path.is_dir() {
            duration_constants(root, &relative, out);
            continue;
        }
        if !name.ends_with(".rs") || name == "tests.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let shipping = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        for line in shipping.lines() {
            let Some((_, rest)) = line.split_once("const ") else {
                continue;
            };
            let Some((constant, kind)) = rest.split_once(':') else {
                continue;
            };
            let kind = kind.split('=').next().unwrap_or("").trim();
            if kind == "Duration" || kind == "std::time::Duration" {
                out.push((relative.clone(), constant.trim().to_owned()));
            }
        }
    }
}

/// A deadline written as a constant outside `runtime/src/timeouts.rs` is one a reader asked
/// "where is this timeout?" does not find there: every `Duration` constant of the binaries'
/// code is listed in `DEADLINES` or is one of [`NOT_DEADLINES`], and every one of
/// `runtime/src/timeouts.rs` is listed.
#[test]
fn every_duration_constant_is_a_listed_deadline_or_no_deadline() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for dir in [
        "agent/src",
        "server/src",
        "runtime/src",
        "mux/src",
        "kubeapi/src",
    ] {
        duration_constants(&root, dir, &mut found);
    }
    let listed = |name: &str| {
        DEADLINES
            .iter()
            .any(|d| matches!(d.source, Source::Constant(constant) if constant == name))
    };
    for (path, name) in &found {
        let known = NOT_DEADLINES.iter().any(|(p, n, _)| p == path && n == name);
        if path == "runtime/src/timeouts.rs" {
            assert!(listed(name), "{path}: {name} is not in DEADLINES");
        } else {
            assert!(
                listed(name) || known,
                "{path}: {name} is a Duration constant outside runtime/src/timeouts.rs; a \
                 deadline goes there and into DEADLINES, anything else into NOT_DEADLINES \
                 with why"
            );
        }
    }
    for (path, name, _) in NOT_DEADLINES {
        assert!(
            found.iter().any(|(p, n)| p == path && n == name),
            "{path} has no constant {name}: drop it from NOT_DEADLINES"
        );
    }
}

/// `REQUEST_TIMEOUT` lives in `bridgehead_kubeapi` (the runtime crate, which holds
/// `DEADLINES`, does not use the Kubernetes client): its row gives the constant's value.
#[test]
fn the_kubernetes_clients_deadline_is_its_rows() {
    let row = DEADLINES
        .iter()
        .find(|d| d.source == Source::Constant("REQUEST_TIMEOUT"))
        .expect("REQUEST_TIMEOUT has a row");
    assert_eq!(row.default, bridgehead_kubeapi::REQUEST_TIMEOUT);
}
