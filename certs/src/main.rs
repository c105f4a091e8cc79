//! `bridgehead-certs`: writes a fresh Bridgehead PKI into a directory (`init`) or a node's own
//! agent certificate from its cluster CA (`agent`), and says which flag takes each file.

use std::path::PathBuf;
use std::process::ExitCode;

use bridgehead_certs::{CertError, ClusterCa, Pki};
use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand};

/// Exit status for a usage error (EX_USAGE).
const EXIT_USAGE: u8 = 64;

/// Makes the Bridgehead PKI: a frontend CA with the certificates of bridgehead-server's CONNECT
/// frontend and its clients (kube-apiserver, curl), and a cluster CA with those of the agent
/// endpoint and the agents. Every key is ECDSA P-256.
#[derive(Debug, Parser)]
#[command(name = "bridgehead-certs", version = bridgehead_build_info::VERSION_AND_COMMIT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write new frontend and cluster CAs and the server, client, cluster and agent
    /// certificates and keys into a directory.
    Init(InitArgs),
    /// Sign a node's own agent certificate (CN and SANs its name and addresses) with the
    /// cluster CA of a directory `init` wrote.
    Agent(AgentArgs),
}

#[derive(Debug, Args)]
struct InitArgs {
    /// Directory to write frontend-ca.*, server.*, client.*, cluster-ca.*, cluster.* and agent.*
    /// into; created with mode 0700 if missing.
    #[arg(long, env = "BRIDGEHEAD_DIR", value_name = "DIR")]
    dir: PathBuf,

    /// Extra DNS name or IP address for the server and cluster certificates, besides localhost,
    /// 127.0.0.1 and ::1. Repeat the flag, or separate names with commas.
    #[arg(
        long = "san",
        env = "BRIDGEHEAD_SAN",
        value_name = "NAME_OR_IP",
        value_delimiter = ','
    )]
    sans: Vec<String>,

    /// Replace files that already exist in DIR (by default nothing is written if one does, or
    /// if DIR holds an old one-CA PKI).
    #[arg(long, env = "BRIDGEHEAD_FORCE")]
    force: bool,
}

#[derive(Debug, Args)]
struct AgentArgs {
    /// Directory `init` wrote: cluster-ca.crt and cluster-ca.key are read from it.
    #[arg(long, env = "BRIDGEHEAD_DIR", value_name = "DIR")]
    dir: PathBuf,

    /// The node's name (a DNS name): the certificate's CN and first SAN, the `host` the agent
    /// may announce under the server's --bind-agent-identifiers.
    #[arg(long, env = "BRIDGEHEAD_NODE", value_name = "NAME")]
    node: String,

    /// The node's IP address (or another DNS name), a SAN the agent may announce as `ipv4`,
    /// `ipv6` (or `host`). Repeat the flag, or separate addresses with commas.
    #[arg(
        long = "address",
        env = "BRIDGEHEAD_ADDRESS",
        value_name = "IP_OR_NAME",
        value_delimiter = ','
    )]
    addresses: Vec<String>,

    /// Directory to write agent-NAME.crt and agent-NAME.key into (default DIR); created with
    /// mode 0700 if missing.
    #[arg(long, env = "BRIDGEHEAD_OUT", value_name = "DIR")]
    out: Option<PathBuf>,

    /// Replace agent-NAME.crt and agent-NAME.key if they exist.
    #[arg(long, env = "BRIDGEHEAD_FORCE")]
    force: bool,
}

/// For each group of files `init` writes, what takes it; printed after the paths written.
const USES: [(&[&str], &str); 9] = [
    (
        &["frontend-ca.crt"],
        "frontend CA: bridgehead-server --server-ca-cert, to verify CONNECT clients; caBundle in \
         kube-apiserver's EgressSelectorConfiguration and curl --proxy-cacert, to verify the \
         frontend",
    ),
    (
        &["frontend-ca.key"],
        "frontend CA private key: no component reads it; keep it off the cluster",
    ),
    (
        &["server.crt", "server.key"],
        "bridgehead-server --server-cert/--server-key: the CONNECT frontend",
    ),
    (
        &["client.crt", "client.key"],
        "kube-apiserver clientCert/clientKey; curl --proxy-cert/--proxy-key",
    ),
    (
        &["cluster-ca.crt"],
        "cluster CA: bridgehead-server --cluster-ca-cert, to verify agents; bridgehead-agent \
         --ca-cert, to verify the agent endpoint",
    ),
    (
        &["cluster-ca.key"],
        "cluster CA private key: no component reads it; keep it off the cluster; bridgehead-certs \
         agent signs per-node agent certificates with it",
    ),
    (
        &["cluster.crt", "cluster.key"],
        "bridgehead-server --cluster-cert/--cluster-key: the agent endpoint",
    ),
    (
        &["agent.crt", "agent.key"],
        "bridgehead-agent --agent-cert/--agent-key, shared by every node; bridgehead-certs agent \
         makes one per node",
    ),
    (
        &["peer.crt", "peer.key"],
        "bridgehead-server --peer-cert/--peer-key (and --peer-ca-cert frontend-ca.crt): servers \
         that forward tunnels to each other",
    ),
];

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err)
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) =>
        {
            err.exit()
        }
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = match &cli.command {
        Command::Init(args) => init(args),
        Command::Agent(args) => agent(args),
    };
    match result {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            let (hint, code) = match (&cli.command, &err) {
                (Command::Init(_), CertError::Exists(_)) => {
                    (" (pass --force to replace the PKI)", ExitCode::FAILURE)
                }
                (Command::Agent(_), CertError::Exists(_)) => {
                    (" (pass --force to replace it)", ExitCode::FAILURE)
                }
                (Command::Agent(_), CertError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    (
                        " (make the PKI with `bridgehead-certs init` first)",
                        ExitCode::FAILURE,
                    )
                }
                (_, CertError::InvalidSan { .. } | CertError::InvalidNodeName { .. }) => {
                    ("", ExitCode::from(EXIT_USAGE))
                }
                _ => ("", ExitCode::FAILURE),
            };
            eprintln!("bridgehead-certs: {:#}{hint}", anyhow::Error::from(err));
            code
        }
    }
}

/// Writes a new PKI; one line per group of files written.
fn init(args: &InitArgs) -> Result<Vec<String>, CertError> {
    let written = Pki::generate(&args.sans)?.write_dir(&args.dir, args.force)?;
    Ok(report(&written))
}

/// Writes node `--node`'s agent certificate; one line naming the files and what takes them.
fn agent(args: &AgentArgs) -> Result<Vec<String>, CertError> {
    ClusterCa::check_agent(&args.node, &args.addresses)?;
    let out = args.out.as_deref().unwrap_or(&args.dir);
    let written =
        ClusterCa::load(&args.dir)?.write_agent(out, &args.node, &args.addresses, args.force)?;
    let sans = std::iter::once(&args.node)
        .chain(&args.addresses)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    let uses = format!(
        "bridgehead-agent --agent-cert/--agent-key on node {}; SANs {sans}: what the server's \
         --bind-agent-identifiers lets it announce as host, ipv4 and ipv6",
        args.node
    );
    Ok(vec![format!("wrote {}  ({uses})", paths(&written))])
}

/// One line per group of files written: `wrote /dir/server.crt, server.key  (what takes them)`.
fn report(written: &[PathBuf]) -> Vec<String> {
    USES.iter()
        .filter_map(|(names, uses)| {
            let group = names
                .iter()
                .filter_map(|name| {
                    written
                        .iter()
                        .find(|path| path.file_name().is_some_and(|file| file == *name))
                        .cloned()
                })
                .collect::<Vec<_>>();
            (!group.is_empty()).then(|| format!("wrote {}  ({uses})", paths(&group)))
        })
        .collect()
}

/// `/dir/a.crt, a.key`: the first path in full, the others by file name.
fn paths(paths: &[PathBuf]) -> String {
    let mut paths = paths.iter();
    let first = paths.next().map(|path| path.display().to_string());
    let others = paths
        .filter_map(|path| path.file_name())
        .map(|file| format!(", {}", file.to_string_lossy()));
    first.into_iter().chain(others).collect()
}
