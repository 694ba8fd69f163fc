//! The TCP frame codec, pure: no sockets here.
//!
//! A frame is a 16-byte header followed by the payload:
//!
//! ```text
//!  0      4        12       16
//!  | BCLF | tag u64 | len u32 | payload (len bytes) ...
//! ```
//! (little endian). [`FrameDecoder`] says where the next bytes go (`want`), is told how many
//! arrived (`advance`), and hands out whole frames. A header with the wrong magic or a length
//! above the configured bound is an error before any payload is allocated.

use crate::transport::Tag;

pub const MAGIC: [u8; 4] = *b"BCLF";
pub const HEADER_LEN: usize = 16;

/// Encode a frame header.
pub fn encode_header(tag: Tag, len: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&MAGIC);
    h[4..12].copy_from_slice(&tag.to_le_bytes());
    h[12..16].copy_from_slice(&len.to_le_bytes());
    h
}

/// Why a byte stream is not a valid sequence of frames.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    BadMagic([u8; 4]),
    TooLong { len: usize, max: usize },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::BadMagic(m) => write!(f, "bad frame magic {m:02x?}"),
            DecodeError::TooLong { len, max } => {
                write!(f, "frame length {len} exceeds the limit of {max} bytes")
            }
        }
    }
}

enum State {
    Header {
        buf: [u8; HEADER_LEN],
        filled: usize,
    },
    Payload {
        tag: Tag,
        buf: Vec<u8>,
        filled: usize,
    },
}

/// Incremental frame decoder.
pub struct FrameDecoder {
    state: State,
    max_len: usize,
}

impl std::fmt::Debug for FrameDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameDecoder")
    }
}

/// A complete frame.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    pub tag: Tag,
    pub payload: Vec<u8>,
}

impl FrameDecoder {
    pub fn new(max_len: usize) -> Self {
        FrameDecoder {
            state: State::Header {
                buf: [0; HEADER_LEN],
                filled: 0,
            },
            max_len,
        }
    }

    /// Where the next received bytes must be written (never empty).
    pub fn want(&mut self) -> &mut [u8] {
        match &mut self.state {
            State::Header { buf, filled } => &mut buf[*filled..],
            State::Payload { buf, filled, .. } => &mut buf[*filled..],
        }
    }

    /// `n` bytes were written into `want()`. `take_buffer` supplies the payload buffer
    /// (from a pool) once a header announces its length. Returns a completed frame, if any.
    pub fn advance(
        &mut self,
        n: usize,
        take_buffer: impl FnOnce() -> Vec<u8>,
    ) -> Result<Option<Frame>, DecodeError> {
        match &mut self.state {
            State::Header { buf, filled } => {
                *filled += n;
                if *filled < HEADER_LEN {
                    return Ok(None);
                }
                let magic: [u8; 4] = [buf[0], buf[1], buf[2], buf[3]];
                if magic != MAGIC {
                    return Err(DecodeError::BadMagic(magic));
                }
                let mut tag = [0u8; 8];
                tag.copy_from_slice(&buf[4..12]);
                let len = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]) as usize;
                if len > self.max_len {
                    return Err(DecodeError::TooLong {
                        len,
                        max: self.max_len,
                    });
                }
                let tag = u64::from_le_bytes(tag);
                let mut payload = take_buffer();
                // A pooled buffer keeps its old length: shrinking it avoids zero-filling bytes
                // the socket is about to overwrite (only whole frames are handed out).
                if payload.len() >= len {
                    payload.truncate(len);
                } else {
                    payload.resize(len, 0);
                }
                if len == 0 {
                    let _header = self.reset();
                    return Ok(Some(Frame { tag, payload }));
                }
                self.state = State::Payload {
                    tag,
                    buf: payload,
                    filled: 0,
                };
                Ok(None)
            }
            State::Payload { buf, filled, .. } => {
                *filled += n;
                if *filled < buf.len() {
                    return Ok(None);
                }
                match self.reset() {
                    State::Payload { tag, buf, .. } => Ok(Some(Frame { tag, payload: buf })),
                    State::Header { .. } => Ok(None),
                }
            }
        }
    }

    /// The frame whose payload is being received: its tag, length and the bytes of it
    /// received so far.
    pub fn payload_progress(&self) -> Option<(Tag, usize, usize)> {
        match &self.state {
            State::Payload { tag, buf, filled } => Some((*tag, buf.len(), *filled)),
            State::Header { .. } => None,
        }
    }

    /// The payload of the frame in progress was received somewhere else (straight into a
    /// caller's memory): expect the next header, and take back the buffer it was not written
    /// into.
    pub fn payload_received_elsewhere(&mut self) -> Option<Vec<u8>> {
        match self.reset() {
            State::Payload { buf, .. } => Some(buf),
            State::Header { .. } => None,
        }
    }

    /// Expect a header next; returns the state left.
    fn reset(&mut self) -> State {
        std::mem::replace(
            &mut self.state,
            State::Header {
                buf: [0; HEADER_LEN],
                filled: 0,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feed `bytes` in pieces of the given sizes; collect frames or the first error.
    fn feed(bytes: &[u8], cuts: &[usize], max: usize) -> Result<Vec<Frame>, DecodeError> {
        let mut d = FrameDecoder::new(max);
        let mut out = Vec::new();
        let mut pos = 0;
        let mut cut = cuts.iter().cycle();
        while pos < bytes.len() {
            let want = d.want();
            let n = want
                .len()
                .min(bytes.len() - pos)
                .min(*cut.next().unwrap_or(&1))
                .max(1);
            want[..n].copy_from_slice(&bytes[pos..pos + n]);
            pos += n;
            if let Some(f) = d.advance(n, Vec::new)? {
                out.push(f);
            }
        }
        Ok(out)
    }

    proptest! {
        #[test]
        fn frames_survive_any_split(frames in proptest::collection::vec(
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..300)), 0..8),
            cuts in proptest::collection::vec(1usize..50, 1..10)) {
            let mut wire = Vec::new();
            for (tag, p) in &frames {
                wire.extend_from_slice(&encode_header(*tag, p.len() as u32));
                wire.extend_from_slice(p);
            }
            let got = feed(&wire, &cuts, 1 << 20).expect("valid stream");
            let want: Vec<Frame> = frames.into_iter().map(|(tag, payload)| Frame { tag, payload }).collect();
            prop_assert_eq!(got, want);
        }

        /// Garbage never panics and never allocates beyond the bound.
        #[test]
        fn garbage_is_an_error_or_bounded(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            match feed(&bytes, &[7], 64) {
                Ok(frames) => prop_assert!(frames.iter().all(|f| f.payload.len() <= 64)),
                Err(DecodeError::BadMagic(_)) | Err(DecodeError::TooLong { .. }) => {}
            }
        }
    }

    #[test]
    fn oversized_length_is_rejected_before_allocation() {
        let h = encode_header(1, u32::MAX);
        let err = feed(&h, &[16], 1024).expect_err("too long");
        assert_eq!(
            err,
            DecodeError::TooLong {
                len: u32::MAX as usize,
                max: 1024
            }
        );
        let err = feed(b"GET / HTTP/1.1\r\n\r\n", &[5], 1024).expect_err("bad magic");
        assert!(matches!(err, DecodeError::BadMagic(_)));
    }
}
