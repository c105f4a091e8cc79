//! kube-scheduler and kube-controller-manager beside kube-apiserver, in its namespace, with the
//! admin kubeconfig: DaemonSets get their pods, pods a node, namespaces their ServiceAccount
//! and `kube-root-ca.crt`, as in a real cluster.

use std::process::Command;

use super::ControlPlane;
use crate::netns::TestNet;
use crate::process::Process;

/// The two controllers, running. Killed on drop.
#[derive(Debug)]
pub struct Controllers {
    pub scheduler: Process,
    pub controller_manager: Process,
}

impl Controllers {
    /// Starts both on host `host` of `net`, where `control_plane` runs.
    pub fn start(
        control_plane: &ControlPlane,
        net: &TestNet,
        host: usize,
    ) -> anyhow::Result<Controllers> {
        let ns = net.host(host).ns_name();
        let dir = control_plane.dir();
        let kubeconfig = format!("--kubeconfig={}", control_plane.kubeconfig.display());
        let mut scheduler = Command::new("ip");
        scheduler
            .args(["netns", "exec", ns])
            .arg(&control_plane.binaries.kube_scheduler)
            .arg(&kubeconfig)
            .args(["--leader-elect=false", "--bind-address=127.0.0.1"]);
        let (scheduler, _) = Process::spawn(scheduler, &[])?;
        let mut controller_manager = Command::new("ip");
        controller_manager
            .args(["netns", "exec", ns])
            .arg(&control_plane.binaries.kube_controller_manager)
            .arg(&kubeconfig)
            .arg(format!("--root-ca-file={}", control_plane.ca.display()))
            .arg(format!(
                "--service-account-private-key-file={}",
                dir.join("sa.key").display()
            ))
            .args([
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--use-service-account-credentials=false",
                // The test's nodes make their pod networks themselves (CNI bridge per node).
                "--allocate-node-cidrs=false",
            ]);
        let (controller_manager, _) = Process::spawn(controller_manager, &[])?;
        Ok(Controllers {
            scheduler,
            controller_manager,
        })
    }
}
