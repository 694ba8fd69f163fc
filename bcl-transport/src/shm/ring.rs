//! One single-producer / single-consumer byte ring in a shared segment: the layout, and the two
//! halves of its protocol.
//!
//! ```text
//!   0     header, written once by the consumer (creator): magic (last), version, capacity,
//!         ranks, the consumer's pid, the creator's proof of the communicator secret
//!   128   producer's line: tail, attached, closed, pid, the producer's proof, where that
//!         proof lies in the producer's memory (for the consumer's single-copy probe)
//!   256   consumer's line: head, closed, whether the consumer can read the producer's memory
//!   384   consumer_parked, alone on its line
//!   512   producer_parked, alone on its line
//!   640   lender_parked (the producer waits for a loan to come back), alone on its line
//!   1024  returns: 64 words, the consumer's, each the number of the last loan it gave back
//!         with that number modulo 64
//!   4096  lines: small messages with their flags (see `lines.rs`), written by the producer
//!   12288 data: `capacity` bytes (a power of two) of records
//! ```
//!
//! A record is a 16-byte header (tag u64, fragment length u32, flags u32) and the fragment's
//! bytes, padded to 16. A record never wraps: where one would not fit before the end of the data
//! area, a skip record fills the rest and the record starts at offset 0, so the consumer can
//! hand out every payload as one contiguous slice. `tail` and `head` count bytes
//! ever written and consumed: `tail - head` is in use. The producer writes records into free
//! space and publishes them with a release store of `tail`; the consumer reads up to an acquire
//! load of `tail` and frees the space with a release store of `head`. Each side writes only its
//! own lines, so the two never share a cache line they both write; the `parked` flags, read
//! after every publication but written only around a sleep, have lines of their own so that
//! reading them does not miss each time the other side moves `tail` or `head`.
//!
//! Loans (single copy): a record flagged LOAN carries no data but where the data lies in the
//! producer's memory (address, length, the loan's number); the consumer copies it from there
//! straight into its destination with `process_vm_readv` and then stores the number in its
//! return word, which the producer waits for before it touches those bytes again. The producer
//! lends only where the consumer said at setup that it can read its memory (the ptrace rules
//! may refuse it): it read the producer's proof from the address the producer gave.
//!
//! Parking without lost wake-ups: a side about to sleep sets its `parked` flag, fences, and
//! looks once more; the other side, after publishing, fences and rings the sleeper's doorbell if
//! the flag is set. Either the sleeper sees the new data or the publisher sees the flag.
//!
//! The protocol is what makes the segment's unsafe accessors sound here: every call names
//! the rule that gives this side the range.
#![allow(unsafe_code)]

use super::lines;
use super::sys::Segment;
use crate::transport::Tag;
use std::sync::atomic::{Ordering, fence};

pub const MAGIC: u64 = 0x6263_6c2d_7368_6d31; // "bcl-shm1"
pub const VERSION: u32 = 3;
pub const DATA: usize = super::lines::LINES + super::lines::AREA;
pub const RECORD_HEADER: usize = 16;
const FLAG_LAST: u32 = 1;
/// The rest of the data area is padding: the next record starts at offset 0.
const FLAG_SKIP: u32 = 2;
/// The record is a loan (always with `FLAG_LAST`): [`LOAN_BYTES`] of address, length, number.
const FLAG_LOAN: u32 = 4;
const LOAN: u32 = FLAG_LAST | FLAG_LOAN;
pub const LOAN_BYTES: usize = 24;
/// Loans one producer may have out at once (one return word each).
pub const LOAN_SLOTS: u64 = 64;

// Header fields.
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_CAPACITY: usize = 16;
const OFF_PRODUCER_RANK: usize = 24;
const OFF_CONSUMER_RANK: usize = 32;
const OFF_CONSUMER_PID: usize = 40;
const OFF_CREATOR_PROOF: usize = 48;
// Producer's line.
const OFF_TAIL: usize = 128;
const OFF_PRODUCER_PARKED: usize = 512;
const OFF_ATTACHED: usize = 140;
const OFF_PRODUCER_CLOSED: usize = 144;
const OFF_PRODUCER_PID: usize = 152;
const OFF_PRODUCER_PROOF: usize = 160;
const OFF_PROBE_ADDR: usize = 192;
const OFF_LENDER_PARKED: usize = 640;
// Consumer's line.
const OFF_HEAD: usize = 256;
const OFF_CONSUMER_PARKED: usize = 384;
const OFF_CONSUMER_CLOSED: usize = 268;
const OFF_BORROWS: usize = 272;
const OFF_RETURNS: usize = 1024;

fn pad16(n: usize) -> usize {
    n.div_ceil(16) * 16
}

/// What the creator writes into a fresh segment.
#[derive(Clone, Copy, Debug)]
pub struct Identity {
    pub producer_rank: usize,
    pub consumer_rank: usize,
    pub consumer_pid: u32,
    pub proof: [u8; 32],
}

/// Fill a fresh (zeroed) segment's header; the magic goes last, so an opener that sees it sees
/// the rest.
pub fn initialize(seg: &Segment, capacity: usize, id: &Identity) {
    // SAFETY: an opener reads none of these fields before it sees the magic, which is stored
    // last, with release; no process writes them afterwards.
    unsafe {
        seg.write(OFF_VERSION, &VERSION.to_le_bytes());
        seg.write(OFF_CAPACITY, &(capacity as u64).to_le_bytes());
        seg.write(OFF_PRODUCER_RANK, &(id.producer_rank as u64).to_le_bytes());
        seg.write(OFF_CONSUMER_RANK, &(id.consumer_rank as u64).to_le_bytes());
        seg.write(OFF_CONSUMER_PID, &u64::from(id.consumer_pid).to_le_bytes());
        seg.write(OFF_CREATOR_PROOF, &id.proof);
    }
    seg.atomic_u64(OFF_MAGIC).store(MAGIC, Ordering::Release);
}

/// A header field, once the magic has been seen.
fn read_u64(seg: &Segment, offset: usize) -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: only header fields, written before the magic's release store (acquired by
    // `inspect` before it reads any) and never written again.
    unsafe { seg.read(offset, &mut b) };
    u64::from_le_bytes(b)
}

/// The header of a segment some other process created, checked. `Ok(None)`: not initialized
/// yet (the creator is between creating and filling it).
pub fn inspect(seg: &Segment) -> Result<Option<(usize, Identity)>, String> {
    if seg.len() < DATA {
        return Ok(None);
    }
    let magic = seg.atomic_u64(OFF_MAGIC).load(Ordering::Acquire);
    if magic == 0 {
        return Ok(None);
    }
    if magic != MAGIC {
        return Err(format!("bad magic {magic:#x}: not a BCL ring"));
    }
    let mut v = [0u8; 4];
    // SAFETY: as in `read_u64`: a header field, published with the magic acquired above.
    unsafe { seg.read(OFF_VERSION, &mut v) };
    let version = u32::from_le_bytes(v);
    if version != VERSION {
        return Err(format!(
            "ring version {version}, this build speaks {VERSION}"
        ));
    }
    let capacity = read_u64(seg, OFF_CAPACITY) as usize;
    if !capacity.is_power_of_two() || capacity < 4096 || DATA + capacity != seg.len() {
        return Err(format!(
            "capacity {capacity} does not fit a segment of {} bytes",
            seg.len()
        ));
    }
    let mut proof = [0u8; 32];
    // SAFETY: as in `read_u64`.
    unsafe { seg.read(OFF_CREATOR_PROOF, &mut proof) };
    Ok(Some((
        capacity,
        Identity {
            producer_rank: read_u64(seg, OFF_PRODUCER_RANK) as usize,
            consumer_rank: read_u64(seg, OFF_CONSUMER_RANK) as usize,
            consumer_pid: read_u64(seg, OFF_CONSUMER_PID) as u32,
            proof,
        },
    )))
}

/// The sending half of a ring.
#[derive(Debug)]
pub struct Producer {
    seg: Segment,
    capacity: usize,
    tail: u64,
    head_seen: u64,
    unpublished: bool,
}

impl Producer {
    /// Attach to a checked segment: announce our pid and proof, and `probe_addr`, where the
    /// same proof lies in this process's memory for as long as the ring does.
    pub fn attach(
        seg: Segment,
        capacity: usize,
        pid: u32,
        proof: &[u8; 32],
        probe_addr: u64,
    ) -> Producer {
        seg.atomic_u64(OFF_PRODUCER_PID)
            .store(u64::from(pid), Ordering::Relaxed);
        seg.atomic_u64(OFF_PROBE_ADDR)
            .store(probe_addr, Ordering::Relaxed);
        // SAFETY: the producer's own field: the consumer reads it only once it sees
        // OFF_ATTACHED, stored just after with release.
        unsafe { seg.write(OFF_PRODUCER_PROOF, proof) };
        seg.atomic_u32(OFF_ATTACHED).store(1, Ordering::Release);
        let tail = seg.atomic_u64(OFF_TAIL).load(Ordering::Relaxed);
        Producer {
            seg,
            capacity,
            tail,
            head_seen: tail,
            unpublished: false,
        }
    }

    /// The largest payload (at most `want`) one record can carry now, refreshing the consumer's
    /// position when `want` does not fit: either before the end of the data area, or at its
    /// start after a skip record.
    pub fn room(&mut self, want: usize) -> usize {
        let fits = |p: &Self| {
            let free = p.capacity - (p.tail - p.head_seen) as usize;
            let to_end = p.capacity - (p.tail as usize & (p.capacity - 1));
            let here = free.min(to_end).saturating_sub(RECORD_HEADER) & !15;
            let after_skip = free.saturating_sub(to_end + RECORD_HEADER) & !15;
            here.max(after_skip)
        };
        if fits(self) < want {
            self.head_seen = self.seg.atomic_u64(OFF_HEAD).load(Ordering::Acquire);
        }
        fits(self).min(want)
    }

    /// The segment, for the line area (`lines.rs`), which this side writes.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Whether the consumer is about to sleep or sleeps (ring it after a post): read after a
    /// SeqCst fence that follows the post, as `publish` does.
    pub fn consumer_parked_now(&self) -> bool {
        self.seg
            .atomic_u32(OFF_CONSUMER_PARKED)
            .load(Ordering::Relaxed)
            != 0
    }

    /// The largest record payload that always fits once the ring has drained, wherever its
    /// position: half the data area (less a header).
    pub fn max_fragment(&self) -> usize {
        self.capacity / 2 - RECORD_HEADER
    }

    /// Whether the consumer found at setup that it can read this process's memory: `None`
    /// while it has not said yet.
    pub fn consumer_borrows(&self) -> Option<bool> {
        match self.seg.atomic_u32(OFF_BORROWS).load(Ordering::Acquire) {
            0 => None,
            v => Some(v == 1),
        }
    }

    /// Whether loan `id` has come back (the consumer's return word for it has reached it; a
    /// word holds loans of one residue in increasing order).
    pub fn returned(&self, id: u64) -> bool {
        let at = OFF_RETURNS + 8 * (id % LOAN_SLOTS) as usize;
        self.seg.atomic_u64(at).load(Ordering::Acquire) >= id
    }

    /// Say we are about to sleep waiting for loans `ids`; true when one came back meanwhile.
    pub fn park_lender(&self, ids: &[u64]) -> bool {
        self.seg
            .atomic_u32(OFF_LENDER_PARKED)
            .store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        ids.iter().any(|&id| self.returned(id))
    }

    fn write_header(&mut self, tag: Tag, len: usize, flags: u32) {
        let mut header = [0u8; RECORD_HEADER];
        header[..8].copy_from_slice(&tag.to_le_bytes());
        header[8..12].copy_from_slice(&(len as u32).to_le_bytes());
        header[12..].copy_from_slice(&flags.to_le_bytes());
        let at = self.tail as usize & (self.capacity - 1);
        // SAFETY: at the tail, in free space (the caller checked `room`): the consumer reads
        // it only after `publish` stores the tail past it, with release.
        unsafe { self.seg.write(DATA + at, &header) };
    }

    /// Write one record (not yet visible to the consumer). The caller checked `room`.
    pub fn push(&mut self, tag: Tag, fragment: &[u8], last: bool) {
        self.push_record(tag, fragment, if last { FLAG_LAST } else { 0 });
    }

    /// Write a loan record: `len` bytes at `addr` in this process, loan number `id`. The
    /// caller checked `room(LOAN_BYTES)`.
    pub fn push_loan(&mut self, tag: Tag, addr: u64, len: usize, id: u64) {
        let mut loan = [0u8; LOAN_BYTES];
        loan[..8].copy_from_slice(&addr.to_le_bytes());
        loan[8..16].copy_from_slice(&(len as u64).to_le_bytes());
        loan[16..].copy_from_slice(&id.to_le_bytes());
        self.push_record(tag, &loan, FLAG_LAST | FLAG_LOAN);
    }

    /// Write one whole message of `len` bytes as a record whose bytes `fill` writes in place
    /// (not yet visible to the consumer). The caller checked `room(len)`. When `fill` answers
    /// false nothing stays pushed and the answer is false.
    pub fn push_filled(
        &mut self,
        tag: Tag,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> bool {
        let before = self.tail;
        let at = self.place(len);
        // SAFETY: as in `write_header`: free space behind the record's header, which the
        // consumer reads only once `publish` has stored the tail past it.
        let dest = unsafe { self.seg.slice_mut(DATA + at + RECORD_HEADER, len) };
        if !fill(dest) {
            // Nothing past the published tail is seen: moving back unpushes it (and the skip).
            self.tail = before;
            return false;
        }
        self.end_record(tag, len, FLAG_LAST);
        true
    }

    fn push_record(&mut self, tag: Tag, fragment: &[u8], flags: u32) {
        let at = self.place(fragment.len());
        // SAFETY: as in `write_header`: free space behind the record's header.
        unsafe { self.seg.write(DATA + at + RECORD_HEADER, fragment) };
        self.end_record(tag, fragment.len(), flags);
    }

    /// Where a record of `len` bytes starts: the tail, after a skip record where it would not
    /// fit before the end of the ring.
    fn place(&mut self, len: usize) -> usize {
        let size = RECORD_HEADER + pad16(len);
        let to_end = self.capacity - (self.tail as usize & (self.capacity - 1));
        if size > to_end {
            self.write_header(0, to_end - RECORD_HEADER, FLAG_SKIP);
            self.tail += to_end as u64;
        }
        debug_assert!(size <= self.capacity - (self.tail - self.head_seen) as usize);
        self.tail as usize & (self.capacity - 1)
    }

    /// Head the record of `len` bytes at the tail (its bytes written) and move the tail past it.
    fn end_record(&mut self, tag: Tag, len: usize, flags: u32) {
        self.write_header(tag, len, flags);
        self.tail += (RECORD_HEADER + pad16(len)) as u64;
        self.unpublished = true;
    }

    /// Make every pushed record visible. Returns whether the consumer is parked (ring it).
    pub fn publish(&mut self) -> bool {
        if !self.unpublished {
            return false;
        }
        self.unpublished = false;
        self.seg
            .atomic_u64(OFF_TAIL)
            .store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        self.seg
            .atomic_u32(OFF_CONSUMER_PARKED)
            .load(Ordering::Relaxed)
            != 0
    }

    /// Say we are about to sleep waiting for room; true when room appeared meanwhile.
    pub fn park(&mut self, want: usize) -> bool {
        self.seg
            .atomic_u32(OFF_PRODUCER_PARKED)
            .store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.room(want) >= want.min(self.max_fragment())
    }

    pub fn unpark(&self) {
        self.seg
            .atomic_u32(OFF_PRODUCER_PARKED)
            .store(0, Ordering::Relaxed);
        self.seg
            .atomic_u32(OFF_LENDER_PARKED)
            .store(0, Ordering::Relaxed);
    }

    pub fn consumer_closed(&self) -> bool {
        self.seg
            .atomic_u32(OFF_CONSUMER_CLOSED)
            .load(Ordering::Acquire)
            != 0
    }

    /// Tell the consumer nothing more will come.
    pub fn close(&self) {
        self.seg
            .atomic_u32(OFF_PRODUCER_CLOSED)
            .store(1, Ordering::Release);
    }
}

/// A record found by [`Consumer::peek`]: where its payload lies in the segment.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    pub tag: Tag,
    pub last: bool,
    /// A loan ([`Consumer::loan`] reads it), not data.
    pub loan: bool,
    start: usize,
    len: usize,
    size: usize,
}

/// The receiving half of a ring (the creator of its segment).
#[derive(Debug)]
pub struct Consumer {
    seg: Segment,
    capacity: usize,
    head: u64,
    freed: bool,
    /// The producer's tail when this side last got ready to sleep.
    observed_tail: u64,
}

impl Consumer {
    pub fn new(seg: Segment, capacity: usize) -> Consumer {
        Consumer {
            seg,
            capacity,
            head: 0,
            freed: false,
            observed_tail: 0,
        }
    }

    /// Whether the producer has attached, and the pid and proof it announced.
    pub fn producer(&self) -> Option<(u32, [u8; 32])> {
        if self.seg.atomic_u32(OFF_ATTACHED).load(Ordering::Acquire) == 0 {
            return None;
        }
        let pid = self
            .seg
            .atomic_u64(OFF_PRODUCER_PID)
            .load(Ordering::Relaxed) as u32;
        let mut proof = [0u8; 32];
        // SAFETY: written by the producer before its release store of OFF_ATTACHED, acquired
        // above; never written again.
        unsafe { self.seg.read(OFF_PRODUCER_PROOF, &mut proof) };
        Some((pid, proof))
    }

    /// The segment, for the line area (`lines.rs`), which this side reads.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    pub fn has_data(&self) -> bool {
        self.seg.atomic_u64(OFF_TAIL).load(Ordering::Acquire) != self.head
    }

    /// The next record, without consuming it (skip records are consumed on the way).
    /// `Ok(None)`: the ring is empty. An error: the producer wrote something that is not a
    /// record (a bug or memory corruption).
    pub fn peek(&mut self) -> Result<Option<Record>, String> {
        loop {
            let tail = self.seg.atomic_u64(OFF_TAIL).load(Ordering::Acquire);
            if tail == self.head {
                return Ok(None);
            }
            let in_use = tail.wrapping_sub(self.head);
            if in_use > self.capacity as u64
                || in_use < RECORD_HEADER as u64
                || !in_use.is_multiple_of(16)
            {
                return Err(format!(
                    "ring positions are inconsistent (tail {tail}, head {})",
                    self.head
                ));
            }
            let at = self.head as usize & (self.capacity - 1);
            let mut header = [0u8; RECORD_HEADER];
            // SAFETY: below the tail acquired above, so published; the producer writes it no
            // more until this side consumes it (head store).
            unsafe { self.seg.read(DATA + at, &mut header) };
            let tag = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
            let len = u32::from_le_bytes(header[8..12].try_into().unwrap_or_default()) as usize;
            let flags = u32::from_le_bytes(header[12..].try_into().unwrap_or_default());
            let size = RECORD_HEADER + pad16(len);
            let to_end = self.capacity - at;
            let valid = match flags {
                FLAG_SKIP => size == to_end,
                0 | FLAG_LAST => size <= to_end,
                LOAN => len == LOAN_BYTES && size <= to_end,
                _ => false,
            };
            if size as u64 > in_use || !valid {
                return Err(format!(
                    "bad record header at {}: length {len}, flags {flags:#x}, {in_use} bytes \
                     published, {to_end} bytes to the end of the ring",
                    self.head
                ));
            }
            if flags == FLAG_SKIP {
                self.head += size as u64;
                self.freed = true;
                continue;
            }
            return Ok(Some(Record {
                tag,
                last: flags & FLAG_LAST != 0,
                loan: flags == LOAN,
                start: DATA + at + RECORD_HEADER,
                len,
                size,
            }));
        }
    }

    /// The payload of `record` (from [`Consumer::peek`]), in place in the ring.
    pub fn bytes(&self, record: &Record) -> &[u8] {
        // SAFETY: a record `peek` found published; it is handed back only by `consume`, which
        // needs `&mut self` and so cannot run while this borrow lasts.
        unsafe { self.seg.slice(record.start, record.len) }
    }

    /// The loan `record` (a loan record from [`Consumer::peek`]) describes: (address in the
    /// producer's memory, length, number).
    pub fn loan(&self, record: &Record) -> (u64, u64, u64) {
        let b = self.bytes(record);
        let word = |i: usize| {
            u64::from_le_bytes(
                b.get(8 * i..8 * i + 8)
                    .and_then(|w| w.try_into().ok())
                    .unwrap_or_default(),
            )
        };
        (word(0), word(1), word(2))
    }

    /// Where the producer's proof lies in its memory (announced when it attached).
    pub fn probe_addr(&self) -> u64 {
        self.seg.atomic_u64(OFF_PROBE_ADDR).load(Ordering::Relaxed)
    }

    /// Tell the producer whether this side can read its memory (it lends only then).
    pub fn set_borrows(&self, can: bool) {
        self.seg
            .atomic_u32(OFF_BORROWS)
            .store(if can { 1 } else { 2 }, Ordering::Release);
    }

    /// Give loan `id` back: the producer may touch its bytes again. Returns whether the
    /// producer sleeps waiting for a loan (ring it).
    pub fn give_back(&self, id: u64) -> bool {
        let at = OFF_RETURNS + 8 * (id % LOAN_SLOTS) as usize;
        self.seg.atomic_u64(at).store(id, Ordering::Release);
        fence(Ordering::SeqCst);
        self.seg
            .atomic_u32(OFF_LENDER_PARKED)
            .load(Ordering::Relaxed)
            != 0
    }

    /// Free `record` (the one [`Consumer::peek`] returned last).
    pub fn consume(&mut self, record: &Record) {
        self.head += record.size as u64;
        self.freed = true;
    }

    /// Bytes published and not yet consumed.
    pub fn in_use(&self) -> usize {
        self.seg
            .atomic_u64(OFF_TAIL)
            .load(Ordering::Acquire)
            .wrapping_sub(self.head) as usize
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether the producer waits for room.
    pub fn producer_parked(&self) -> bool {
        self.seg
            .atomic_u32(OFF_PRODUCER_PARKED)
            .load(Ordering::Relaxed)
            != 0
    }

    /// Give the consumed space back. Returns whether the producer is parked (ring it).
    pub fn release(&mut self) -> bool {
        if !self.freed {
            return false;
        }
        self.freed = false;
        self.seg
            .atomic_u64(OFF_HEAD)
            .store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        self.seg
            .atomic_u32(OFF_PRODUCER_PARKED)
            .load(Ordering::Relaxed)
            != 0
    }

    /// Say we are about to sleep waiting for data; true when data arrived since the last call
    /// (records left in the ring because nobody asked for them yet do not count twice, so an
    /// unclaimed message does not keep its receiver from sleeping).
    pub fn park(&mut self) -> bool {
        self.seg
            .atomic_u32(OFF_CONSUMER_PARKED)
            .store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let tail = self.seg.atomic_u64(OFF_TAIL).load(Ordering::Acquire);
        let new = tail != self.observed_tail && tail != self.head;
        self.observed_tail = tail;
        new
    }

    pub fn unpark(&self) {
        self.seg
            .atomic_u32(OFF_CONSUMER_PARKED)
            .store(0, Ordering::Relaxed);
    }

    pub fn producer_closed(&self) -> bool {
        self.seg
            .atomic_u32(OFF_PRODUCER_CLOSED)
            .load(Ordering::Acquire)
            != 0
    }

    /// Tell the producer nothing more will be read.
    pub fn close(&self) {
        self.seg
            .atomic_u32(OFF_CONSUMER_CLOSED)
            .store(1, Ordering::Release);
    }
}

/// The consumer facing a hostile producer, for the fuzz target `shm_ring`
/// ([`crate::fuzzing::shm_ring`]): `ops` says what the producer writes into a fresh ring
/// (any tail, any bytes anywhere in the data area, any header of the segment) and when the
/// consumer looks; it may also write any word of the line area (`lines.rs`). Whatever it
/// writes, `peek` returns a record inside the ring or an error, `inspect` a capacity that fits
/// the segment or an error, and collecting lines fills the reader's buffer or errs; nothing
/// panics.
pub(crate) fn fuzz_consumer(ops: &[u8]) {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    const CAPACITY: usize = 4096;
    let name = format!(
        "bcl.fuzz.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let (Ok(mine), Ok(Some(theirs))) = (
        Segment::create(&name, DATA + CAPACITY),
        Segment::open(&name),
    ) else {
        let _ = super::sys::unlink(&name);
        return;
    };
    let _ = super::sys::unlink(&name);
    let id = Identity {
        producer_rank: 1,
        consumer_rank: 0,
        consumer_pid: std::process::id(),
        proof: [0; 32],
    };
    initialize(&mine, CAPACITY, &id);
    let mut consumer = Consumer::new(mine, CAPACITY);
    let mut at = 0;
    let mut take = |n: usize| {
        let s = ops.get(at..at + n);
        at += n;
        s
    };
    while let Some(&[op]) = take(1) {
        match op % 8 {
            0 => {
                let Some(b) = take(8) else { break };
                let tail = u64::from_le_bytes(b.try_into().unwrap_or_default());
                theirs.atomic_u64(OFF_TAIL).store(tail, Ordering::Release);
            }
            1 => {
                let Some(&[hi, lo, n]) = take(3) else { break };
                let offset = usize::from(u16::from_le_bytes([hi, lo])) % CAPACITY;
                let Some(bytes) = take(usize::from(n).min(CAPACITY - offset)) else {
                    break;
                };
                // SAFETY: a test of what a hostile producer can do: it writes the data area
                // whenever it likes; the consumer only copies from it (peek) or hands out a
                // slice of it (bytes), which this loop drops before the next write.
                unsafe { theirs.write(DATA + offset, bytes) };
            }
            2 => {
                let Some(&[field, a, b, c, d]) = take(5) else {
                    break;
                };
                // Any header word, as a producer that rewrites the creator's header would.
                let offset = usize::from(field % 64) * 8;
                let word = u32::from_le_bytes([a, b, c, d]);
                // SAFETY: as above: the consumer reads the header only through `inspect`.
                unsafe { theirs.write(offset, &u64::from(word).to_le_bytes()) };
            }
            3 => match consumer.peek() {
                Ok(Some(record)) => {
                    let bytes = consumer.bytes(&record);
                    assert_eq!(bytes.len(), record.len, "a record's bytes are its length");
                    assert!(
                        record.start + record.len <= DATA + CAPACITY,
                        "a record beyond the ring"
                    );
                    if record.loan {
                        assert_eq!(record.len, LOAN_BYTES, "a loan record's length");
                        let _ = consumer.loan(&record);
                    }
                    consumer.consume(&record);
                }
                Ok(None) => {}
                Err(_) => break, // the link is failed: the transport drops the ring
            },
            4 => {
                let _ = consumer.release();
                let _ = consumer.in_use();
                let _ = consumer.has_data();
                let _ = consumer.producer();
                if consumer.park() {
                    consumer.unpark();
                }
            }
            6 => {
                // Any word of the line area, as a producer that posts garbage would.
                let Some(b) = take(10) else { break };
                let word = usize::from(u16::from_le_bytes([b[0], b[1]])) % (lines::AREA / 8);
                let value = u64::from_le_bytes(b[2..].try_into().unwrap_or_default());
                theirs
                    .atomic_u64(lines::LINES + 8 * word)
                    .store(value, Ordering::Release);
            }
            7 => {
                // Collect a post of any length under any stamp: a payload, not yet, another
                // operation's, or an error; never a panic or bytes beyond `out`.
                let Some(b) = take(10) else { break };
                let stamp = u64::from_le_bytes(b[..8].try_into().unwrap_or_default()) | 1;
                let len = usize::from(u16::from_le_bytes([b[8], b[9]])) % (lines::MAX_PAYLOAD + 1);
                let mut out = vec![0u8; len];
                let _ = lines::collect(consumer.segment(), stamp, &mut out);
                assert_eq!(out.len(), len);
                let _ = lines::arrived(consumer.segment(), stamp, len);
            }
            _ => {
                if let Ok(Some((capacity, _))) = inspect(&theirs) {
                    assert_eq!(DATA + capacity, theirs.len(), "inspect's capacity");
                }
            }
        }
    }
}
