//! The flight recorder: always on, bounded, the last operations of one communicator with
//! their signature, state, times and bytes per peer. Dumped as JSON when a fault hits.

use crate::exec::PeerBytes;
use crate::signature::Signature;
use serde::{Serialize, Serializer};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpState {
    Running,
    Done,
    Failed,
}

#[derive(Clone, Debug, Serialize)]
pub struct OpRecord {
    /// Written as "allreduce #57 (1048576 x float32 sum, 4 MiB)".
    #[serde(serialize_with = "as_text")]
    pub op: Signature,
    pub algorithm: &'static str,
    pub state: OpState,
    /// Microseconds since the communicator was created.
    pub start_us: u64,
    pub end_us: Option<u64>,
    pub peers: Vec<PeerBytes>,
    pub error: Option<String>,
}

fn as_text<S: Serializer>(op: &Signature, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(op)
}

/// The last `capacity` operations, oldest first.
#[derive(Debug)]
pub struct FlightRecorder {
    capacity: usize,
    records: VecDeque<OpRecord>,
    /// Operations recorded since creation (including those that fell off the end).
    total: u64,
}

impl FlightRecorder {
    pub fn new(capacity: usize) -> Self {
        FlightRecorder {
            capacity: capacity.max(1),
            records: VecDeque::with_capacity(capacity.clamp(1, 4096)),
            total: 0,
        }
    }

    /// Record the start of an operation.
    pub fn start(&mut self, op: Signature, algorithm: &'static str, start_us: u64) {
        // The oldest record's peer list is reused: no allocation per operation once full.
        let mut peers = match self.records.len() == self.capacity {
            true => self
                .records
                .pop_front()
                .map(|r| r.peers)
                .unwrap_or_default(),
            false => Vec::new(),
        };
        peers.clear();
        self.total += 1;
        self.records.push_back(OpRecord {
            op,
            algorithm,
            state: OpState::Running,
            start_us,
            end_us: None,
            peers,
            error: None,
        });
    }

    /// Record the end of the latest operation.
    pub fn finish(
        &mut self,
        end_us: u64,
        peers: impl IntoIterator<Item = PeerBytes>,
        error: Option<String>,
    ) {
        if let Some(last) = self.records.back_mut() {
            last.state = if error.is_some() {
                OpState::Failed
            } else {
                OpState::Done
            };
            last.end_us = Some(end_us);
            last.peers.clear();
            last.peers.extend(peers);
            last.error = error;
        }
    }

    pub fn records(&self) -> impl Iterator<Item = &OpRecord> {
        self.records.iter()
    }

    pub fn total(&self) -> u64 {
        self.total
    }
}

/// Write `report` as pretty JSON to `dir/name`; returns the path written.
pub fn dump(dir: &Path, name: &str, report: &serde_json::Value) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(&path, text)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_last_operations_and_their_outcome() {
        let mut r = FlightRecorder::new(3);
        for i in 0..5u64 {
            let op = Signature {
                seq: i as u32,
                collective: crate::Collective::Barrier,
                count: 0,
                dtype: bcl_backends::DataType::Uint8,
            };
            r.start(op, "ring", i * 10);
            let error = (i == 4).then(|| "rank 2 died".to_string());
            r.finish(
                i * 10 + 5,
                vec![PeerBytes {
                    peer: 1,
                    sent: i,
                    received: i,
                }],
                error,
            );
        }
        let ops: Vec<_> = r.records().map(|o| o.op.seq).collect();
        assert_eq!(ops, [2, 3, 4]);
        let json = serde_json::to_value(r.records().last().expect("one")).expect("json");
        assert_eq!(json["op"], "barrier #4 (0 x uint8, 0 B)");
        assert_eq!(json["state"], "failed");
        assert_eq!(r.total(), 5);
        let last = r.records().last().expect("one");
        assert_eq!(last.state, OpState::Failed);
        assert_eq!(last.peers[0].sent, 4);
    }
}
