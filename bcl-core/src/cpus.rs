//! How many cores this host's ranks share: what decides whether a waiting rank yields its
//! core (`comm/wait.rs`).
//!
//! `available_parallelism` counts the CPUs of this process's affinity mask. A launcher that
//! pins ranks (`mpirun --bind-to core`, OpenMPI's default for 2 ranks; `srun --cpu-bind`)
//! gives each rank a mask of its own, so that count says 1 where two ranks sit on two cores,
//! and a rank that yielded on that account paid a `sched_yield` (about 1 µs on this VM) in
//! every wait of every call: 2 ranks' 8 B allreduce over shm took 1.1-1.4 µs pinned against
//! 0.5 µs unpinned. A mask narrower than the parent's (the launcher's daemon, unpinned) is
//! read as pinned: the ranks then share the cores the launcher had. A container's cpuset
//! narrows the parent as well, so it still counts.

/// The CPUs the ranks of this host run on, for deciding whether they share cores: this
/// process's CPUs, or its parent's where the launcher pinned it to fewer.
pub(crate) fn for_ranks() -> usize {
    let parallelism = std::thread::available_parallelism().map_or(1, |n| n.get());
    let status = |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
    let mine = status("self").and_then(|s| allowed(&s));
    let parent = status(&std::os::unix::process::parent_id().to_string()).and_then(|s| allowed(&s));
    choose(parallelism, mine, parent)
}

/// [`for_ranks`] from what it read: `parallelism` (affinity and cgroup quota), the CPU
/// counts of this process's and its parent's masks where known.
fn choose(parallelism: usize, mine: Option<usize>, parent: Option<usize>) -> usize {
    match (mine, parent) {
        (Some(m), Some(p)) if m < p => p,
        _ => parallelism,
    }
}

/// The number of CPUs in a `/proc/PID/status` text's `Cpus_allowed_list`.
fn allowed(status: &str) -> Option<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    count_list(list.trim())
}

/// The number of CPUs in a kernel CPU list such as `0-3,8,10-11`; `None` for anything else.
fn count_list(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(count_list("0"), Some(1));
        assert_eq!(count_list("0-1"), Some(2));
        assert_eq!(count_list("0-3,8,10-11"), Some(7));
        for bad in ["", "x", "3-1", "0-", "1,,2", "-1"] {
            assert_eq!(count_list(bad), None, "{bad:?}");
        }
        let status = "Name:\tbench\nCpus_allowed:\t3\nCpus_allowed_list:\t4-5\nMems_allowed:\t1\n";
        assert_eq!(allowed(status), Some(2));
        assert_eq!(allowed("Name:\tbench\n"), None);
    }

    #[test]
    fn a_rank_pinned_narrower_than_its_parent_counts_the_parents_cpus() {
        // mpirun --bind-to core, 2 ranks on a 2-CPU machine: each sees 1 CPU.
        assert_eq!(choose(1, Some(1), Some(2)), 2);
        // Unpinned, or pinned along with the launcher (taskset around mpirun), or a
        // container's cpuset: the process's own count.
        assert_eq!(choose(2, Some(2), Some(2)), 2);
        assert_eq!(choose(1, Some(1), Some(1)), 1);
        assert_eq!(choose(4, None, Some(8)), 4);
        assert_eq!(choose(4, Some(4), None), 4);
    }

    #[test]
    fn this_process_counts_at_least_one_cpu() {
        assert!(for_ranks() >= 1);
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        assert!(allowed(&status).is_some());
    }
}
