//! Slow-node detection: windows of measurements from every rank, and the detector (on rank 0)
//! that tells a slow link from a slow rank (device) from a straggler, with hysteresis.
//!
//! What each rank measures (see `Executor` and `Health::op_started`/`op_finished`):
//! * per incoming link, the wire rate of each large message (bytes / time from its first byte
//!   to its last, as the transport saw it): a throttled link delivers every message slowly,
//!   whatever the pipeline around it does, while a fast link's messages arrive in bursts;
//! * its device throughput: bytes reduced or copied into its buffers / time in those calls;
//! * when it entered each collective (wall clock; ranks of one host share it, hosts are
//!   assumed NTP-synchronised to well under the straggling the detector reports).
//!
//! A finding must hold in 3 consecutive evaluations (one per window) to raise a verdict, and
//! be absent from 3 to clear, so one noisy sample raises nothing.

use super::verdict::rank_list;
use crate::peers::RankInfo;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Rate samples kept per link and window.
const SAMPLES_PER_LINK: usize = 64;
/// A link slower than this fraction of the median of comparable links is suspect.
const SLOW_LINK_FRACTION: f32 = 0.6;
/// A device slower than this fraction of the median device is suspect.
const SLOW_DEVICE_FRACTION: f32 = 0.5;
/// A straggler arrives at least this much later than the median rank...
const STRAGGLER_MIN_MS: f32 = 5.0;
/// ...and this many times later than any other rank.
const STRAGGLER_FACTOR: f32 = 3.0;
/// Evaluations a finding must persist to raise, and be absent to clear.
const HYSTERESIS: u32 = 3;
/// Entry times are recorded for one collective in four, chosen by a hash of the sequence
/// number so that a periodic pattern of calls (allreduce, barrier, allreduce, ...) is sampled
/// evenly...
pub(crate) fn entry_sampled(seq: u32) -> bool {
    seq.wrapping_mul(0x9E37_79B9) >> 30 == 0
}
/// ...and kept for this many of those, enough to overlap the windows of ranks that report at
/// different moments.
const ENTRY_HISTORY: usize = 512;
/// Complete collectives (every rank's entry known) the lateness is computed over.
const LATENESS_SAMPLES: usize = 32;

/// One rank's measurements over one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Window {
    pub rank: u32,
    /// Operations finished in the window.
    pub ops: u32,
    /// Per incoming link: the sender, and wire-rate samples in GB/s.
    pub links: Vec<(u32, Vec<f32>)>,
    /// Bytes reduced or copied by this rank's device, and the seconds it took.
    pub device_bytes: u64,
    pub device_secs: f64,
    /// (collective sequence number, entry time in µs since the Unix epoch).
    pub entries: Vec<(u32, u64)>,
}

/// Entry times a window keeps at most.
pub(crate) const ENTRIES_PER_WINDOW: usize = 4096;

impl Window {
    /// An empty window of `rank`, with room for its entry times: the data path, which fills
    /// it, then allocates nothing for them.
    pub fn new(rank: u32) -> Self {
        Window {
            rank,
            entries: Vec::with_capacity(ENTRIES_PER_WINDOW),
            ..Window::default()
        }
    }

    /// Record one large message's wire rate from `peer`.
    pub fn add_rate(&mut self, peer: usize, gbps: f32) {
        let peer = peer as u32;
        match self.links.iter_mut().find(|(p, _)| *p == peer) {
            Some((_, samples)) if samples.len() < SAMPLES_PER_LINK => samples.push(gbps),
            Some(_) => {}
            None => {
                // Its full size at once: one allocation per link and window.
                let mut samples = Vec::with_capacity(SAMPLES_PER_LINK);
                samples.push(gbps);
                self.links.push((peer, samples));
            }
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStat {
    pub from: usize,
    pub to: usize,
    pub gbps: f32,
    pub samples: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankStat {
    pub rank: usize,
    pub device_gbps: Option<f32>,
    /// Median lateness at collectives relative to the median rank.
    pub lateness_ms: Option<f32>,
}

/// What the detector knows now: per-link bandwidth, per-rank device speed and lateness, and
/// the verdicts in force.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub links: Vec<LinkStat>,
    pub ranks: Vec<RankStat>,
    pub verdicts: Vec<String>,
    /// Verdicts raised since the communicator started (cleared ones included).
    pub raised_total: u32,
    pub evaluations: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Finding {
    SlowLink { from: usize, to: usize },
    SlowRank(usize),
    Straggler(usize),
}

#[derive(Debug, Default)]
struct Streak {
    present: u32,
    absent: u32,
    active: bool,
    ops: u64,
    line: String,
}

/// The detector, fed with every rank's windows (it runs on rank 0).
#[derive(Debug)]
pub(crate) struct Detector {
    peers: Vec<RankInfo>,
    pending: Vec<Window>,
    entries: BTreeMap<u32, Vec<Option<u64>>>,
    streaks: HashMap<Finding, Streak>,
    summary: Summary,
}

fn median(values: &mut [f32]) -> Option<f32> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f32::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

impl Detector {
    pub fn new(peers: Vec<RankInfo>) -> Self {
        Detector {
            peers,
            pending: Vec::new(),
            entries: BTreeMap::new(),
            streaks: HashMap::new(),
            summary: Summary::default(),
        }
    }

    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// Take a rank's window (evaluated at the next [`Detector::evaluate`]).
    pub fn add(&mut self, window: Window) {
        let world = self.peers.len();
        let rank = window.rank as usize;
        if rank >= world {
            return;
        }
        for &(seq, at) in &window.entries {
            self.entries.entry(seq).or_insert_with(|| vec![None; world])[rank] = Some(at);
        }
        while self.entries.len() > ENTRY_HISTORY {
            self.entries.pop_first();
        }
        self.pending.push(window);
    }

    fn label(&self, rank: usize) -> String {
        self.peers
            .get(rank)
            .map_or_else(|| format!("rank {rank}"), |p| p.label().0)
    }

    /// Evaluate the windows received since the last call; returns the verdicts newly raised.
    pub fn evaluate(&mut self) -> Vec<String> {
        let windows = std::mem::take(&mut self.pending);
        if windows.is_empty() {
            return Vec::new();
        }
        let ops = windows.iter().map(|w| u64::from(w.ops)).max().unwrap_or(0);
        let (links, ranks) = self.statistics(&windows);
        let mut found: Vec<(Finding, String)> = Vec::new();

        // Slow devices first: their links and their lateness are theirs, not the network's.
        let mut speeds: Vec<f32> = ranks.iter().filter_map(|r| r.device_gbps).collect();
        let slow_devices: Vec<usize> = match median(&mut speeds) {
            Some(m) if speeds.len() >= 3 => ranks
                .iter()
                .filter(|r| r.device_gbps.is_some_and(|g| g < SLOW_DEVICE_FRACTION * m))
                .map(|r| {
                    let g = r.device_gbps.unwrap_or_default();
                    found.push((
                        Finding::SlowRank(r.rank),
                        format!(
                            "slow {}: its device reduces and copies at {g:.2} GB/s vs median {m:.2} GB/s (a slow rank, not a slow link)",
                            self.label(r.rank)
                        ),
                    ));
                    r.rank
                })
                .collect(),
            _ => Vec::new(),
        };
        for link in &links {
            if slow_devices.contains(&link.from) || slow_devices.contains(&link.to) {
                continue;
            }
            let same_host = |l: &LinkStat| self.same_host(l.from, l.to);
            let class = same_host(link);
            let mut comparable: Vec<f32> = links
                .iter()
                .filter(|l| (l.from, l.to) != (link.from, link.to) && same_host(l) == class)
                .map(|l| l.gbps)
                .collect();
            if comparable.len() < 2 {
                comparable = links
                    .iter()
                    .filter(|l| (l.from, l.to) != (link.from, link.to))
                    .map(|l| l.gbps)
                    .collect();
            }
            if comparable.len() < 2 {
                continue;
            }
            if let Some(m) = median(&mut comparable)
                && link.gbps < SLOW_LINK_FRACTION * m
            {
                let host = self.peers.get(link.to).map_or("?", |p| p.hostname.as_str());
                found.push((
                    Finding::SlowLink {
                        from: link.from,
                        to: link.to,
                    },
                    format!(
                        "slow link rank {} → rank {} ({host}): its messages arrive at {:.2} GB/s vs median {m:.2} GB/s on comparable links",
                        link.from, link.to, link.gbps
                    ),
                ));
            }
        }
        let lateness: Vec<(usize, f32)> = ranks
            .iter()
            .filter_map(|r| r.lateness_ms.map(|l| (r.rank, l)))
            .collect();
        for &(rank, late) in &lateness {
            let others = lateness
                .iter()
                .filter(|(r, _)| *r != rank)
                .map(|(_, l)| *l)
                .fold(0f32, f32::max);
            if late > STRAGGLER_MIN_MS
                && late > STRAGGLER_FACTOR * others.max(1.0)
                && !slow_devices.contains(&rank)
            {
                found.push((
                    Finding::Straggler(rank),
                    format!(
                        "straggler {}: arrives {late:.1} ms after the median rank at each collective (slow outside the library)",
                        self.label(rank)
                    ),
                ));
            }
        }
        let raised = self.update_streaks(found, ops);
        // The summary keeps each link's and rank's latest measured figures, so that a quiet
        // window (no traffic) does not blank them.
        for link in links {
            match self
                .summary
                .links
                .iter_mut()
                .find(|l| (l.from, l.to) == (link.from, link.to))
            {
                Some(old) => *old = link,
                None => self.summary.links.push(link),
            }
        }
        self.summary.links.sort_by_key(|l| (l.from, l.to));
        if self.summary.ranks.len() != ranks.len() {
            self.summary.ranks = ranks;
        } else {
            for (old, new) in self.summary.ranks.iter_mut().zip(ranks) {
                old.device_gbps = new.device_gbps.or(old.device_gbps);
                old.lateness_ms = new.lateness_ms.or(old.lateness_ms);
            }
        }
        self.summary.evaluations += 1;
        raised
    }

    fn same_host(&self, a: usize, b: usize) -> bool {
        match (self.peers.get(a), self.peers.get(b)) {
            (Some(x), Some(y)) => x.host_id == y.host_id,
            _ => false,
        }
    }

    fn statistics(&self, windows: &[Window]) -> (Vec<LinkStat>, Vec<RankStat>) {
        let mut samples: BTreeMap<(usize, usize), Vec<f32>> = BTreeMap::new();
        let mut device: BTreeMap<usize, (u64, f64)> = BTreeMap::new();
        for w in windows {
            for (from, rates) in &w.links {
                samples
                    .entry((*from as usize, w.rank as usize))
                    .or_default()
                    .extend(rates);
            }
            let d = device.entry(w.rank as usize).or_default();
            d.0 += w.device_bytes;
            d.1 += w.device_secs;
        }
        let links = samples
            .into_iter()
            .filter(|(_, s)| s.len() >= 3)
            .filter_map(|((from, to), mut s)| {
                let n = s.len() as u32;
                median(&mut s).map(|gbps| LinkStat {
                    from,
                    to,
                    gbps,
                    samples: n,
                })
            })
            .collect();
        // Lateness over the complete collectives of the recent history.
        let world = self.peers.len();
        let complete: Vec<&Vec<Option<u64>>> = self
            .entries
            .values()
            .rev()
            .filter(|e| e.iter().all(Option::is_some))
            .take(LATENESS_SAMPLES)
            .collect();
        let mut late: Vec<Vec<f32>> = vec![Vec::new(); world];
        for entry in &complete {
            // µs since the epoch lose precision in f32: work relative to the earliest entry.
            let base = entry.iter().flatten().min().copied().unwrap_or(0);
            let mut times: Vec<f32> = entry.iter().flatten().map(|&t| (t - base) as f32).collect();
            let Some(m) = median(&mut times) else {
                continue;
            };
            for (rank, t) in entry.iter().enumerate() {
                if let Some(t) = t {
                    late[rank].push(((t - base) as f32 - m) / 1000.0);
                }
            }
        }
        let ranks = (0..world)
            .map(|rank| RankStat {
                rank,
                device_gbps: device
                    .get(&rank)
                    .filter(|(bytes, secs)| *bytes >= 1 << 20 && *secs > 0.0)
                    .map(|(bytes, secs)| (*bytes as f64 / secs / 1e9) as f32),
                lateness_ms: if complete.len() >= 5 {
                    median(&mut late[rank])
                } else {
                    None
                },
            })
            .collect();
        (links, ranks)
    }

    fn update_streaks(&mut self, found: Vec<(Finding, String)>, ops: u64) -> Vec<String> {
        let mut raised = Vec::new();
        for (finding, line) in &found {
            let s = self.streaks.entry(*finding).or_default();
            s.present += 1;
            s.absent = 0;
            s.ops += ops;
            s.line = format!("{line} over the last {} collectives", s.ops);
            if s.present >= HYSTERESIS && !s.active {
                s.active = true;
                self.summary.raised_total += 1;
                raised.push(s.line.clone());
            }
        }
        self.streaks.retain(|finding, s| {
            if found.iter().any(|(f, _)| f == finding) {
                return true;
            }
            s.absent += 1;
            if !s.active {
                return false;
            }
            s.absent < HYSTERESIS
        });
        let mut active: Vec<(&Finding, &Streak)> =
            self.streaks.iter().filter(|(_, s)| s.active).collect();
        active.sort_by_key(|(f, _)| **f);
        self.summary.verdicts = active.into_iter().map(|(_, s)| s.line.clone()).collect();
        raised
    }
}

/// The per-link matrix and verdicts as text, for `bcl-bench --health`.
pub fn render(summary: &Summary, world: usize) -> String {
    let mut out = String::from(
        "# per-link bandwidth (GB/s, receiver's view of large messages; . = no data, as on \
         shared-memory links, which time no transfer)\n#  from\\to",
    );
    for to in 0..world {
        out += &format!(" {to:>7}");
    }
    out.push('\n');
    for from in 0..world {
        out += &format!("# {from:>7}");
        for to in 0..world {
            match summary.links.iter().find(|l| l.from == from && l.to == to) {
                Some(l) => out += &format!(" {:>7.2}", l.gbps),
                None => out += &format!(" {:>7}", "."),
            }
        }
        out.push('\n');
    }
    for r in &summary.ranks {
        out += &format!(
            "# rank {:>3}: device {} GB/s, lateness {} ms\n",
            r.rank,
            r.device_gbps.map_or("-".into(), |g| format!("{g:.2}")),
            r.lateness_ms.map_or("-".into(), |l| format!("{l:.1}"))
        );
    }
    if summary.verdicts.is_empty() {
        out += &format!(
            "# slow-node verdicts: none ({} evaluations, ranks {})\n",
            summary.evaluations,
            rank_list(&(0..world).collect::<Vec<_>>())
        );
    } else {
        for v in &summary.verdicts {
            out += &format!("# slow-node verdict: {v}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcl_backends::{DeviceCapabilities, DeviceInfo, Vendor};

    fn peers(world: usize) -> Vec<RankInfo> {
        (0..world)
            .map(|rank| RankInfo {
                rank,
                hostname: format!("h{rank}"),
                host_id: format!("h{rank}"),
                pid: 100 + rank as u32,
                device: DeviceInfo {
                    vendor: Vendor::Cpu,
                    model: String::new(),
                    index: 0,
                    host_id: format!("h{rank}"),
                    capabilities: DeviceCapabilities {
                        host_addressable: true,
                        external_memory: false,
                        copy_gbps: None,
                        reduce_gbps: None,
                    },
                },
                address: bcl_transport::PeerAddress::new(Vec::new()).expect("address"),
                health: None,
            })
            .collect()
    }

    /// One window per rank of a 4-rank ring: link r-1 → r at `link(r)` GB/s, device at
    /// `device(r)` GB/s, entry into collective `seq` late by `late(r)` ms.
    fn windows(
        seqs: std::ops::Range<u32>,
        link: impl Fn(usize) -> f32,
        device: impl Fn(usize) -> f64,
        late: impl Fn(usize) -> u64,
    ) -> Vec<Window> {
        (0..4)
            .map(|r| Window {
                rank: r as u32,
                ops: seqs.len() as u32,
                links: vec![(((r + 3) % 4) as u32, vec![link(r); 8])],
                device_bytes: 1 << 30,
                device_secs: (1u64 << 30) as f64 / (device(r) * 1e9),
                entries: seqs
                    .clone()
                    .map(|s| (s, 1_000_000 * u64::from(s) + 1000 * late(r)))
                    .collect(),
            })
            .collect()
    }

    fn run(
        d: &mut Detector,
        rounds: u32,
        make: impl Fn(std::ops::Range<u32>) -> Vec<Window>,
    ) -> Vec<String> {
        let mut raised = Vec::new();
        for i in 0..rounds {
            for w in make(i * 10..i * 10 + 10) {
                d.add(w);
            }
            raised.extend(d.evaluate());
        }
        raised
    }

    #[test]
    fn a_slow_link_is_named_after_three_windows_and_cleared_after_three_more() {
        let mut d = Detector::new(peers(4));
        let slow = |r| if r == 2 { 1.0 } else { 8.0 };
        let raised = run(&mut d, 2, |s| windows(s, slow, |_| 10.0, |_| 0));
        assert!(raised.is_empty(), "raised before 3 windows: {raised:?}");
        let raised = run(&mut d, 1, |s| windows(s, slow, |_| 10.0, |_| 0));
        assert_eq!(raised.len(), 1, "{raised:?}");
        assert!(raised[0].starts_with("slow link rank 1 → rank 2 (h2): its messages arrive at 1.00 GB/s vs median 8.00 GB/s"), "{}", raised[0]);
        assert_eq!(d.summary().verdicts.len(), 1);
        run(&mut d, 2, |s| windows(s, |_| 8.0, |_| 10.0, |_| 0));
        assert_eq!(d.summary().verdicts.len(), 1, "cleared too early");
        run(&mut d, 1, |s| windows(s, |_| 8.0, |_| 10.0, |_| 0));
        assert!(
            d.summary().verdicts.is_empty(),
            "not cleared: {:?}",
            d.summary().verdicts
        );
        assert_eq!(d.summary().raised_total, 1);
    }

    #[test]
    fn one_noisy_window_raises_nothing() {
        let mut d = Detector::new(peers(4));
        for i in 0..10 {
            let noisy = i % 3 == 1;
            let raised = run(&mut d, 1, |s| {
                windows(
                    s,
                    |r| if noisy && r == 1 { 2.0 } else { 8.0 },
                    |_| 10.0,
                    |_| 0,
                )
            });
            assert!(raised.is_empty(), "window {i}: {raised:?}");
        }
        assert_eq!(d.summary().raised_total, 0);
    }

    #[test]
    fn a_slow_device_is_a_slow_rank_and_its_links_are_not_blamed() {
        let mut d = Detector::new(peers(4));
        // The slow device also slows the messages into it.
        let raised = run(&mut d, 3, |s| {
            windows(
                s,
                |r| if r == 3 { 1.0 } else { 8.0 },
                |r| if r == 3 { 0.5 } else { 10.0 },
                |_| 0,
            )
        });
        assert_eq!(raised.len(), 1, "{raised:?}");
        assert!(
            raised[0].starts_with("slow rank 3 (host h3, pid 103, cpu:0): its device"),
            "{}",
            raised[0]
        );
    }

    #[test]
    fn a_rank_late_to_every_collective_is_a_straggler_and_nothing_else() {
        let mut d = Detector::new(peers(4));
        let raised = run(&mut d, 4, |s| {
            windows(s, |_| 8.0, |_| 10.0, |r| if r == 1 { 30 } else { 0 })
        });
        assert_eq!(raised.len(), 1, "{raised:?}");
        assert!(
            raised[0].starts_with("straggler rank 1 (host h1"),
            "{}",
            raised[0]
        );
        let stat = &d.summary().ranks[1];
        assert!(
            stat.lateness_ms.is_some_and(|l| (l - 30.0).abs() < 0.5),
            "{stat:?}"
        );
    }

    #[test]
    fn the_matrix_shows_every_link_and_the_verdicts() {
        let mut d = Detector::new(peers(4));
        run(&mut d, 3, |s| {
            windows(s, |r| if r == 2 { 1.0 } else { 8.0 }, |_| 10.0, |_| 0)
        });
        let text = render(d.summary(), 4);
        assert!(
            text.contains("#       1       .       .    1.00       ."),
            "{text}"
        );
        assert!(
            text.contains("# slow-node verdict: slow link rank 1 → rank 2"),
            "{text}"
        );
    }
}
