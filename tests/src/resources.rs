//! What a process holds, read from /proc: open descriptors, threads, the TCP ports it
//! listens on, resident memory. The chaos soak's ranks count them before init and after their communicator is
//! gone (a fault or not), so a leak on any path shows as a number above zero.

use std::time::{Duration, Instant};

/// A process's descriptors, threads and listening TCP ports at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub fds: usize,
    pub threads: usize,
    pub listening: Vec<u16>,
}

fn entries(dir: &str) -> usize {
    std::fs::read_dir(dir).map_or(0, Iterator::count)
}

/// The socket inodes among `pid`'s descriptors.
fn socket_inodes(pid: u32) -> Vec<String> {
    let mut inodes = Vec::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in dir.flatten() {
            if let Ok(target) = std::fs::read_link(e.path()) {
                let t = target.to_string_lossy();
                if let Some(inode) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    inodes.push(inode.to_string());
                }
            }
        }
    }
    inodes
}

/// The TCP ports `pid` listens on: its socket inodes matched in the tcp and tcp6 tables of
/// its own network namespace (`/proc/PID/net`).
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes = socket_inodes(pid);
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT, st 0A is LISTEN, the inode is field 9.
            if f.len() > 9
                && f[3] == "0A"
                && inodes.iter().any(|i| i == f[9])
                && let Some(port) = f[1].rsplit(':').next()
            {
                ports.extend(u16::from_str_radix(port, 16).ok());
            }
        }
    }
    ports.sort_unstable();
    ports
}

/// `pid`'s resident memory in KiB (`VmRSS` of `/proc/PID/status`; pages of shared memory it
/// mapped and touched count in full), or `None` where it cannot be read.
pub fn resident_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

impl Held {
    /// What `pid` holds now.
    pub fn of(pid: u32) -> Self {
        Held {
            fds: entries(&format!("/proc/{pid}/fd")),
            threads: entries(&format!("/proc/{pid}/task")),
            listening: listening_ports(pid),
        }
    }

    /// What this process holds now.
    pub fn mine() -> Self {
        Self::of(std::process::id())
    }

    /// What this process holds beyond `baseline`, once it has had up to `within` to get back
    /// there (a thread that has returned takes a moment to leave /proc): zeros when nothing
    /// leaked.
    pub fn left_beyond(baseline: &Held, within: Duration) -> Held {
        let end = Instant::now() + within;
        loop {
            let now = Self::mine();
            let left = Held {
                fds: now.fds.saturating_sub(baseline.fds),
                threads: now.threads.saturating_sub(baseline.threads),
                listening: (now.listening.iter())
                    .filter(|p| !baseline.listening.contains(p))
                    .copied()
                    .collect(),
            };
            if left.is_empty() || Instant::now() >= end {
                return left;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.fds == 0 && self.threads == 0 && self.listening.is_empty()
    }

    /// `left fds=F threads=T listening=P` (the line `bcl-rank soak` prints, parsed back by
    /// [`Held::parse_left`]).
    pub fn left_line(&self) -> String {
        format!(
            "left fds={} threads={} listening={}",
            self.fds,
            self.threads,
            self.listening.len()
        )
    }

    /// The counts of a `left ...` line in `text`: (fds, threads, listening ports).
    pub fn parse_left(text: &str) -> Option<(usize, usize, usize)> {
        let line = text.lines().find(|l| l.starts_with("left "))?;
        let field = |name: &str| -> Option<usize> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))?
                .parse()
                .ok()
        };
        Some((field("fds")?, field("threads")?, field("listening")?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_and_a_thread_show_and_then_go() {
        let baseline = Held::mine();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || rx.recv());
        let during = Held::left_beyond(&baseline, Duration::ZERO);
        assert!(during.fds >= 1, "{during:?}");
        assert!(during.threads >= 1, "{during:?}");
        assert_eq!(during.listening, vec![port]);
        assert_eq!(
            Held::parse_left(&format!("x\n{}\n", during.left_line())),
            Some((during.fds, during.threads, 1))
        );
        drop(listener);
        drop(tx);
        let _ = thread.join();
        let after = Held::left_beyond(&baseline, Duration::from_secs(2));
        assert!(after.is_empty(), "{after:?}");
    }
}
