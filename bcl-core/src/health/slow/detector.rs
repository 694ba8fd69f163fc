//! The slow-node detector (on rank 0): every rank's windows in, verdicts out, with
//! hysteresis. Slow devices are judged first, because they also slow the messages into them.

use super::{
    ENTRY_CELLS, ENTRY_HISTORY, ENTRY_HISTORY_LEAST, HYSTERESIS, LATENESS_SAMPLES, LinkStat,
    RankStat, SLOW_DEVICE_FRACTION, SLOW_LINK_FRACTION, STRAGGLER_FACTOR, STRAGGLER_MIN_MS,
    Summary, Window,
};
use crate::peers::RankInfo;
use std::collections::{BTreeMap, HashMap, HashSet};

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
    /// Per sampled collective: how many ranks' entry times are known, and each rank's (µs
    /// since the epoch; 0: not yet), for the latest `history` collectives.
    entries: BTreeMap<u32, (usize, Vec<u64>)>,
    /// Collectives whose entry times are kept: at most [`ENTRY_CELLS`] times in all.
    history: usize,
    streaks: HashMap<Finding, Streak>,
    summary: Summary,
}

fn median(values: &mut [f32]) -> Option<f32> {
    values.sort_by(f32::total_cmp);
    median_of_sorted(values.len(), |i| values[i])
}

/// Sampled collectives whose entry times a detector of `world` ranks keeps, in `cells` times.
fn history(world: usize, cells: usize) -> usize {
    (cells / world.max(1)).clamp(ENTRY_HISTORY_LEAST, ENTRY_HISTORY)
}

/// The median of `n` sorted values, `at(i)` the i-th.
fn median_of_sorted(n: usize, at: impl Fn(usize) -> f32) -> Option<f32> {
    if n == 0 {
        return None;
    }
    Some(if n % 2 == 1 {
        at(n / 2)
    } else {
        (at(n / 2 - 1) + at(n / 2)) / 2.0
    })
}

/// The median of `sorted` with one value equal to `value` taken out (the others' median,
/// in O(log n) where sorting them afresh for each of n values was O(n² log n)).
fn median_without(sorted: &[f32], value: f32) -> Option<f32> {
    let gone = sorted.partition_point(|v| v.total_cmp(&value).is_lt());
    median_of_sorted(sorted.len().saturating_sub(1), |i| {
        sorted[if i < gone { i } else { i + 1 }]
    })
}

impl Detector {
    pub fn new(peers: Vec<RankInfo>) -> Self {
        Detector {
            history: history(peers.len(), ENTRY_CELLS),
            peers,
            pending: Vec::new(),
            entries: BTreeMap::new(),
            streaks: HashMap::new(),
            summary: Summary::default(),
        }
    }

    /// The ranks it watches.
    pub fn world(&self) -> usize {
        self.peers.len()
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
            let (known, times) = self
                .entries
                .entry(seq)
                .or_insert_with(|| (0, vec![0; world]));
            let at = at.max(1);
            if times[rank] == 0 {
                *known += 1;
            }
            times[rank] = at;
        }
        while self.entries.len() > self.history {
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
        let same_host = |l: &LinkStat| self.same_host(l.from, l.to);
        // Each class's rates sorted once (and all links'), so that a link's comparable
        // median is the class's without it: O(L log L) for L links, not O(L²).
        let sorted = |pick: &dyn Fn(&LinkStat) -> bool| {
            let mut rates: Vec<f32> = links.iter().filter(|l| pick(l)).map(|l| l.gbps).collect();
            rates.sort_by(f32::total_cmp);
            rates
        };
        let classes = [sorted(&|l| !same_host(l)), sorted(&|l| same_host(l))];
        let all = sorted(&|_| true);
        for link in links {
            let finding = Finding::SlowLink {
                from: link.from,
                to: link.to,
            };
            if slow_devices.binary_search(&link.from).is_ok()
                || slow_devices.binary_search(&link.to).is_ok()
            {
                // Judged: its slowness is the device's.
                verdicts.judged.push(finding);
                continue;
            }
            // The other links of its class, or all the others where its class has too few.
            let class = &classes[usize::from(same_host(link))];
            let comparable = if class.len() > 2 { class } else { &all };
            if comparable.len() < 3 {
                continue;
            }
            verdicts.judged.push(finding);
            if let Some(m) = median_without(comparable, link.gbps)
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
        // The latest two, so that "any other rank" is one look, not a pass over all.
        let (mut first, mut second) = ((usize::MAX, 0f32), 0f32);
        for &(rank, late) in &lateness {
            if late > first.1 {
                second = first.1;
                first = (rank, late);
            } else {
                second = second.max(late);
            }
        }
        for &(rank, late) in &lateness {
            verdicts.judged.push(Finding::Straggler(rank));
            let others = if rank == first.0 { second } else { first.1 };
            if late > STRAGGLER_MIN_MS
                && late > STRAGGLER_FACTOR * others.max(1.0)
                && slow_devices.binary_search(&rank).is_err()
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
        // The summary's links are sorted: each found by a binary search.
        let known = self.summary.links.len();
        for link in links {
            let key = (link.from, link.to);
            match self.summary.links[..known].binary_search_by_key(&key, |l| (l.from, l.to)) {
                Ok(i) => self.summary.links[i] = link,
                Err(_) => self.summary.links.push(link),
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
        let complete: Vec<&Vec<u64>> = self
            .entries
            .values()
            .rev()
            .filter(|(known, _)| *known == world)
            .map(|(_, times)| times)
            .take(LATENESS_SAMPLES)
            .collect();
        let mut late: Vec<Vec<f32>> = vec![Vec::new(); world];
        for entry in &complete {
            // µs since the epoch lose precision in f32: work relative to the earliest entry.
            let base = entry.iter().min().copied().unwrap_or(0);
            let mut times: Vec<f32> = entry.iter().map(|&t| (t - base) as f32).collect();
            let Some(m) = median(&mut times) else {
                continue;
            };
            for (rank, t) in entry.iter().enumerate() {
                late[rank].push(((t - base) as f32 - m) / 1000.0);
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
        let judged: HashSet<Finding> = judged.into_iter().collect();
        let found_now: HashSet<Finding> = found.iter().map(|(f, _)| *f).collect();
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
            if found_now.contains(finding) || !judged.contains(finding) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A detector over `world` ranks on hosts of 4.
    fn detector(world: usize) -> Detector {
        let peers = (0..world)
            .map(|r| {
                let mut p = RankInfo::for_tests(r, None);
                p.host_id = format!("h{}", r / 4);
                p
            })
            .collect();
        Detector::new(peers)
    }

    /// The definitions, pass by pass: each link against every other link of its class (all
    /// others where the class has fewer than two), each rank against every other rank.
    fn by_definition(
        d: &Detector,
        links: &[LinkStat],
        ranks: &[RankStat],
        slow: &[usize],
    ) -> Judged {
        let mut v = Judged::default();
        for link in links {
            let finding = Finding::SlowLink {
                from: link.from,
                to: link.to,
            };
            if slow.contains(&link.from) || slow.contains(&link.to) {
                v.judged.push(finding);
                continue;
            }
            let others: Vec<&LinkStat> = links
                .iter()
                .filter(|l| (l.from, l.to) != (link.from, link.to))
                .collect();
            let class = |l: &LinkStat| d.same_host(l.from, l.to);
            let mut comparable: Vec<f32> = (others.iter())
                .filter(|l| class(l) == class(link))
                .map(|l| l.gbps)
                .collect();
            if comparable.len() < 2 {
                comparable = others.iter().map(|l| l.gbps).collect();
            }
            if comparable.len() < 2 {
                continue;
            }
            v.judged.push(finding);
            // The median by its definition, not the detector's helpers.
            comparable.sort_by(f32::total_cmp);
            let n = comparable.len();
            let m = if n % 2 == 1 {
                comparable[n / 2]
            } else {
                (comparable[n / 2 - 1] + comparable[n / 2]) / 2.0
            };
            if link.gbps < SLOW_LINK_FRACTION * m {
                v.found.push((finding, format!("{m}")));
            }
        }
        for r in ranks {
            let Some(late) = r.lateness_ms else { continue };
            v.judged.push(Finding::Straggler(r.rank));
            let others = (ranks.iter())
                .filter(|o| o.rank != r.rank)
                .filter_map(|o| o.lateness_ms)
                .fold(0f32, f32::max);
            if late > STRAGGLER_MIN_MS
                && late > STRAGGLER_FACTOR * others.max(1.0)
                && !slow.contains(&r.rank)
            {
                v.found.push((Finding::Straggler(r.rank), String::new()));
            }
        }
        v
    }

    #[test]
    fn the_entry_times_kept_stay_within_their_bound_down_to_what_lateness_needs() {
        assert_eq!(history(4, ENTRY_CELLS), ENTRY_HISTORY);
        assert_eq!(history(10_000, ENTRY_CELLS), ENTRY_HISTORY);
        assert_eq!(history(100_000, ENTRY_CELLS), 167);
        assert_eq!(history(10_000_000, ENTRY_CELLS), 2 * LATENESS_SAMPLES);
        // A detector keeps no more than that: 40 ranks in 64 x 40 cells keep 64 collectives.
        let mut d = detector(40);
        d.history = history(40, 64 * 40);
        for rank in 0..40u32 {
            let mut w = Window::new(rank);
            w.entries = (0..200)
                .map(|seq| (seq, 1_000_000 + u64::from(seq)))
                .collect();
            d.add(w);
        }
        assert_eq!(d.entries.len(), 64);
        assert_eq!(d.entries.keys().next(), Some(&136), "the latest kept");
        assert!(d.entries.values().all(|(known, _)| *known == 40));
    }

    #[test]
    fn links_and_stragglers_are_judged_as_their_definitions_say() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let (mut found, mut cases) = (0, 0);
        for case in 0..400 {
            let world = 2 + next(22) as usize;
            let d = detector(world);
            // Few or many links, rates from a small set (ties) with a slow one now and then.
            let mut links: Vec<LinkStat> = Vec::new();
            for _ in 0..next(3 * world as u64 + 1) {
                let (from, to) = (next(world as u64) as usize, next(world as u64) as usize);
                if from == to || links.iter().any(|l| (l.from, l.to) == (from, to)) {
                    continue;
                }
                let gbps = if next(6) == 0 {
                    1.0
                } else {
                    8.0 + next(4) as f32
                };
                links.push(LinkStat {
                    from,
                    to,
                    gbps,
                    samples: 3,
                });
            }
            links.sort_by_key(|l| (l.from, l.to));
            let ranks: Vec<RankStat> = (0..world)
                .map(|rank| RankStat {
                    rank,
                    device_gbps: None,
                    lateness_ms: (next(4) != 0).then(|| match next(8) {
                        0 => 40.0 + next(40) as f32,
                        1 => -(next(5) as f32),
                        _ => next(3) as f32,
                    }),
                })
                .collect();
            let slow: Vec<usize> = (0..world).filter(|_| next(8) == 0).collect();
            let mut got = Judged::default();
            d.slow_links(&links, &slow, &mut got);
            d.stragglers(&ranks, &slow, &mut got);
            let want = by_definition(&d, &links, &ranks, &slow);
            let findings = |j: &Judged| j.found.iter().map(|(f, _)| *f).collect::<Vec<_>>();
            assert_eq!(findings(&got), findings(&want), "case {case}");
            assert_eq!(got.judged, want.judged, "case {case}");
            // The medians the lines quote are the definition's.
            for ((_, line), (_, m)) in got.found.iter().zip(&want.found) {
                assert!(
                    m.is_empty()
                        || line.contains(&format!("median {:.2}", m.parse::<f32>().expect("m"))),
                    "case {case}: {line} / {m}"
                );
            }
            found += want.found.len();
            cases += 1;
        }
        assert!(
            found > 50 && cases == 400,
            "the cases find something: {found}"
        );
    }
}
