//! The entry point of the detector's benchmark (`bcl-core/benches/detector.rs`): rank 0's
//! work on one round of slow-node windows, one from every rank, as its health port does it
//! (each window decoded from its frame, handed to the detector) and its own window's close
//! (an evaluation). Not an API.

use super::{Detector, Summary, Window};
use crate::health::wire::{self, FrameReader, Message};
use crate::peers::RankInfo;
use bcl_backends::{DeviceCapabilities, DeviceInfo, Vendor};
use bcl_transport::PeerAddress;

/// Windows of a world of busy ranks, encoded, and the detector they go to.
#[derive(Debug)]
pub struct ReportRound {
    detector: Detector,
    frames: Vec<Vec<u8>>,
    /// The collective sequence number of the next round's first entry.
    seq: u32,
    entries: u32,
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
    /// `world` ranks in a ring, each window as a busy rank's in 500 ms: the rates of 16 large
    /// messages from each of its 2 neighbours, its device's bytes, and the entry times of
    /// `entries` sampled collectives.
    pub fn new(world: usize, entries: u32) -> Result<ReportRound, String> {
        let address = PeerAddress::new(Vec::new()).map_err(|e| e.to_string())?;
        let peers = (0..world).map(|r| rank_info(r, &address)).collect();
        Ok(ReportRound {
            detector: Detector::new(peers),
            frames: Vec::new(),
            seq: 0,
            entries,
        })
    }

    /// One round: every rank's window framed as it crosses the wire, then decoded and handed
    /// to the detector, then an evaluation. Returns the verdicts raised (none: alike ranks).
    pub fn run(&mut self) -> usize {
        let world = self.detector.world();
        let first = self.seq;
        self.seq = self.seq.wrapping_add(self.entries * 4);
        self.frames.clear();
        for rank in 0..world {
            let mut w = Window::new(rank as u32);
            w.ops = self.entries * 4;
            for peer in [(rank + world - 1) % world, (rank + 1) % world] {
                for k in 0..16 {
                    w.add_rate(peer, 10.0 + (k % 3) as f32);
                }
            }
            w.device_bytes = 1 << 30;
            w.device_secs = 0.1;
            for e in 0..self.entries {
                let at = 1_000_000 * u64::from(first / 4 + e) + (rank % 7) as u64;
                w.entries.push((first + 4 * e, at));
            }
            let framed = wire::encode(&Message::Window(w)).unwrap_or_default();
            self.frames.push(framed);
        }
        let mut reader = FrameReader::default();
        for frame in &self.frames {
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
