//! `bridgehead-certs`: writes a fresh Bridgehead PKI into a directory and says which flag takes
//! each file.

use std::path::PathBuf;
use std::process::ExitCode;

use bridgehead_certs::{CertError, Pki};
use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand};

/// Exit status for a usage error (EX_USAGE).
const EXIT_USAGE: u8 = 64;

/// Makes the Bridgehead PKI: a CA, and the certificates for bridgehead-server, bridgehead-agent
/// and kube-apiserver (or curl). Every key is ECDSA P-256.
#[derive(Debug, Parser)]
#[command(name = "bridgehead-certs", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a new CA and server, cluster, client and agent certificates and keys into a
    /// directory.
    Init(InitArgs),
}

#[derive(Debug, Args)]
struct InitArgs {
    /// Directory to write ca.crt, ca.key, server.*, cluster.*, client.* and agent.* into;
    /// created with mode 0700 if missing.
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

    /// Replace files that already exist in DIR (by default nothing is written if one does).
    #[arg(long, env = "BRIDGEHEAD_FORCE")]
    force: bool,
}

/// For each group of files, what takes it; printed after the paths written.
const USES: [(&[&str], &str); 6] = [
    (
        &["ca.crt"],
        "CA: --server-ca-cert and --cluster-ca-cert on bridgehead-server, --ca-cert on \
         bridgehead-agent, caBundle in kube-apiserver's EgressSelectorConfiguration, \
         curl --proxy-cacert",
    ),
    (
        &["ca.key"],
        "CA private key: no component reads it; keep it off the cluster",
    ),
    (
        &["server.crt", "server.key"],
        "bridgehead-server --server-cert/--server-key: the CONNECT frontend",
    ),
    (
        &["cluster.crt", "cluster.key"],
        "bridgehead-server --cluster-cert/--cluster-key: the agent endpoint",
    ),
    (
        &["client.crt", "client.key"],
        "kube-apiserver clientCert/clientKey; curl --proxy-cert/--proxy-key",
    ),
    (
        &["agent.crt", "agent.key"],
        "bridgehead-agent --agent-cert/--agent-key",
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
    let Command::Init(args) = cli.command;
    match init(&args) {
        Ok(written) => {
            for line in report(&written) {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            let (hint, code) = match err {
                CertError::Exists(_) => (" (pass --force to replace the PKI)", ExitCode::FAILURE),
                CertError::InvalidSan { .. } => ("", ExitCode::from(EXIT_USAGE)),
                _ => ("", ExitCode::FAILURE),
            };
            eprintln!("bridgehead-certs: {:#}{hint}", anyhow::Error::from(err));
            code
        }
    }
}

fn init(args: &InitArgs) -> Result<Vec<PathBuf>, CertError> {
    Pki::generate(&args.sans)?.write_dir(&args.dir, args.force)
}

/// One line per group of files written: `wrote /dir/server.crt, server.key  (what takes them)`.
fn report(written: &[PathBuf]) -> Vec<String> {
    USES.iter()
        .filter_map(|(names, uses)| {
            let mut paths = names.iter().filter_map(|name| {
                written
                    .iter()
                    .find(|path| path.file_name().is_some_and(|file| file == *name))
            });
            let first = paths.next()?;
            let others = paths
                .filter_map(|path| path.file_name())
                .map(|file| format!(", {}", file.to_string_lossy()))
                .collect::<String>();
            Some(format!("wrote {}{others}  ({uses})", first.display()))
        })
        .collect()
}
