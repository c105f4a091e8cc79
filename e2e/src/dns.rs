//! A real resolver for test hosts: dnsmasq (Debian's dnsmasq-base) inside one host's
//! namespace, answering one name with a record per address, told of new records by SIGHUP as
//! an operator's DNS would be (a headless Service's records follow its pods the same way).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::netns::TestNet;
use crate::process::wait_until;

/// How long dnsmasq may take to answer its first query, or the records after a reload.
const ANSWER: Duration = Duration::from_secs(10);

/// dnsmasq, answering [`Resolver::name`]; killed when dropped.
#[derive(Debug)]
pub struct Resolver {
    child: Child,
    records: PathBuf,
    _dir: tempfile::TempDir,
    name: String,
}

impl Resolver {
    /// Whether dnsmasq is installed.
    pub fn available() -> bool {
        Command::new("dnsmasq").arg("--version").output().is_ok()
    }

    /// Starts dnsmasq in `net`'s host `host`, listening on `listen` there, answering `name`
    /// with `addresses`, nothing else (no upstream, no /etc/hosts).
    pub fn start(
        net: &TestNet,
        host: usize,
        listen: Ipv4Addr,
        name: &str,
        addresses: &[Ipv4Addr],
    ) -> anyhow::Result<Resolver> {
        let dir = tempfile::tempdir()?;
        let records = dir.path().join("records.hosts");
        write(&records, name, addresses)?;
        let child = Command::new("ip")
            .args(["netns", "exec", net.host(host).ns_name(), "dnsmasq"])
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--user=root",
                "--pid-file",
                "--log-facility=-",
            ])
            .arg(format!("--listen-address={listen}"))
            .arg(format!("--addn-hosts={}", records.display()))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting dnsmasq")?;
        Ok(Resolver {
            child,
            records,
            _dir: dir,
            name: name.to_owned(),
        })
    }

    /// The name it answers.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Answers the name with `addresses` from now on (the records rewritten, dnsmasq told).
    pub fn set(&self, addresses: &[Ipv4Addr]) -> anyhow::Result<()> {
        write(&self.records, &self.name, addresses)?;
        let reload = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()?;
        anyhow::ensure!(reload.success(), "kill -HUP dnsmasq failed");
        Ok(())
    }

    /// Waits until the name resolves to exactly `addresses` in host `host` of `net`.
    pub fn wait_answer(
        &self,
        net: &TestNet,
        host: usize,
        addresses: &[Ipv4Addr],
    ) -> anyhow::Result<()> {
        let mut wanted: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        wanted.sort();
        wait_until(ANSWER, || {
            net.run_in(host, &["getent", "ahostsv4", &self.name])
                .is_ok_and(|out| {
                    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
                        .collect();
                    got.sort();
                    got.dedup();
                    got == wanted
                })
        })
        .with_context(|| format!("{} never resolved to {wanted:?}", self.name))
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write(records: &std::path::Path, name: &str, addresses: &[Ipv4Addr]) -> anyhow::Result<()> {
    let lines: String = addresses.iter().map(|a| format!("{a} {name}\n")).collect();
    std::fs::write(records, lines).with_context(|| format!("writing {}", records.display()))
}
