//! The flags both binaries take with one meaning, each written once here (its name, its
//! environment variable, its default and its parser) and flattened into both command lines:
//! the log format, the worker and session threads, where the health and admin ports bind, and
//! the sessions' keepalive.
//!
//! Only the help is each binary's, since it speaks of that binary's side (the server's agents,
//! the agent's servers) and the flag tables in docs/flags.md quote it: a binary words a flag
//! with a [`Wording`], applied to its command by [`ProcessArgs::word`]. `--kubeconfig` and
//! `--lease-namespace` are shared as well but belong with the Kubernetes client, which this
//! crate does not use: they are `bridgehead_kubeapi::args::KubeArgs`, worded by the same
//! `Wording`s (the wording applies to every flag of the command).

use std::net::IpAddr;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Arg;

use crate::duration;
use crate::logging::LogFormat;
use crate::threads::SessionThreads;

/// The flags both binaries share. Each binary's help for them is its [`Wording`]s.
#[derive(Debug, Clone, clap::Args)]
pub struct ProcessArgs {
    /// Log line format.
    #[arg(
        long,
        env = "BRIDGEHEAD_LOG_FORMAT",
        default_value = "text",
        value_parser = PossibleValuesParser::new(["text", "json"])
            .try_map(|s| s.parse::<LogFormat>()),
    )]
    pub log_format: LogFormat,

    /// Worker threads: 0 = one per CPU the process may use (affinity, cgroup quota;
    /// single-threaded when that is one), 1 = single-threaded (lowest latency on small
    /// machines, one core for everything).
    #[arg(long, env = "BRIDGEHEAD_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    /// Threads of their own for the sessions and their tunnels; `auto` = one per worker
    /// thread (none with a single worker); 0 = none.
    #[arg(long, env = "BRIDGEHEAD_SESSION_THREADS", default_value = "auto", value_parser = SessionThreads::parse)]
    pub session_threads: SessionThreads,

    /// Address the health port binds.
    #[arg(
        long,
        env = "BRIDGEHEAD_HEALTH_BIND_ADDRESS",
        default_value = "0.0.0.0"
    )]
    pub health_bind_address: IpAddr,

    /// Address the admin port binds.
    #[arg(
        long,
        env = "BRIDGEHEAD_ADMIN_BIND_ADDRESS",
        default_value = "127.0.0.1"
    )]
    pub admin_bind_address: IpAddr,

    /// Interval between WebSocket pings; a session silent for three intervals is dead.
    #[arg(
        long,
        env = "BRIDGEHEAD_KEEPALIVE_TIME",
        default_value = "5s",
        value_parser = duration::parse,
        value_name = "DURATION"
    )]
    pub keepalive_time: Duration,
}

/// How one binary words a shared flag (named by its field, `log_format`): its help, and where
/// the binary differs, its value's name and an old name it answers to as well.
#[derive(Debug, Clone, Copy)]
pub struct Wording {
    pub id: &'static str,
    pub help: &'static str,
    pub value_name: Option<&'static str>,
    pub alias: Option<&'static str>,
}

impl Wording {
    /// A flag's help, nothing else changed.
    pub const fn help(id: &'static str, help: &'static str) -> Wording {
        Wording {
            id,
            help,
            value_name: None,
            alias: None,
        }
    }
}

impl ProcessArgs {
    /// `arg` as `wordings` word it, unchanged when none names it; for
    /// `#[command(mut_args = ...)]`, which keeps every flag where it is in `--help`.
    pub fn word(arg: Arg, wordings: &[Wording]) -> Arg {
        let Some(wording) = wordings.iter().find(|wording| arg.get_id() == wording.id) else {
            return arg;
        };
        let mut arg = arg.help(wording.help);
        if let Some(name) = wording.value_name {
            arg = arg.value_name(name);
        }
        if let Some(alias) = wording.alias {
            arg = arg.alias(alias);
        }
        arg
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    #[command(mut_args = |arg| ProcessArgs::word(arg, WORDS))]
    struct Cli {
        #[command(flatten)]
        process: ProcessArgs,
    }

    const WORDS: &[Wording] = &[
        Wording::help("log_format", "Log format: text or json"),
        Wording {
            id: "health_bind_address",
            help: "Address the health server binds",
            value_name: Some("IP"),
            alias: Some("health-server-host"),
        },
    ];

    #[test]
    fn a_wording_changes_only_its_flag() {
        let mut command = Cli::command();
        let help = command.render_help().to_string();
        assert!(help.contains("Log format: text or json"), "{help}");
        assert!(help.contains("--health-bind-address <IP>"), "{help}");
        assert!(help.contains("Address the admin port binds"), "{help}");
        let cli = Cli::try_parse_from(["x", "--health-server-host", "127.0.0.2"]).unwrap();
        assert_eq!(cli.process.health_bind_address.to_string(), "127.0.0.2");
        assert!(Cli::try_parse_from(["x", "--admin-server-host", "127.0.0.2"]).is_err());
    }
}
