//! Process limits a tunnel server needs raised.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as Go programs (kube-apiserver, ANP) do
/// at startup: every tunnel holds a descriptor in the server and one in the agent, and the
/// usual soft limit of 1024 would cap a process near a thousand tunnels. Returns the soft
/// limit in force afterwards (`None`: unlimited).
pub fn raise_nofile() -> Option<u64> {
    let now = getrlimit(Resource::Nofile);
    if now.current == now.maximum {
        return now.current;
    }
    let raised = Rlimit {
        current: now.maximum,
        maximum: now.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => now.maximum,
        Err(error) => {
            tracing::warn!(%error, "could not raise the open-files limit");
            now.current
        }
    }
}
