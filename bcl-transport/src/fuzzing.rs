//! Entry points of the fuzz targets (`fuzz/`, run by `scripts/fuzz.sh`) and of the replay of
//! their corpus in `cargo test` (`tests/fuzz_corpus.rs`): each takes arbitrary bytes and feeds
//! them to one parser of bytes that come from outside this process, checking what must hold
//! whatever the bytes say (a panic is what libFuzzer reports). Not an API.

use crate::auth::{Secret, exchange};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The tcp frame decoder, fed `data` in the pieces the kernel might hand it (its first byte
/// picks the frame size limit, each next one the size of a read): every frame it completes
/// is within the limit, and an error ends the connection as the transport would.
pub fn tcp_frames(data: &[u8]) {
    let Some((&limit, mut rest)) = data.split_first() else {
        return;
    };
    let max = 1usize << (limit % 24);
    let mut decoder = crate::tcp::codec::FrameDecoder::new(max);
    while let Some((&piece, after)) = rest.split_first() {
        let want = decoder.want();
        let n = usize::from(piece).max(1).min(want.len()).min(after.len());
        if n == 0 {
            break;
        }
        want[..n].copy_from_slice(&after[..n]);
        rest = &after[n..];
        match decoder.advance(n, Vec::new) {
            Ok(Some(frame)) => assert!(frame.payload.len() <= max, "a frame over the limit"),
            Ok(None) => {
                if let Some((_, len, filled)) = decoder.payload_progress() {
                    assert!(len <= max && filled <= len, "a payload over the limit");
                }
            }
            Err(_) => return,
        }
    }
}

/// A stream that reads `input` and then reports the connection closed, and swallows writes.
struct Replay<'a> {
    input: &'a [u8],
    wrote: usize,
}

impl Read for Replay<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Replay<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.wrote += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The handshake's accepting side against a stranger who sends `data`: it is refused
/// (proving the secret needs this side's fresh nonce, which no recorded or invented
/// transcript holds), and the accepting side writes no more than its fixed replies.
pub fn handshake_server(data: &[u8]) {
    let mut s = Replay {
        input: data,
        wrote: 0,
    };
    let secret = Secret([0x42; 16]);
    assert!(
        exchange::server(&mut s, &secret, b"fuzz").is_err(),
        "a stranger's bytes passed the handshake"
    );
    assert!(s.wrote <= 4 + 16 + 32 + 4, "the server said too much");
}

/// The handshake's connecting side against a fake server that answers `data`: refused.
pub fn handshake_client(data: &[u8]) {
    let mut s = Replay {
        input: data,
        wrote: 0,
    };
    let secret = Secret([0x42; 16]);
    assert!(
        exchange::client(&mut s, &secret, b"fuzz").is_err(),
        "a fake server's bytes passed the handshake"
    );
}

/// A store server (one per process) and a client that proved the secret and then sends
/// `data` as requests: the server answers, drops the connection or waits for more, within
/// bounded time; afterwards a well-behaved client still sets and gets a key.
pub fn store_requests(data: &[u8]) {
    use crate::store::{Store, TcpStore, TcpStoreServer};
    use std::sync::OnceLock;
    static SERVER: OnceLock<Option<TcpStoreServer>> = OnceLock::new();
    let secret = Secret([0x24; 16]);
    let Some(server) = SERVER
        .get_or_init(|| TcpStoreServer::start(([127, 0, 0, 1], 0).into(), secret).ok())
        .as_ref()
    else {
        return;
    };
    let addr = server.addr();
    if let Ok(mut s) = TcpStream::connect(addr) {
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
        if exchange::client(&mut s, &secret, crate::store::AUTH_CONTEXT).is_ok() {
            let _ = s.write_all(data);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut sink = [0u8; 4096];
            let until = Instant::now() + Duration::from_millis(100);
            while Instant::now() < until {
                match s.read(&mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
    }
    let client = TcpStore::connect(addr, &secret, Instant::now() + Duration::from_secs(5))
        .expect("a client of the store after a stranger's requests");
    client
        .set("fuzz/check", b"ok")
        .expect("set after a stranger's requests");
    assert_eq!(
        client.try_get("fuzz/check").expect("get"),
        Some(b"ok".to_vec()),
        "the store lost a key"
    );
}

/// The shared-memory ring's consumer against a hostile producer (see `shm::ring`).
pub fn shm_ring(data: &[u8]) {
    crate::shm::fuzz_consumer(data);
}

/// The rdma setup exchange's record, a slot's chunk header, the immediate data and the frames
/// of a link moved to tcp, decoded from `data`: what decodes is within the limits the decoder
/// was given, and re-encodes to the same bytes (a frame's reason, once valid UTF-8).
#[cfg(feature = "rdma")]
pub fn rdma_wire(data: &[u8]) {
    use crate::rdma::wire::{
        ChunkHeader, ConnectionRecord, Immediate, RECORD_LEN, SLOT_HEADER, SocketFrame,
        advance_counter,
    };
    // A stream of frames, as a fallen-back link reads them, with slots of up to 4 KiB.
    let mut at = 0;
    while let Ok(Some((frame, used))) = SocketFrame::decode(&data[at..], 4096) {
        assert!(used > 0 && at + used <= data.len());
        if let SocketFrame::Chunk { slot, .. } = &frame {
            assert!((SLOT_HEADER..=4096).contains(&slot.len()));
        }
        // A reason that was not UTF-8 decodes with replacement characters, which may make it
        // longer than a frame carries: one round normalises it, the next changes nothing.
        let round = |f: &SocketFrame| {
            let mut bytes = Vec::new();
            f.encode_into(&mut bytes);
            let (again, used) = SocketFrame::decode(&bytes, 4096)
                .expect("an encoded frame decodes")
                .expect("an encoded frame is whole");
            assert_eq!(used, bytes.len());
            again
        };
        let normal = round(&frame);
        assert_eq!(
            round(&normal),
            normal,
            "a frame changed on its second round"
        );
        if !matches!(frame, SocketFrame::Failover { .. }) {
            assert_eq!(normal, frame, "a chunk or moved frame changed on the way");
        }
        at += used;
    }
    if let Some(bytes) = data.get(..RECORD_LEN) {
        let mut record = [0u8; RECORD_LEN];
        record.copy_from_slice(bytes);
        // Decoding keeps the PSN's 24 bits only: what decodes, decodes again to itself.
        if let Ok(r) = ConnectionRecord::decode(&record) {
            assert_eq!(
                ConnectionRecord::decode(&r.encode()),
                Ok(r),
                "a connection record changed on the way"
            );
        }
    }
    if data.len() >= 8 {
        let room = usize::from(u16::from_le_bytes([data[0], data[1]]));
        let max = usize::from(u16::from_le_bytes([data[2], data[3]])) << 8;
        if let Ok(h) = ChunkHeader::decode(&data[4..], room, max) {
            assert!(h.chunk_len as usize <= room && h.message_len as usize <= max);
            assert!(h.chunk_len <= h.message_len);
            assert_eq!(&h.encode()[..], &data[4..4 + SLOT_HEADER]);
        }
        let imm = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        let decoded = Immediate::decode(imm);
        assert_eq!(Immediate::decode(decoded.encode()), decoded);
        let known = u64::from(u32::from_le_bytes([data[0], data[1], data[2], data[3]]));
        assert!(advance_counter(known, imm) >= known, "credits went back");
    }
}
