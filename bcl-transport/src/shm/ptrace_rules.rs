//! Whether this host's ptrace rules let a rank read the memory of a sibling rank (single copy's
//! `process_vm_readv` is checked as a ptrace attach). Every rank of a host reads the same
//! kernel setting, so ranks launched alike (one user, the same capabilities) get the same
//! answer without an exchange: what a selector that every rank must agree on can use, where
//! the per-link probe's outcomes differ from rank to rank and arrive during setup.

/// `CAP_SYS_PTRACE`'s bit in the capability sets of `/proc/self/status`.
const CAP_SYS_PTRACE: u32 = 19;

/// Whether a process may read a sibling's memory here (ranks started by one launcher are
/// siblings, not each other's ancestors): Yama's `ptrace_scope` (absent or 0: the classic
/// same-user rule; 1: ancestors only, 2: administrators only, unless the reader holds
/// `CAP_SYS_PTRACE`; 3: never) and this process's effective capabilities. An unreadable or
/// unparsable setting counts as refusing.
pub fn sibling_reads_permitted() -> bool {
    let scope = match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => return false,
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    permits(scope.as_deref(), &status)
}

/// [`sibling_reads_permitted`] on the files' texts: `scope` is `ptrace_scope`'s (`None`: no
/// Yama), `status` is `/proc/self/status`.
fn permits(scope: Option<&str>, status: &str) -> bool {
    let Some(scope) = scope else {
        return true;
    };
    match scope.trim().parse::<u32>() {
        Ok(0) => true,
        Ok(1 | 2) => holds_ptrace_capability(status),
        _ => false,
    }
}

/// Whether the `CapEff:` line of `status` holds `CAP_SYS_PTRACE`.
fn holds_ptrace_capability(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

#[cfg(test)]
mod tests {
    use super::permits;

    const ROOT: &str = "Name:\tbcl\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n";
    const USER: &str = "Name:\tbcl\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n";
    /// Every capability but `CAP_SYS_PTRACE` (bit 19).
    const ALL_BUT_PTRACE: &str = "CapEff:\t000001fffff7ffff\n";

    #[test]
    fn yama_scopes_and_the_ptrace_capability_decide() {
        for status in [ROOT, USER, ALL_BUT_PTRACE, ""] {
            assert!(permits(None, status), "no Yama: {status:?}");
            assert!(permits(Some("0\n"), status), "scope 0: {status:?}");
            assert!(!permits(Some("3\n"), status), "scope 3: {status:?}");
        }
        for scope in ["1\n", "2\n", " 1 "] {
            assert!(permits(Some(scope), ROOT), "{scope:?} as root");
            assert!(!permits(Some(scope), USER), "{scope:?} as a user");
            assert!(
                !permits(Some(scope), ALL_BUT_PTRACE),
                "{scope:?} without the cap"
            );
            assert!(!permits(Some(scope), ""), "{scope:?} without a status");
        }
    }

    #[test]
    fn a_setting_that_does_not_parse_refuses() {
        for scope in ["", "one", "-1", "4294967296"] {
            assert!(!permits(Some(scope), ROOT), "{scope:?}");
        }
        assert!(!permits(Some("1"), "CapEff:\tzz\n"));
    }
}
