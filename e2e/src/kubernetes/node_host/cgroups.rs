//! A node's cgroups: its root made in every hierarchy before kubelet starts, and everything
//! under it removed once the node's processes are gone.

use std::path::Path;

use anyhow::Context;

use super::TEARDOWN;
use crate::process::wait_until;

/// A node's cgroup root in every hierarchy, and everything kubelet and runc make under it;
/// removed on drop.
#[derive(Debug)]
pub(super) struct Cgroups {
    pub(super) root: String,
}

impl Cgroups {
    /// Makes the root in every hierarchy (kubelet requires its `cgroupRoot` to exist); a cpuset
    /// cgroup starts with the machine's CPUs and memory nodes, which its children inherit.
    pub(super) fn make(root: &str) -> anyhow::Result<Cgroups> {
        let cgroups = Cgroups {
            root: root.to_owned(),
        };
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
            let dir = hierarchy.path().join(root);
            std::fs::create_dir(&dir)
                .with_context(|| format!("creating cgroup {}", dir.display()))?;
            if hierarchy.file_name() == "cpuset" {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let value = std::fs::read_to_string(hierarchy.path().join(file))?;
                    std::fs::write(dir.join(file), value)?;
                }
            }
        }
        Ok(cgroups)
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        // A cgroup can be removed once the kernel has ended its last process.
        let _ = wait_until(TEARDOWN, || remove_cgroups(&self.root));
    }
}

/// Removes every cgroup under `/sys/fs/cgroup/<hierarchy>/<root>`, deepest first; true when
/// none is left.
fn remove_cgroups(root: &str) -> bool {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return true;
    };
    let mut clean = true;
    for hierarchy in hierarchies.flatten() {
        let top = hierarchy.path().join(root);
        if top.exists() && !remove_tree(&top) {
            clean = false;
        }
    }
    clean
}

fn remove_tree(dir: &Path) -> bool {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    std::fs::remove_dir(dir).is_ok()
}
