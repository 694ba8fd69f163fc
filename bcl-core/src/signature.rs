//! The signature of one operation: what a rank believes it is doing (sequence number,
//! collective, count, dtype, reduce op, root). Every operation's first message to each peer is
//! its signature, so two ranks that disagree find out on their first exchange, before any data
//! is reduced, without an extra round trip.

use crate::schedule::Collective;
use crate::units::human_bytes;
use bcl_backends::{DataType, ReduceOp};
use std::fmt;

/// What one rank runs as its `seq`-th operation of a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The communicator's collective sequence number, or for send/recv the per-peer,
    /// per-direction one.
    pub seq: u32,
    pub collective: Collective,
    pub count: u64,
    pub dtype: DataType,
}

/// Bytes of an encoded signature.
pub const SIGNATURE_BYTES: usize = 24;

const NO_ROOT: u32 = u32::MAX;

impl Signature {
    pub fn encode(&self) -> [u8; SIGNATURE_BYTES] {
        let mut out = [0u8; SIGNATURE_BYTES];
        out[0] = kind_code(&self.collective);
        out[1] = self
            .collective
            .reduce_op()
            .map_or(0xff, |op| index_of(&ReduceOp::ALL, &op));
        out[2] = index_of(&DataType::ALL, &self.dtype);
        out[4..8].copy_from_slice(&self.seq.to_le_bytes());
        let root = self
            .collective
            .root()
            .map_or(NO_ROOT, |r| u32::try_from(r).unwrap_or(NO_ROOT - 1));
        out[8..12].copy_from_slice(&root.to_le_bytes());
        out[16..24].copy_from_slice(&self.count.to_le_bytes());
        out
    }

    /// Decode a peer's signature; `None` when the bytes are not one.
    pub fn decode(bytes: &[u8]) -> Option<Signature> {
        if bytes.len() != SIGNATURE_BYTES {
            return None;
        }
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let seq = word(4);
        let root = word(8) as usize;
        let count = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
        let dtype = *DataType::ALL.get(usize::from(bytes[2]))?;
        let op = || ReduceOp::ALL.get(usize::from(bytes[1])).copied();
        let collective = match bytes[0] {
            0 => Collective::AllReduce { op: op()? },
            1 => Collective::AllGather,
            2 => Collective::ReduceScatter { op: op()? },
            3 => Collective::Broadcast { root },
            4 => Collective::Reduce { op: op()?, root },
            5 => Collective::AllToAll,
            6 => Collective::Send { peer: root },
            7 => Collective::Recv { peer: root },
            8 => Collective::Barrier,
            9 => Collective::Gather { root },
            10 => Collective::Scatter { root },
            11 => Collective::AllToAllV,
            12 => Collective::AllGatherV,
            13 => Collective::ReduceScatterV { op: op()? },
            _ => return None,
        };
        Some(Signature {
            seq,
            collective,
            count,
            dtype,
        })
    }

    /// Whether `theirs`, received from rank `peer`, is the counterpart of this signature on
    /// rank `me`: the same collective call, or the send matching this receive (and back).
    pub fn matches(&self, me: usize, peer: usize, theirs: &Signature) -> bool {
        let same_data =
            self.seq == theirs.seq && self.count == theirs.count && self.dtype == theirs.dtype;
        match (self.collective, theirs.collective) {
            (Collective::Send { peer: to }, Collective::Recv { peer: from })
            | (Collective::Recv { peer: from }, Collective::Send { peer: to }) => {
                same_data && (to == peer || from == peer) && (to == me || from == me)
            }
            (mine, other) => same_data && mine == other && !mine.is_point_to_point(),
        }
    }
}

fn kind_code(c: &Collective) -> u8 {
    match c {
        Collective::AllReduce { .. } => 0,
        Collective::AllGather => 1,
        Collective::ReduceScatter { .. } => 2,
        Collective::Broadcast { .. } => 3,
        Collective::Reduce { .. } => 4,
        Collective::AllToAll => 5,
        Collective::Send { .. } => 6,
        Collective::Recv { .. } => 7,
        Collective::Barrier => 8,
        Collective::Gather { .. } => 9,
        Collective::Scatter { .. } => 10,
        Collective::AllToAllV => 11,
        Collective::AllGatherV => 12,
        Collective::ReduceScatterV { .. } => 13,
    }
}

fn index_of<T: PartialEq>(all: &[T], x: &T) -> u8 {
    all.iter().position(|a| a == x).map_or(0xff, |i| i as u8)
}

impl fmt::Display for Signature {
    /// "allreduce #57 (1048576 x float32 sum, 4 MiB)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = usize::try_from(self.count)
            .unwrap_or(usize::MAX)
            .saturating_mul(self.dtype.size());
        write!(
            f,
            "{} #{} ({} x {}",
            self.collective.name(),
            self.seq,
            self.count,
            self.dtype
        )?;
        if let Some(op) = self.collective.reduce_op() {
            write!(f, " {op}")?;
        }
        match self.collective {
            Collective::Broadcast { root }
            | Collective::Reduce { root, .. }
            | Collective::Gather { root }
            | Collective::Scatter { root } => write!(f, ", root {root}")?,
            Collective::Send { peer } => write!(f, " to rank {peer}")?,
            Collective::Recv { peer } => write!(f, " from rank {peer}")?,
            _ => {}
        }
        write!(f, ", {})", human_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_collectives() -> Vec<Collective> {
        let mut out = vec![
            Collective::AllGather,
            Collective::AllToAll,
            Collective::Barrier,
        ];
        for op in ReduceOp::ALL {
            out.push(Collective::AllReduce { op });
            out.push(Collective::ReduceScatter { op });
            out.push(Collective::Reduce { op, root: 3 });
            out.push(Collective::ReduceScatterV { op });
        }
        out.extend([
            Collective::Broadcast { root: 2 },
            Collective::Gather { root: 1 },
            Collective::Scatter { root: 0 },
            Collective::AllToAllV,
            Collective::AllGatherV,
            Collective::Send { peer: 1 },
            Collective::Recv { peer: 0 },
        ]);
        out
    }

    #[test]
    fn every_signature_survives_encoding() {
        for collective in all_collectives() {
            for dtype in DataType::ALL {
                let s = Signature {
                    seq: 0xdead_beef,
                    collective,
                    count: (1 << 40) + 7,
                    dtype,
                };
                assert_eq!(Signature::decode(&s.encode()), Some(s), "{s}");
            }
        }
    }

    #[test]
    fn garbage_is_not_a_signature() {
        assert_eq!(Signature::decode(&[0u8; 23]), None);
        let mut bad = [0u8; SIGNATURE_BYTES];
        bad[0] = 99;
        assert_eq!(Signature::decode(&bad), None);
        bad[0] = 0;
        bad[2] = 77;
        assert_eq!(Signature::decode(&bad), None);
    }

    #[test]
    fn any_difference_is_a_mismatch_and_send_matches_recv() {
        let base = Signature {
            seq: 5,
            collective: Collective::AllReduce { op: ReduceOp::Sum },
            count: 100,
            dtype: DataType::Float32,
        };
        assert!(base.matches(0, 1, &base));
        let variants = [
            Signature { seq: 6, ..base },
            Signature { count: 101, ..base },
            Signature {
                dtype: DataType::Float64,
                ..base
            },
            Signature {
                collective: Collective::AllReduce { op: ReduceOp::Max },
                ..base
            },
            Signature {
                collective: Collective::Barrier,
                ..base
            },
        ];
        for v in variants {
            assert!(!base.matches(0, 1, &v), "{v} should not match {base}");
        }
        let bcast = |root| Signature {
            collective: Collective::Broadcast { root },
            ..base
        };
        assert!(!bcast(0).matches(0, 1, &bcast(1)));
        let send = Signature {
            collective: Collective::Send { peer: 1 },
            ..base
        };
        let recv = Signature {
            collective: Collective::Recv { peer: 0 },
            ..base
        };
        assert!(send.matches(0, 1, &recv));
        assert!(recv.matches(1, 0, &send));
        assert!(!send.matches(0, 1, &send));
        assert!(!send.matches(0, 1, &Signature { count: 1, ..recv }));
    }
}
