//! Facts about the host the process runs on.

/// The kernel's host name (in a pod: the pod name), if it is a usable identifier.
pub fn hostname() -> Option<String> {
    let usable = |name: &str| {
        let name = name.trim();
        (!name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic())).then(|| name.to_owned())
    };
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .and_then(|name| usable(&name))
        .or_else(|| {
            std::env::var("HOSTNAME")
                .ok()
                .and_then(|name| usable(&name))
        })
}
