//! Lines: a small message and its arrival flag in one cache line, in the area between a ring's
//! header and its data (NCCL's LL protocol, on host memory).
//!
//! ```text
//!   LINES + set·SET_BYTES + i·64:  flag (u64) | 7 data words (56 bytes)
//! ```
//!
//! A post writes its payload 56 bytes to a line, each line's data words first and its flag
//! last (release), in line order. A reader that sees the expected flag on the last line
//! (acquire) has every line: it copies them all at once (the loads miss together instead of one
//! line after another), then checks each line's own flag, so a line rewritten while it was read
//! is an error, never mixed data. Receiving costs about one cache-line transfer per line, where
//! a ring record costs the record's lines and the tail's. Every access is an atomic word, so the
//! data a peer process writes is never read with a plain load while it changes.
//!
//! A flag is the caller's stamp: the post's number in its upper 32 bits (the same on every rank
//! for the same operation) and a check of what the operation is in its lower 32. Posts
//! alternate between two sets of lines by the number's parity: a writer may reuse a set
//! only once every reader has finished with the post before the last, which the caller's
//! protocol guarantees (see `Lines` in `transport.rs`). An unused line reads as flag 0, so a
//! stamp is never 0.

use super::sys::Segment;
use crate::transport::Collected;
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// Where the line area starts in a ring's segment.
pub const LINES: usize = 4096;
/// Words per line: the flag, then the data.
const WORDS: usize = 8;
/// Payload bytes per line.
pub const LINE_DATA: usize = (WORDS - 1) * 8;
const LINES_PER_SET: usize = 64;
const SET_WORDS: usize = LINES_PER_SET * WORDS;
/// Bytes of the line area: two sets.
pub const AREA: usize = 2 * SET_WORDS * 8;
/// The largest payload of one post.
pub const MAX_PAYLOAD: usize = LINES_PER_SET * LINE_DATA;

/// Lines a payload of `len` bytes takes (an empty one still carries its flag).
fn lines_for(len: usize) -> usize {
    len.div_ceil(LINE_DATA).max(1)
}

/// The words of the set a post `stamp` of `lines` lines goes to.
fn set(seg: &Segment, stamp: u64, lines: usize) -> &[AtomicU64] {
    let set = ((stamp >> 32) & 1) as usize;
    seg.atomic_words(
        LINES + set * SET_WORDS * 8,
        lines.min(LINES_PER_SET) * WORDS,
    )
}

/// Write `payload` (at most [`MAX_PAYLOAD`] bytes) under `stamp` (not 0).
pub fn post(seg: &Segment, stamp: u64, payload: &[u8]) {
    debug_assert!(stamp != 0 && payload.len() <= MAX_PAYLOAD);
    let lines = lines_for(payload.len());
    let words = set(seg, stamp, lines);
    for (line, chunk) in words.chunks_exact(WORDS).zip(
        payload
            .chunks(LINE_DATA)
            .chain(payload.is_empty().then_some(&[][..])),
    ) {
        let mut whole = chunk.chunks_exact(8);
        let mut slots = line[1..].iter();
        // The bytes first: a zip that ran out of slots first would have taken the one the
        // rest needs.
        for (bytes, slot) in whole.by_ref().zip(slots.by_ref()) {
            let w = u64::from_le_bytes(bytes.try_into().unwrap_or_default());
            slot.store(w, Ordering::Relaxed);
        }
        let rest = whole.remainder();
        if let (Some(slot), false) = (slots.next(), rest.is_empty()) {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            slot.store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
        line[0].store(stamp, Ordering::Release);
    }
}

/// Copy the post `stamp` into `out` (the payload's length) if all of it has arrived. An
/// error: a line changed while it was read.
pub fn collect(seg: &Segment, stamp: u64, out: &mut [u8]) -> Result<Collected, String> {
    let lines = lines_for(out.len());
    let words = set(seg, stamp, lines);
    let last = words[(lines - 1) * WORDS].load(Ordering::Acquire);
    if last != stamp {
        let first = words[0].load(Ordering::Acquire);
        if first >> 32 == stamp >> 32 && first != stamp && first != 0 {
            let n = out.len().min(LINE_DATA);
            read_line(&words[..WORDS], &mut out[..n]);
            return Ok(Collected::Foreign(first));
        }
        return Ok(Collected::Partial);
    }
    for (line, dest) in words.chunks_exact(WORDS).zip(out.chunks_mut(LINE_DATA)) {
        read_line(line, dest);
    }
    fence(Ordering::Acquire);
    if let Some(i) = (0..lines).find(|i| words[i * WORDS].load(Ordering::Relaxed) != stamp) {
        return Err(format!(
            "line {i} of post {stamp:#x} was rewritten while it was read (flag {:#x})",
            words[i * WORDS].load(Ordering::Relaxed)
        ));
    }
    Ok(Collected::Complete)
}

/// Copy one line's data words into `dest` (at most 56 bytes).
fn read_line(line: &[AtomicU64], dest: &mut [u8]) {
    let mut whole = dest.chunks_exact_mut(8);
    let mut slots = line[1..].iter();
    for (bytes, slot) in whole.by_ref().zip(slots.by_ref()) {
        bytes.copy_from_slice(&slot.load(Ordering::Relaxed).to_le_bytes());
    }
    let rest = whole.into_remainder();
    if let (Some(slot), false) = (slots.next(), rest.is_empty()) {
        let w = slot.load(Ordering::Relaxed).to_le_bytes();
        rest.copy_from_slice(&w[..rest.len()]);
    }
}

/// Whether the post `stamp` of a payload of `len` bytes has fully arrived (for a reader about
/// to sleep).
pub fn arrived(seg: &Segment, stamp: u64, len: usize) -> bool {
    let lines = lines_for(len);
    set(seg, stamp, lines)[(lines - 1) * WORDS].load(Ordering::Acquire) == stamp
}
