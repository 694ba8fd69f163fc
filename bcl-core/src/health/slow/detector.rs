//! The slow-node detector (on rank 0): every rank's windows in, verdicts out, with
//! hysteresis. Slow devices are judged first, because they also slow the messages into them.

use super::{
    ENTRY_HISTORY, HYSTERESIS, LATENESS_SAMPLES, LinkStat, RankStat, SLOW_DEVICE_FRACTION,
    SLOW_LINK_FRACTION, STRAGGLER_FACTOR, STRAGGLER_MIN_MS, Summary, Window,
};
use crate::peers::RankInfo;
use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Finding {
    SlowLink { from: usize, to: usize },
    SlowRank(usize),
    Straggler(usize),
}

/// What one evaluation judged: the findings it made, with their lines, and every subject it
/// had the data to judge (found or not). A subject it could not judge (its rank's window had
/// not reached rank 0 yet, too few links to compare) neither extends nor breaks a streak.
#[derive(Debug, Default)]
struct Judged {
    found: Vec<(Finding, String)>,
    judged: Vec<Finding>,
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
        let mut verdicts = Judged::default();
        // Slow devices first: their links and their lateness are theirs, not the network's.
        let slow_devices = self.slow_devices(&ranks, &mut verdicts);
        self.slow_links(&links, &slow_devices, &mut verdicts);
        self.stragglers(&ranks, &slow_devices, &mut verdicts);
        let raised = self.update_streaks(verdicts, ops);
        self.remember(links, ranks);
        raised
    }

    /// Ranks whose device is slower than half the median device (3 ranks with data at least).
    fn slow_devices(&self, ranks: &[RankStat], verdicts: &mut Judged) -> Vec<usize> {
        let mut speeds: Vec<f32> = ranks.iter().filter_map(|r| r.device_gbps).collect();
        let Some(m) = median(&mut speeds).filter(|_| speeds.len() >= 3) else {
            return Vec::new();
        };
        let mut slow = Vec::new();
        for r in ranks {
            let Some(g) = r.device_gbps else { continue };
            verdicts.judged.push(Finding::SlowRank(r.rank));
            if g >= SLOW_DEVICE_FRACTION * m {
                continue;
            }
            verdicts.found.push((
                Finding::SlowRank(r.rank),
                format!(
                    "slow {}: its device reduces and copies at {g:.2} GB/s vs median {m:.2} GB/s (a slow rank, not a slow link)",
                    self.label(r.rank)
                ),
            ));
            slow.push(r.rank);
        }
        slow
    }

    /// Links slower than 0.6 of the median of comparable links (same-host or cross-host; all
    /// links where a class has too few), links of slow devices left out.
    fn slow_links(&self, links: &[LinkStat], slow_devices: &[usize], verdicts: &mut Judged) {
        for link in links {
            let finding = Finding::SlowLink {
                from: link.from,
                to: link.to,
            };
            if slow_devices.contains(&link.from) || slow_devices.contains(&link.to) {
                // Judged: its slowness is the device's.
                verdicts.judged.push(finding);
                continue;
            }
            let same_host = |l: &LinkStat| self.same_host(l.from, l.to);
            let others = || {
                links
                    .iter()
                    .filter(|l| (l.from, l.to) != (link.from, link.to))
            };
            let mut comparable: Vec<f32> = (others().filter(|l| same_host(l) == same_host(link)))
                .map(|l| l.gbps)
                .collect();
            if comparable.len() < 2 {
                comparable = others().map(|l| l.gbps).collect();
            }
            if comparable.len() < 2 {
                continue;
            }
            verdicts.judged.push(finding);
            if let Some(m) = median(&mut comparable)
                && link.gbps < SLOW_LINK_FRACTION * m
            {
                let host = self.peers.get(link.to).map_or("?", |p| p.hostname.as_str());
                verdicts.found.push((
                    finding,
                    format!(
                        "slow link rank {} → rank {} ({host}): its messages arrive at {:.2} GB/s vs median {m:.2} GB/s on comparable links",
                        link.from, link.to, link.gbps
                    ),
                ));
            }
        }
    }

    /// Ranks that arrive more than 5 ms after the median rank and 3 times later than any other.
    fn stragglers(&self, ranks: &[RankStat], slow_devices: &[usize], verdicts: &mut Judged) {
        let lateness: Vec<(usize, f32)> = ranks
            .iter()
            .filter_map(|r| r.lateness_ms.map(|l| (r.rank, l)))
            .collect();
        for &(rank, late) in &lateness {
            verdicts.judged.push(Finding::Straggler(rank));
            let others = (lateness.iter().filter(|(r, _)| *r != rank))
                .map(|(_, l)| *l)
                .fold(0f32, f32::max);
            if late > STRAGGLER_MIN_MS
                && late > STRAGGLER_FACTOR * others.max(1.0)
                && !slow_devices.contains(&rank)
            {
                verdicts.found.push((
                    Finding::Straggler(rank),
                    format!(
                        "straggler {}: arrives {late:.1} ms after the median rank at each collective (slow outside the library)",
                        self.label(rank)
                    ),
                ));
            }
        }
    }

    /// Keep each link's and rank's latest measured figures in the summary, so that a quiet
    /// window (no traffic) does not blank them.
    fn remember(&mut self, links: Vec<LinkStat>, ranks: Vec<RankStat>) {
        for link in links {
            let known =
                (self.summary.links.iter_mut()).find(|l| (l.from, l.to) == (link.from, link.to));
            match known {
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

    fn update_streaks(&mut self, verdicts: Judged, ops: u64) -> Vec<String> {
        let Judged { found, judged } = verdicts;
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
            // Found, or not judged this time (no data on it in this evaluation's windows):
            // the streak stands as it was.
            if found.iter().any(|(f, _)| f == finding) || !judged.contains(finding) {
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
