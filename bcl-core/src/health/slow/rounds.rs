//! The entry points of the detector's benchmark (`bcl-core/benches/detector.rs`): one round
//! of slow-node windows, one from every rank, framed as the senders put them on the wire
//! ([`frames`]), and rank 0's work on them ([`ReportRound::take`]): each decoded from its frame
//! and handed to the detector as its health port does, then its own window's close (an
//! evaluation). Not an API.

use super::{Detector, Summary, Window};
use crate::health::wire::{self, FrameReader, Message};
use crate::peers::RankInfo;
use bcl_backends::{DeviceCapabilities, DeviceInfo, Vendor};
use bcl_transport::PeerAddress;

/// Rank 0's detector over a world of busy ranks.
#[derive(Debug)]
pub struct ReportRound {
    detector: Detector,
}

/// Round `round`'s windows of `world` ranks in a ring, framed, each as a busy rank's in
/// 500 ms: the rates of 16 large messages from each of its 2 neighbours, its device's bytes,
/// and the entry times of `entries` sampled collectives (one in four of the round's).
pub fn frames(world: usize, entries: u32, round: u32) -> Vec<Vec<u8>> {
    let first = round.wrapping_mul(entries * 4);
    (0..world)
        .map(|rank| {
            let mut w = Window::new(rank as u32);
            w.ops = entries * 4;
            for peer in [(rank + world - 1) % world, (rank + 1) % world] {
                for k in 0..16 {
                    w.add_rate(peer, 10.0 + (k % 3) as f32);
                }
            }
            w.device_bytes = 1 << 30;
            w.device_secs = 0.1;
            for e in 0..entries {
                let at = 1_000_000 * u64::from(first / 4 + e) + (rank % 7) as u64;
                w.entries.push((first + 4 * e, at));
            }
            wire::encode(&Message::Window(w)).unwrap_or_default()
        })
        .collect()
}

/// A cpu rank on host `h<rank / 8>`, as the rendezvous table gives it.
fn rank_info(rank: usize, address: &PeerAddress) -> RankInfo {
    let host = format!("h{}", rank / 8);
    RankInfo {
        rank,
        hostname: host.clone(),
        host_id: host.clone(),
        pid: 100 + rank as u32,
        nic: None,
        device: DeviceInfo {
            vendor: Vendor::Cpu,
            model: String::new(),
            index: (rank % 8) as u32,
            host_id: host,
            capabilities: DeviceCapabilities {
                host_addressable: true,
                external_memory: false,
                copy_gbps: None,
                reduce_gbps: None,
            },
        },
        address: address.clone(),
        health: None,
    }
}

impl ReportRound {
    /// Rank 0's detector for `world` ranks.
    pub fn new(world: usize) -> Result<ReportRound, String> {
        let address = PeerAddress::new(Vec::new()).map_err(|e| e.to_string())?;
        let peers = (0..world).map(|r| rank_info(r, &address)).collect();
        Ok(ReportRound {
            detector: Detector::new(peers),
        })
    }

    /// Rank 0's work on a round of `frames`: each decoded and handed to the detector, then an
    /// evaluation. Returns the verdicts raised (none: alike ranks).
    pub fn take(&mut self, frames: &[Vec<u8>]) -> usize {
        let mut reader = FrameReader::default();
        for frame in frames {
            reader.push(frame);
            while let Ok(Some(Message::Window(w))) = reader.next_message() {
                self.detector.add(w);
            }
        }
        self.detector.evaluate().len()
    }

    /// The bytes of rank 0's whole summary, framed, and of the parts it answers its
    /// children's reports with in a window (their subtrees in the reports' default tree).
    pub fn summary_bytes(&self) -> (usize, usize) {
        let size = |s: Summary| wire::encode(&Message::Summary(s)).map_or(0, |f| f.len());
        let whole = self.detector.summary();
        let (world, fanout) = (self.detector.world(), crate::tree::FANOUT);
        let parts = crate::tree::children(0, world, fanout)
            .map(|c| size(whole.of_subtree(|r| crate::tree::in_subtree(r, c, fanout))))
            .sum();
        (size(whole.clone()), parts)
    }
}
