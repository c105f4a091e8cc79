//! The server and the agent raise their open-files soft limit to the hard limit at startup,
//! as Go daemons do: each tunnel needs a descriptor in each of them.

use std::process::Command;

use bridgehead_e2e::process::{binary, Process};
use bridgehead_e2e::procfs::nofile_of;
use bridgehead_e2e::Pki;

#[test]
fn server_raises_a_low_open_files_limit_to_the_hard_limit() {
    let pki = Pki::new().unwrap();
    // Start it under a deliberately low soft limit.
    let mut command = Command::new("sh");
    command
        .args(["-c", "ulimit -Sn 256 && exec \"$0\" \"$@\""])
        .arg(binary("bridgehead-server").unwrap())
        .args([
            "--server-port",
            "0",
            "--agent-port",
            "0",
            "--health-port",
            "0",
        ])
        .args([
            "--server-bind-address",
            "127.0.0.1",
            "--agent-bind-address",
            "127.0.0.1",
        ])
        .args(["--health-bind-address", "127.0.0.1"])
        .arg("--server-cert")
        .arg(pki.path("server.crt"))
        .arg("--server-key")
        .arg(pki.path("server.key"))
        .arg("--server-ca-cert")
        .arg(pki.path("frontend-ca.crt"))
        .arg("--cluster-cert")
        .arg(pki.path("cluster.crt"))
        .arg("--cluster-key")
        .arg(pki.path("cluster.key"))
        .arg("--cluster-ca-cert")
        .arg(pki.path("cluster-ca.crt"));
    let (server, _) = Process::spawn(command, &["health"]).unwrap();
    let (soft, hard) = nofile_of(server.pid()).unwrap();
    assert_eq!(soft, hard, "soft limit not raised");
    assert_ne!(soft, "256");
}
