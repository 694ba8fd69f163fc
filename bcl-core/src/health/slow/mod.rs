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
//! be absent from 3 to clear, so one noisy sample raises nothing. Only evaluations with data
//! on it count: rank 0 evaluates when its own window closes, with the windows the others
//! have sent by then, and a report that arrives late must not break a streak.

mod detector;
mod rounds;

pub(crate) use detector::Detector;
#[doc(hidden)]
pub use rounds::{ReportRound, frames};

use super::verdict::rank_list;
#[cfg(test)]
use crate::peers::RankInfo;
use serde::{Deserialize, Serialize};

/// Rate samples kept per link and window.
const SAMPLES_PER_LINK: usize = 64;
/// A link slower than this fraction of the median of comparable links is suspect.
pub(super) const SLOW_LINK_FRACTION: f32 = 0.6;
/// A device slower than this fraction of the median device is suspect.
pub(super) const SLOW_DEVICE_FRACTION: f32 = 0.5;
/// A straggler arrives at least this much later than the median rank...
pub(super) const STRAGGLER_MIN_MS: f32 = 5.0;
/// ...and this many times later than any other rank.
pub(super) const STRAGGLER_FACTOR: f32 = 3.0;
/// Evaluations a finding must persist to raise, and be absent to clear.
pub(super) const HYSTERESIS: u32 = 3;
/// Entry times are recorded for one collective in four, chosen by a hash of the sequence
/// number so that a periodic pattern of calls (allreduce, barrier, allreduce, ...) is sampled
/// evenly...
pub(crate) fn entry_sampled(seq: u32) -> bool {
    seq.wrapping_mul(0x9E37_79B9) >> 30 == 0
}
/// ...and kept for this many of those, enough to overlap the windows of ranks that report at
/// different moments...
pub(super) const ENTRY_HISTORY: usize = 512;
/// ...as long as their times (8 bytes a rank) stay within this many, so that rank 0 holds at
/// most 128 MiB of them (beyond 32k ranks, fewer collectives)...
pub(super) const ENTRY_CELLS: usize = 1 << 24;
/// ...and never fewer than this many collectives: twice those the lateness needs complete.
pub(super) const ENTRY_HISTORY_LEAST: usize = 2 * LATENESS_SAMPLES;
/// Complete collectives (every rank's entry known) the lateness is computed over.
pub(super) const LATENESS_SAMPLES: usize = 32;

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
/// the verdicts in force. Rank 0 holds all of it; every other rank the part about its own
/// subtree of the reports' tree (links into or out of it, its ranks) and every verdict
/// (`Summary::of_subtree`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub links: Vec<LinkStat>,
    pub ranks: Vec<RankStat>,
    pub verdicts: Vec<String>,
    /// Verdicts raised since the communicator started (cleared ones included).
    pub raised_total: u32,
    pub evaluations: u32,
}

impl Summary {
    /// The part a child whose subtree holds the ranks `inside` gets in answer to its report:
    /// the links into or out of the subtree, its ranks, every verdict and count. Whole, the
    /// summary went to every child at every level; by subtrees, a level's parents send about
    /// one summary between them (docs/scale.md).
    pub(crate) fn of_subtree(&self, inside: impl Fn(usize) -> bool) -> Summary {
        Summary {
            links: (self.links.iter())
                .filter(|l| inside(l.from) || inside(l.to))
                .cloned()
                .collect(),
            ranks: (self.ranks.iter())
                .filter(|r| inside(r.rank))
                .cloned()
                .collect(),
            verdicts: self.verdicts.clone(),
            raised_total: self.raised_total,
            evaluations: self.evaluations,
        }
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

    fn peers(world: usize) -> Vec<RankInfo> {
        (0..world).map(|r| RankInfo::for_tests(r, None)).collect()
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
    fn a_slow_rank_whose_reports_come_late_is_still_named() {
        // Rank 0 evaluates when its own window closes: rank 3's reports reach it only every
        // other time, two at once. The evaluations without them have no data on rank 3.
        let mut d = Detector::new(peers(4));
        let make = |s| windows(s, |_| 8.0, |r| if r == 3 { 0.5 } else { 10.0 }, |_| 0);
        let mut late = Vec::new();
        let mut raised = Vec::new();
        for i in 0..6u32 {
            for w in make(i * 10..i * 10 + 10) {
                if w.rank == 3 {
                    late.push(w);
                } else {
                    d.add(w);
                }
            }
            if i % 2 == 1 {
                late.drain(..).for_each(|w| d.add(w));
            }
            raised.extend(d.evaluate());
        }
        assert_eq!(raised.len(), 1, "{raised:?}");
        assert!(
            raised[0].starts_with("slow rank 3 (host h3"),
            "{}",
            raised[0]
        );
        // And it clears once three evaluations with rank 3's data find it healthy.
        run(&mut d, 3, |s| windows(s, |_| 8.0, |_| 10.0, |_| 0));
        assert!(
            d.summary().verdicts.is_empty(),
            "{:?}",
            d.summary().verdicts
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
