//! Identity of the host this process runs on, as other ranks must see it.
//!
//! Two ranks are "on the same host" when they share the kernel boot id *and* the network
//! namespace: test hosts made from network namespaces then behave like separate machines.

/// A stable text that is equal for processes on the same host and network namespace.
pub fn host_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| hostname());
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{boot}/{netns}")
}

/// The host's name, for messages a person reads.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}
