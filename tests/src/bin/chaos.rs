//! The chaos soak (`scripts/chaos.sh`): jobs of 4 `bcl-rank` processes running the `soak`
//! scenario (collectives whose every result is checked), each hit by one fault at a random
//! moment, and per fault class: how often the culprit and cause were named right, how long
//! the verdict took, false verdicts, wrong results, jobs that hung, and what was left behind:
//! descriptors, threads and listening ports each surviving rank still held once its
//! communicator was destroyed (it says, in its `left` line), and `/dev/shm` names of the job.
//! Exit 1 when any false verdict, wrong result, hang, leftover or missed verdict occurred.
//!
//! Usage: `bcl-chaos TRIALS [CLASS...]`; classes: kill (SIGKILL), stop-short (SIGSTOP 0.5 s,
//! below the 2 s hang timeout: no verdict may come), stop-long (SIGSTOP 5 s: the rank must be
//! named unresponsive), stranger (every listening port of a rank gets garbage and a replayed
//! handshake hello, several times: no verdict), flood (100 idle connections held open on
//! every listening port of a rank for 1.5 s: no verdict), cpu-hog (two busy processes for
//! 1.5 s: no verdict). Trials alternate between shared memory and tcp.
//!
//! The link classes run the 4 ranks on three namespace "hosts" in a full mesh of veth pairs
//! (`bcl_tests::netns::Mesh`: ranks 0 and 1 on host 0, rank 2 on host 1, rank 3 on host 2),
//! shared memory inside host 0, tcp between hosts, and act on the veth between hosts 0 and 1:
//! slow-link (both ends shaped to 20 Mbit/s by `tc tbf` for 1.5 s: no verdict), link-flap
//! (down for 0.4 s, then up again: no verdict), link-down (down for good: every rank must name
//! the link between a rank of host 0 and rank 2, both alive). They need root and iproute2.

use bcl_tests::netns::Mesh;
use bcl_tests::procs::{Finished, finish_or_kill, unix_ms};
use bcl_tests::resources::{Held, listening_ports};
use std::io::{Read, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const WORLD: usize = 4;
const SOAK_SECONDS: &str = "3";
const CLASSES: [&str; 9] = [
    "kill",
    "stop-short",
    "stop-long",
    "stranger",
    "flood",
    "cpu-hog",
    "slow-link",
    "link-flap",
    "link-down",
];

/// The classes that act on a link between namespace hosts.
fn on_links(class: &str) -> bool {
    matches!(class, "slow-link" | "link-flap" | "link-down")
}

/// The host of each rank in the link classes' mesh.
const HOST_OF: [usize; WORLD] = [0, 0, 1, 2];

/// Run `program args` (`ip`, `tc`), its failure noted (a link class that cannot act is a
/// miss, not a pass).
fn run(program: &str, args: &[&str], notes: &mut Vec<String>) {
    match Command::new(program).args(args).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => notes.push(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => notes.push(format!(
            "{program} {}: {e} (needs iproute2 and root)",
            args.join(" ")
        )),
    }
}

fn ip(args: &[&str], notes: &mut Vec<String>) {
    run("ip", args, notes);
}

fn tc(args: &[&str], notes: &mut Vec<String>) {
    run("tc", args, notes);
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What one rank left, and whether it hung (killed at the deadline).
struct Out {
    left: Finished,
    hung: bool,
}

impl Out {
    fn wrong(&self) -> bool {
        self.left.stderr.contains(" WRONG ")
    }
}

fn finish(child: Child, deadline: Instant) -> Out {
    let (left, hung) = finish_or_kill(child, deadline);
    Out { left, hung }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status();
}

/// Garbage, then a handshake hello replayed from nowhere, to every port.
fn visit(ports: &[u16], rng: &mut Rng) {
    for &port in ports {
        for attempt in 0..2 {
            let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
            let bytes: Vec<u8> = if attempt == 0 {
                (0..64).map(|_| rng.below(256) as u8).collect()
            } else {
                let mut hello = b"BCLH".to_vec();
                hello.extend((0..16).map(|_| rng.below(256) as u8));
                hello.extend((0..32).map(|_| rng.below(256) as u8));
                hello
            };
            let _ = s.write_all(&bytes);
        }
    }
}

/// `/dev/shm` names that belong to any of `pids` (BCL names its segments `bcl.PID.…`).
fn shm_left(pids: &[u32]) -> usize {
    std::fs::read_dir("/dev/shm").map_or(0, |d| {
        d.flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                pids.iter().any(|p| name.starts_with(&format!("bcl.{p}.")))
            })
            .count()
    })
}

#[derive(Default)]
struct Tally {
    trials: usize,
    named_right: usize,
    expected_verdicts: usize,
    latencies: Vec<u128>,
    false_verdicts: usize,
    wrong_results: usize,
    hung_jobs: usize,
    shm_left: usize,
    /// Descriptors, threads and listening ports the ranks still held once their communicator
    /// was destroyed (summed over ranks and jobs), and ranks that never said (a rank that
    /// ended without its `left` line: the killed one is not asked).
    fds_left: usize,
    threads_left: usize,
    ports_left: usize,
    unaccounted: usize,
    /// Trials whose fault could not be injected (an `ip` or `tc` command failed).
    faults_failed: usize,
    notes: Vec<String>,
}

fn trial(class: &str, t: usize, rng: &mut Rng, rank_bin: &str, tally: &mut Tally) {
    let mesh = on_links(class).then(Mesh::create);
    let id = match &mesh {
        Some(_) => format!("{}:{}", Mesh::address(0), 29900 + t % 64)
            .parse()
            .map_err(|e| bcl_core::Error::InvalidArgument(format!("{e}")))
            .and_then(bcl_core::UniqueId::at),
        None => bcl_core::UniqueId::new(std::net::Ipv4Addr::LOCALHOST.into()),
    };
    let id = match id {
        Ok(id) => id.to_string(),
        Err(e) => {
            tally.notes.push(format!("trial {t}: no unique id: {e}"));
            return;
        }
    };
    let transport = if t.is_multiple_of(2) || mesh.is_some() {
        "auto"
    } else {
        "tcp"
    };
    let spawned: std::io::Result<Vec<Child>> = (0..WORLD)
        .map(|r| {
            let mut command = match &mesh {
                Some(m) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", &m.namespaces[HOST_OF[r]], rank_bin])
                        .env("BCL_BIND_IP", Mesh::address(HOST_OF[r]));
                    c
                }
                None => Command::new(rank_bin),
            };
            command
                .env("BCL_RANK", r.to_string())
                .env("BCL_WORLD_SIZE", WORLD.to_string())
                .env("BCL_UNIQUE_ID", &id)
                .env("BCL_TEST_SCENARIO", "soak")
                .env("BCL_TEST_SECONDS", SOAK_SECONDS)
                .env("BCL_TRANSPORT", transport)
                .env("BCL_TIMEOUT_S", "20")
                .env("BCL_INIT_TIMEOUT_S", "30")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect();
    // A rank that could not start (no processes left, say) fails the soak loudly; those that
    // did start give up at init on their own (BCL_INIT_TIMEOUT_S).
    let mut children = match spawned {
        Ok(c) => c,
        Err(e) => {
            tally
                .notes
                .push(format!("trial {t}: could not start the ranks: {e}"));
            tally.hung_jobs += 1;
            return;
        }
    };
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    // Wait for the job to run: every rank prints `ready` after its first round.
    let mut outs: Vec<Option<std::process::ChildStdout>> =
        children.iter_mut().map(|c| c.stdout.take()).collect();
    for o in outs.iter_mut().flatten() {
        let mut b = [0u8; 6];
        let _ = o.read_exact(&mut b);
    }
    for (c, o) in children.iter_mut().zip(outs) {
        c.stdout = o;
    }
    std::thread::sleep(Duration::from_millis(200 + rng.below(1000)));
    // The link classes have no victim rank: the culprit is the link.
    let victim = match mesh {
        Some(_) => usize::MAX,
        None => rng.below(WORLD as u64) as usize,
    };
    let vpid = pids.get(victim).copied().unwrap_or(0);
    let fault_at = unix_ms();
    let mut hogs = Vec::new();
    match class {
        "kill" => signal(vpid, "KILL"),
        "stop-short" => {
            signal(vpid, "STOP");
            std::thread::sleep(Duration::from_millis(500));
            signal(vpid, "CONT");
        }
        "stop-long" => signal(vpid, "STOP"),
        "stranger" => {
            let ports = listening_ports(vpid);
            if ports.is_empty() {
                tally
                    .notes
                    .push(format!("trial {t}: rank {victim} listens on no tcp port"));
            }
            for _ in 0..3 {
                visit(&ports, rng);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        "slow-link" | "link-flap" | "link-down" => {
            if let Some(m) = &mesh {
                let before = tally.notes.len();
                link_fault(class, m, &mut tally.notes);
                tally.faults_failed += usize::from(tally.notes.len() > before);
            }
        }
        "flood" => {
            let ports = listening_ports(vpid);
            let held: Vec<std::net::TcpStream> = ports
                .iter()
                .flat_map(|&p| (0..100).map(move |_| p))
                .filter_map(|p| std::net::TcpStream::connect(("127.0.0.1", p)).ok())
                .collect();
            if held.is_empty() {
                tally
                    .notes
                    .push(format!("trial {t}: no connection to rank {victim} held"));
            }
            std::thread::sleep(Duration::from_millis(1500));
            drop(held);
        }
        _ => {
            for _ in 0..2 {
                if let Ok(c) = Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                {
                    hogs.push(c);
                }
            }
            std::thread::sleep(Duration::from_millis(1500));
        }
    }
    for mut h in hogs {
        let _ = h.kill();
        let _ = h.wait();
    }
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut results: Vec<Option<Out>> = Vec::new();
    let mut pending: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    for (r, slot) in pending.iter_mut().enumerate() {
        if class == "stop-long" && r == victim {
            results.push(None);
            continue;
        }
        results.push(slot.take().map(|c| finish(c, deadline)));
    }
    if class == "stop-long" {
        signal(vpid, "CONT");
        let out = pending[victim]
            .take()
            .map(|c| finish(c, Instant::now() + Duration::from_secs(30)));
        results[victim] = out;
    }
    std::thread::sleep(Duration::from_millis(100));
    tally.trials += 1;
    tally.shm_left += shm_left(&pids);
    let mut all_right = true;
    let expects_verdict = matches!(class, "kill" | "stop-long" | "link-down");
    if expects_verdict {
        tally.expected_verdicts += 1;
    }
    for (r, out) in results.iter().enumerate() {
        let Some(out) = out else { continue };
        if out.hung {
            tally.hung_jobs += 1;
            tally
                .notes
                .push(format!("trial {t} ({transport}): rank {r} hung (killed)"));
        }
        if out.wrong() {
            tally.wrong_results += 1;
            tally
                .notes
                .push(format!("trial {t}: rank {r}: {}", out.left.stderr.trim()));
        }
        if !(class == "kill" && r == victim) {
            match Held::parse_left(&out.left.stdout) {
                Some((fds, threads, ports)) => {
                    tally.fds_left += fds;
                    tally.threads_left += threads;
                    tally.ports_left += ports;
                    if fds + threads + ports > 0 {
                        tally.notes.push(format!(
                            "trial {t} ({transport}): rank {r} kept fds={fds} threads={threads} listening={ports}"
                        ));
                    }
                }
                None if !out.hung => {
                    tally.unaccounted += 1;
                    tally
                        .notes
                        .push(format!("trial {t}: rank {r} did not say what it kept"));
                }
                None => {}
            }
        }
        if r == victim && expects_verdict {
            continue; // the victim's own end says nothing about the verdict
        }
        let error = out
            .left
            .error_line()
            .zip(out.left.error_times().map(|(_, at)| at));
        match (expects_verdict, error) {
            (true, Some((line, at))) => {
                let named = match class {
                    "link-down" => {
                        line.contains("link between")
                            && line.contains("is down (both ranks alive)")
                            && (line.contains("rank 0 (") || line.contains("rank 1 ("))
                            && line.contains("rank 2 (")
                    }
                    "kill" => line.contains(&format!("rank {victim} (")) && line.contains("died"),
                    _ => {
                        line.contains(&format!("rank {victim} (")) && line.contains("unresponsive")
                    }
                };
                if named {
                    tally.latencies.push(at.saturating_sub(fault_at));
                } else {
                    all_right = false;
                    tally
                        .notes
                        .push(format!("trial {t}: rank {r} named wrongly: {line}"));
                }
            }
            (true, None) => {
                all_right = false;
                tally.notes.push(format!(
                    "trial {t}: rank {r} gave no verdict (exit {:?}): {}",
                    out.left.code,
                    out.left.stderr.trim()
                ));
            }
            (false, Some((line, _))) => {
                tally.false_verdicts += 1;
                tally
                    .notes
                    .push(format!("trial {t} ({transport}): rank {r}: {line}"));
            }
            (false, None) => {
                if out.left.code != Some(0) || !out.left.stdout.contains("done ") {
                    tally.false_verdicts += 1;
                    tally.notes.push(format!(
                        "trial {t}: rank {r} ended with {:?} and no verdict: {}",
                        out.left.code,
                        out.left.stderr.trim()
                    ));
                }
            }
        }
    }
    if expects_verdict && all_right {
        tally.named_right += 1;
    }
}

/// Act on the veth between hosts 0 and 1 of `mesh` (both ends for a slow link).
fn link_fault(class: &str, mesh: &Mesh, notes: &mut Vec<String>) {
    let ends = [
        (&mesh.namespaces[0], mesh.veth(0, 1)),
        (&mesh.namespaces[1], mesh.veth(1, 0)),
    ];
    match class {
        "slow-link" => {
            for (ns, dev) in &ends {
                let shape = [
                    "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", "20mbit", "burst",
                    "32kb", "latency", "400ms",
                ];
                tc(&shape, notes);
            }
            std::thread::sleep(Duration::from_millis(1500));
            for (ns, dev) in &ends {
                tc(&["-n", ns, "qdisc", "del", "dev", dev, "root"], notes);
            }
        }
        "link-flap" => {
            let (ns, dev) = &ends[0];
            ip(&["-n", ns, "link", "set", dev, "down"], notes);
            std::thread::sleep(Duration::from_millis(400));
            ip(&["-n", ns, "link", "set", dev, "up"], notes);
            // Down flushed the routes through the veth (the mesh's are not connected routes).
            for (me, peer) in [(0, 1), (1, 0)] {
                let to = format!("{}/32", Mesh::address(peer));
                let src = Mesh::address(me);
                let dev = mesh.veth(me, peer);
                let route = [
                    "-n",
                    &mesh.namespaces[me],
                    "route",
                    "replace",
                    &to,
                    "dev",
                    &dev,
                ];
                ip(&[&route[..], &["src", &src]].concat(), notes);
            }
        }
        _ => {
            let (ns, dev) = &ends[0];
            ip(&["-n", ns, "link", "set", dev, "down"], notes);
        }
    }
}

fn pct(sorted: &[u128], p: f64) -> String {
    if sorted.is_empty() {
        return "-".into();
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].to_string()
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let trials: usize = match args.next().map(|a| a.parse()) {
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!(
                "usage: bcl-chaos TRIALS [CLASS...] (classes: {})",
                CLASSES.join(", ")
            );
            return ExitCode::from(2);
        }
    };
    let mut classes: Vec<String> = args.collect();
    if classes.is_empty() {
        classes = CLASSES.iter().map(|c| c.to_string()).collect();
    }
    if let Some(bad) = classes.iter().find(|c| !CLASSES.contains(&c.as_str())) {
        eprintln!("unknown class '{bad}' (classes: {})", CLASSES.join(", "));
        return ExitCode::from(2);
    }
    let rank_bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("bcl-rank")))
        .filter(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned());
    let Some(rank_bin) = rank_bin else {
        eprintln!("bcl-rank is not beside bcl-chaos: cargo build --release -p bcl-tests --bins");
        return ExitCode::from(2);
    };
    let mut failed = false;
    println!(
        "| class | trials | culprit and cause named | verdict p50 / p95 / max ms | false verdicts | wrong results | hung | left: fds / threads / ports / /dev/shm |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (k, class) in classes.iter().enumerate() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((k as u64 + 1) << 32) ^ unix_ms() as u64);
        let mut tally = Tally::default();
        for t in 0..trials {
            trial(class, t, &mut rng, &rank_bin, &mut tally);
        }
        tally.latencies.sort_unstable();
        let named = if tally.expected_verdicts == 0 {
            "- (none expected)".to_string()
        } else {
            format!(
                "{}/{} ({:.0}%)",
                tally.named_right,
                tally.expected_verdicts,
                100.0 * tally.named_right as f64 / tally.expected_verdicts as f64
            )
        };
        println!(
            "| {class} | {} | {named} | {} / {} / {} | {} | {} | {} | {} / {} / {} / {} |",
            tally.trials,
            pct(&tally.latencies, 0.5),
            pct(&tally.latencies, 0.95),
            pct(&tally.latencies, 1.0),
            tally.false_verdicts,
            tally.wrong_results,
            tally.hung_jobs,
            tally.fds_left,
            tally.threads_left,
            tally.ports_left,
            tally.shm_left
        );
        for n in &tally.notes {
            eprintln!("  {class}: {n}");
        }
        failed |= tally.false_verdicts > 0
            || tally.wrong_results > 0
            || tally.hung_jobs > 0
            || tally.shm_left > 0
            || tally.fds_left + tally.threads_left + tally.ports_left + tally.unaccounted > 0
            || tally.faults_failed > 0
            || tally.named_right < tally.expected_verdicts;
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
