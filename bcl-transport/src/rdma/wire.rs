//! What the rdma transport puts on the wire, as pure functions: the connection record two ranks
//! swap over the setup socket, the header at the start of every slot, and the immediate data.
//!
//! ```text
//!  slot (in the receiver's ring):  tag u64 | message length u32 | chunk length u32 | chunk bytes
//!  immediate of a data write:      0 | sequence number (31 bits)
//!  immediate of a credit return:   1 | slots freed so far (31 bits, wrapping)
//! ```

use super::verbs::Endpoint;

/// Bytes before the chunk in every slot.
pub const SLOT_HEADER: usize = 16;
const CREDIT_FLAG: u32 = 1 << 31;
const COUNTER_MASK: u32 = CREDIT_FLAG - 1;

/// What one rank tells a peer about its end of their connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionRecord {
    pub endpoint: Endpoint,
    /// The ring the peer writes into: address, key, slots and slot size.
    pub ring_addr: u64,
    pub ring_rkey: u32,
    pub slots: u32,
    pub slot_bytes: u32,
}

pub const RECORD_LEN: usize = 4 + 4 + 2 + 16 + 1 + 8 + 4 + 4 + 4;

impl ConnectionRecord {
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        let e = &self.endpoint;
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(&e.qp_num.to_le_bytes());
        put(&e.psn.to_le_bytes());
        put(&e.lid.to_le_bytes());
        put(&e.gid);
        put(&[e.mtu]);
        put(&self.ring_addr.to_le_bytes());
        put(&self.ring_rkey.to_le_bytes());
        put(&self.slots.to_le_bytes());
        put(&self.slot_bytes.to_le_bytes());
        out
    }

    /// Decode and check a peer's record: the slot geometry must be what this side can use.
    pub fn decode(bytes: &[u8; RECORD_LEN]) -> Result<Self, String> {
        let mut at = 0;
        let mut take = |n: usize| {
            let s = &bytes[at..at + n];
            at += n;
            s
        };
        let u32_at = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let qp_num = u32_at(take(4));
        let psn = u32_at(take(4));
        let lid_bytes = take(2);
        let lid = u16::from_le_bytes([lid_bytes[0], lid_bytes[1]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(take(16));
        let mtu = take(1)[0];
        let mut addr = [0u8; 8];
        addr.copy_from_slice(take(8));
        let ring_addr = u64::from_le_bytes(addr);
        let ring_rkey = u32_at(take(4));
        let slots = u32_at(take(4));
        let slot_bytes = u32_at(take(4));
        if !(1..=5).contains(&mtu) {
            return Err(format!("MTU code {mtu} is not a verbs MTU (1-5)"));
        }
        if qp_num == 0 || qp_num > 0xff_ffff {
            return Err(format!("QP number {qp_num} is out of range"));
        }
        if slots == 0 || slots > 1024 || (slot_bytes as usize) <= SLOT_HEADER {
            return Err(format!(
                "a ring of {slots} slots of {slot_bytes} bytes is not usable"
            ));
        }
        Ok(ConnectionRecord {
            endpoint: Endpoint {
                qp_num,
                psn: psn & 0xff_ffff,
                lid,
                gid,
                mtu,
            },
            ring_addr,
            ring_rkey,
            slots,
            slot_bytes,
        })
    }
}

/// The header of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub tag: u64,
    /// The whole message's length (equal in every chunk of it).
    pub message_len: u32,
    pub chunk_len: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; SLOT_HEADER] {
        let mut out = [0u8; SLOT_HEADER];
        out[..8].copy_from_slice(&self.tag.to_le_bytes());
        out[8..12].copy_from_slice(&self.message_len.to_le_bytes());
        out[12..].copy_from_slice(&self.chunk_len.to_le_bytes());
        out
    }

    /// Decode a header; `room` is the slot's space for chunk bytes.
    pub fn decode(bytes: &[u8], room: usize, max_message: usize) -> Result<Self, String> {
        if bytes.len() < SLOT_HEADER {
            return Err(format!("a slot of {} bytes has no header", bytes.len()));
        }
        let word =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&bytes[..8]);
        let header = ChunkHeader {
            tag: u64::from_le_bytes(tag),
            message_len: word(8),
            chunk_len: word(12),
        };
        if header.chunk_len as usize > room {
            return Err(format!(
                "chunk of {} bytes in a slot with room for {room}",
                header.chunk_len
            ));
        }
        if header.message_len as usize > max_message || header.chunk_len > header.message_len {
            return Err(format!(
                "chunk of {} bytes of a {}-byte message (limit {max_message})",
                header.chunk_len, header.message_len
            ));
        }
        Ok(header)
    }
}

/// What a write's immediate data says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Immediate {
    /// A chunk landed; the sender's sequence number, modulo 2^31.
    Data(u32),
    /// The receiver has freed this many slots in all (modulo 2^31).
    Credit(u32),
}

impl Immediate {
    pub fn encode(self) -> u32 {
        match self {
            Immediate::Data(seq) => seq & COUNTER_MASK,
            Immediate::Credit(freed) => CREDIT_FLAG | (freed & COUNTER_MASK),
        }
    }

    pub fn decode(imm: u32) -> Self {
        if imm & CREDIT_FLAG != 0 {
            Immediate::Credit(imm & COUNTER_MASK)
        } else {
            Immediate::Data(imm)
        }
    }
}

/// What the setup socket carries once a link has moved to tcp (see `fallback`): first each
/// side's `Failover` (how many of the peer's chunks it has taken, and why it moved), then the
/// peer's chunks from that number on, each as it would lie in a slot (header and bytes), and,
/// where the sender found another lane to the peer still on RDMA, `Moved` after its last chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketFrame {
    Failover {
        received: u64,
        reason: String,
    },
    Chunk {
        seq: u64,
        slot: Vec<u8>,
    },
    /// The sender sends nothing more over this link: its later messages go over lane `lane`.
    Moved {
        lane: u8,
    },
}

const FRAME_FAILOVER: u8 = 1;
const FRAME_CHUNK: u8 = 2;
const FRAME_MOVED: u8 = 3;
/// The longest reason a `Failover` frame carries.
pub const MAX_REASON: usize = 1024;

impl SocketFrame {
    /// Append the frame's bytes to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            SocketFrame::Failover { received, reason } => {
                // Cut at a character boundary: the peer reads the reason as UTF-8.
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                let reason = &reason.as_bytes()[..end];
                out.push(FRAME_FAILOVER);
                out.extend_from_slice(&received.to_le_bytes());
                out.extend_from_slice(&(reason.len() as u16).to_le_bytes());
                out.extend_from_slice(reason);
            }
            SocketFrame::Chunk { seq, slot } => encode_chunk(out, *seq, &[slot]),
            SocketFrame::Moved { lane } => out.extend_from_slice(&[FRAME_MOVED, *lane]),
        }
    }

    /// The first frame in `bytes` and its length; `Ok(None)`: incomplete. A chunk longer than
    /// `slot_bytes` or an unknown kind is an error.
    pub fn decode(bytes: &[u8], slot_bytes: usize) -> Result<Option<(SocketFrame, usize)>, String> {
        let Some(&kind) = bytes.first() else {
            return Ok(None);
        };
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(w)
        };
        match kind {
            FRAME_FAILOVER => {
                if bytes.len() < 11 {
                    return Ok(None);
                }
                let len = u16::from_le_bytes([bytes[9], bytes[10]]) as usize;
                if len > MAX_REASON {
                    return Err(format!(
                        "a failover reason of {len} bytes (limit {MAX_REASON})"
                    ));
                }
                if bytes.len() < 11 + len {
                    return Ok(None);
                }
                let reason = String::from_utf8_lossy(&bytes[11..11 + len]).into_owned();
                let received = u64_at(1);
                Ok(Some((SocketFrame::Failover { received, reason }, 11 + len)))
            }
            FRAME_CHUNK => {
                if bytes.len() < 13 {
                    return Ok(None);
                }
                let len = u32::from_le_bytes([bytes[9], bytes[10], bytes[11], bytes[12]]) as usize;
                if !(SLOT_HEADER..=slot_bytes).contains(&len) {
                    return Err(format!(
                        "a chunk frame of {len} bytes (a slot holds {SLOT_HEADER}..={slot_bytes})"
                    ));
                }
                if bytes.len() < 13 + len {
                    return Ok(None);
                }
                let slot = bytes[13..13 + len].to_vec();
                Ok(Some((
                    SocketFrame::Chunk {
                        seq: u64_at(1),
                        slot,
                    },
                    13 + len,
                )))
            }
            FRAME_MOVED => Ok(bytes.get(1).map(|&lane| (SocketFrame::Moved { lane }, 2))),
            other => Err(format!(
                "a frame of unknown kind {other} on the rdma setup socket"
            )),
        }
    }
}

/// A chunk frame from the slot's bytes (header and chunk, in `parts`), without building a
/// `SocketFrame`.
pub fn encode_chunk(out: &mut Vec<u8>, seq: u64, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.push(FRAME_CHUNK);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// The new total of freed slots, from the last known total and a reported one (both counted
/// modulo 2^31): credits only grow, so the report is the smallest total ≥ `known` that matches.
pub fn advance_counter(known: u64, reported: u32) -> u64 {
    let delta = (reported.wrapping_sub(known as u32)) & COUNTER_MASK;
    known + u64::from(delta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> ConnectionRecord {
        ConnectionRecord {
            endpoint: Endpoint {
                qp_num: 0x11,
                psn: 0x9f902f,
                lid: 0,
                gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 251, 0, 1],
                mtu: 3,
            },
            ring_addr: 0x7f63_6a26_0000,
            ring_rkey: 0x5d2,
            slots: 16,
            slot_bytes: 256 << 10,
        }
    }

    #[test]
    fn connection_records_round_trip_and_bad_ones_are_named() {
        let r = record();
        assert_eq!(ConnectionRecord::decode(&r.encode()), Ok(r));
        let mut bad = r;
        bad.endpoint.mtu = 9;
        let e = ConnectionRecord::decode(&bad.encode()).expect_err("mtu 9");
        assert!(e.contains("MTU code 9"), "{e}");
        let mut bad = r;
        bad.slots = 0;
        let e = ConnectionRecord::decode(&bad.encode()).expect_err("no slots");
        assert!(e.contains("0 slots"), "{e}");
        let mut bad = r;
        bad.endpoint.qp_num = 0;
        assert!(ConnectionRecord::decode(&bad.encode()).is_err());
    }

    #[test]
    fn socket_frames_round_trip_in_pieces_and_bad_ones_are_named() {
        let frames = [
            SocketFrame::Failover {
                received: 1 << 40,
                reason: "write completed with error: retry exceeded".into(),
            },
            SocketFrame::Chunk {
                seq: 7,
                slot: (0..SLOT_HEADER as u8 + 5).collect(),
            },
            SocketFrame::Moved { lane: 3 },
        ];
        let whole = |b: &[u8]| {
            SocketFrame::decode(b, 64)
                .expect("a valid frame")
                .expect("a whole frame")
        };
        let mut bytes = Vec::new();
        for f in &frames {
            f.encode_into(&mut bytes);
        }
        // Every prefix short of a frame is incomplete, never an error.
        let first_len = whole(&bytes).1;
        for cut in 0..first_len {
            assert_eq!(
                SocketFrame::decode(&bytes[..cut], 64),
                Ok(None),
                "cut {cut}"
            );
        }
        let (a, n) = whole(&bytes);
        let (b, m) = whole(&bytes[n..]);
        let (c, l) = whole(&bytes[n + m..]);
        assert_eq!([a, b, c], frames);
        assert_eq!(n + m + l, bytes.len());
        assert_eq!(SocketFrame::decode(&bytes[n + m..n + m + 1], 64), Ok(None));
        // A chunk larger than a slot, one shorter than a header, an unknown kind.
        assert!(
            SocketFrame::decode(&bytes[n..], 20)
                .expect_err("a bad frame")
                .contains("21 bytes")
        );
        let mut short = Vec::new();
        encode_chunk(&mut short, 1, &[&[0; 3]]);
        assert!(
            SocketFrame::decode(&short, 64)
                .expect_err("a bad frame")
                .contains("3 bytes")
        );
        assert!(
            SocketFrame::decode(&[9, 0], 64)
                .expect_err("a bad frame")
                .contains("unknown kind 9")
        );
        let mut long = vec![FRAME_FAILOVER];
        long.extend_from_slice(&0u64.to_le_bytes());
        long.extend_from_slice(&(MAX_REASON as u16 + 1).to_le_bytes());
        assert!(
            SocketFrame::decode(&long, 64)
                .expect_err("a bad frame")
                .contains("limit")
        );
    }

    #[test]
    fn chunk_headers_that_overrun_their_slot_or_message_are_refused() {
        let h = ChunkHeader {
            tag: 0xdead_beef_0042,
            message_len: 1000,
            chunk_len: 600,
        };
        assert_eq!(ChunkHeader::decode(&h.encode(), 600, 1 << 20), Ok(h));
        let e = ChunkHeader::decode(&h.encode(), 599, 1 << 20).expect_err("room");
        assert!(e.contains("room for 599"), "{e}");
        let e = ChunkHeader::decode(&h.encode(), 600, 999).expect_err("limit");
        assert!(e.contains("limit 999"), "{e}");
        let long = ChunkHeader {
            chunk_len: 1001,
            ..h
        };
        assert!(ChunkHeader::decode(&long.encode(), 2000, 1 << 20).is_err());
        assert!(ChunkHeader::decode(&[0u8; 3], 10, 10).is_err());
    }

    proptest! {
        #[test]
        fn immediates_round_trip(seq in 0u32..(1 << 31), freed in 0u32..(1 << 31)) {
            prop_assert_eq!(Immediate::decode(Immediate::Data(seq).encode()), Immediate::Data(seq));
            prop_assert_eq!(
                Immediate::decode(Immediate::Credit(freed).encode()),
                Immediate::Credit(freed)
            );
        }

        #[test]
        fn counters_advance_across_the_wrap(known in 0u64..(1 << 40), step in 0u64..(1 << 20)) {
            let reported = ((known + step) & u64::from(COUNTER_MASK)) as u32;
            prop_assert_eq!(advance_counter(known, reported), known + step);
        }
    }
}
