//! Each simulated rank's channels: sends from it to one peer, their path, how many are in
//! flight and which wait their turn. Held per rank and found by scanning its peers, not in one
//! map keyed by (rank, peer): a 100k-rank run simulates 12,500 ranks with a dozen or more
//! peers each, and the map's probes (a cache miss for its control bytes, another for the
//! key) were about half of the engine loop's samples in the 256 MiB row (`perf annotate`). A rank talks to a few dozen peers at most in the plans that run at that scale;
//! past `SCAN` (32) peers (an all-to-all) a rank's channels are found through a map of its own.

use crate::fast_hash::FastMap;
use crate::network::Path;
use std::collections::VecDeque;

/// Peers of one rank scanned before it gets a map.
const SCAN: usize = 32;

/// Sends from one rank to one peer: their path (the same for all), how many are in flight,
/// and those waiting their turn as (simulated rank, step). A 100k-rank run queues tens of
/// millions of slices at once, so a queued send holds no more than its step.
#[derive(Debug)]
pub struct Channel {
    pub path: Path,
    pub busy: usize,
    pub queue: VecDeque<(u32, u32)>,
}

/// One rank's channels, in the order first used.
#[derive(Debug, Default)]
struct RankChannels {
    peers: Vec<u32>,
    channels: Vec<Channel>,
    /// Peer to index, once there are more than [`SCAN`].
    index: Option<FastMap<u32, u32>>,
}

impl RankChannels {
    fn find(&self, peer: u32) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(&peer).map(|&k| k as usize),
            None => self.peers.iter().position(|&p| p == peer),
        }
    }
}

/// The channels of every simulated rank, by its index in the run.
#[derive(Debug, Default)]
pub struct Channels {
    ranks: Vec<RankChannels>,
}

impl Channels {
    /// `sim`'s channel to `peer`, made with `path` on first use.
    pub fn get_or_insert(
        &mut self,
        sim: usize,
        peer: usize,
        path: impl FnOnce() -> Path,
    ) -> &mut Channel {
        if self.ranks.len() <= sim {
            self.ranks.resize_with(sim + 1, RankChannels::default);
        }
        let rank = &mut self.ranks[sim];
        let peer = u32::try_from(peer).expect("ranks fit in 32 bits");
        let k = match rank.find(peer) {
            Some(k) => k,
            None => {
                let k = rank.peers.len();
                rank.peers.push(peer);
                rank.channels.push(Channel {
                    path: path(),
                    busy: 0,
                    queue: VecDeque::new(),
                });
                if let Some(index) = &mut rank.index {
                    index.insert(peer, k as u32);
                } else if rank.peers.len() > SCAN {
                    let index = (rank.peers.iter().enumerate())
                        .map(|(k, &p)| (p, k as u32))
                        .collect();
                    rank.index = Some(index);
                }
                k
            }
        };
        &mut rank.channels[k]
    }

    /// `sim`'s channel to `peer`, if it has been used.
    pub fn get_mut(&mut self, sim: usize, peer: usize) -> Option<&mut Channel> {
        let rank = self.ranks.get_mut(sim)?;
        let k = rank.find(u32::try_from(peer).ok()?)?;
        Some(&mut rank.channels[k])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::Route;

    fn path(alpha: f64) -> Path {
        Path {
            resources: Route::new(),
            alpha,
        }
    }

    /// Channels are found again by (rank, peer), below and past the scan's limit, and each
    /// keeps its own path and state.
    #[test]
    fn each_rank_and_peer_finds_its_own_channel() {
        let mut c = Channels::default();
        let peers = 3 * SCAN;
        for sim in [0, 5] {
            for peer in 0..peers {
                let ch = c.get_or_insert(sim, peer * 7, || path((sim * 1000 + peer) as f64));
                ch.busy = sim + peer;
            }
        }
        assert!(c.get_mut(1, 0).is_none(), "rank 1 has no channels");
        assert!(c.get_mut(0, 1).is_none(), "no channel to peer 1");
        for sim in [0, 5] {
            for peer in 0..peers {
                let ch = c.get_mut(sim, peer * 7).expect("a channel");
                assert_eq!(ch.path.alpha, (sim * 1000 + peer) as f64);
                assert_eq!(ch.busy, sim + peer);
                // Found again, not made anew: the path given now is not taken.
                let again = c.get_or_insert(sim, peer * 7, || path(-1.0));
                assert_eq!(again.path.alpha, (sim * 1000 + peer) as f64);
            }
        }
    }
}
