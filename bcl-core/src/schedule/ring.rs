//! Ring algorithms: reduce-scatter, allgather, and allreduce as the two in sequence.
//!
//! The n ranks sit on a ring (an order chosen by the topology: same host and same vendor
//! adjacent). The buffer is cut into n chunks; chunk `c` ends up owned by ring position `c`.
//! Each chunk is further cut into slices so that several messages are in flight per link and
//! a slice can be reduced while the next one is on the wire.
//!
//! Reduce-scatter, at step k = 0..n-2, position p sends chunk p-k-1 to p+1 and receives chunk
//! p-k-2 from p-1, reducing it into its own copy (indices mod n). With 4 ranks:
//!
//! ```text
//!   step 0: p0 sends c3, receives c2 (+=)    p1 sends c0, receives c3 (+=)  ...
//!   step 1: p0 sends c2 (now 2 terms)        p1 sends c3 (2 terms)          ...
//!   step 2: p0 sends c1 (3 terms), receives c0 (+=) → c0 holds all 4 terms on p0
//! ```
//!
//! Allgather, at step k = 0..n-2, position p sends chunk p-k and receives chunk p-k-1,
//! overwriting: after n-1 steps every position has every chunk. Allreduce is reduce-scatter
//! then allgather on the same buffer (2(n-1) steps, each link carrying 2(n-1)/n of the data:
//! the bandwidth-optimal ring of Gloo's `allreduce_ring` and NCCL's `runRing`).

use super::plan::{Action, BufferId, PlanBuilder, Region};
use super::{Layout, Reduction};

/// Element range of part `i` of `n` equal parts of `total` (the first parts one longer).
pub fn part(total: usize, n: usize, i: usize) -> (usize, usize) {
    let base = total / n;
    let extra = total % n;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    (start, len)
}

/// The part of `n` equal parts of `total` (as [`part`] cuts them) that holds element `x`
/// (`x < total`; 0 otherwise), found without a scan of the parts: the first `total % n`
/// parts are one longer.
pub fn part_of(total: usize, n: usize, x: usize) -> usize {
    if x >= total {
        return 0;
    }
    let (base, extra) = (total / n, total % n);
    let long = extra * (base + 1);
    if x < long {
        x / (base + 1)
    } else {
        // x < total here, so the short parts are not empty.
        extra + (x - long) / base
    }
}

/// Where each chunk of a ring collective lives, and how chunks are cut into slices.
pub(crate) struct Chunks {
    /// (offset, len) in elements of chunk c (indexed by ring position).
    pub chunks: Vec<(usize, usize)>,
    /// Slices per chunk (the same on every rank).
    pub slices: usize,
}

impl Chunks {
    /// `n` chunks at `offsets[c]` of `len[c]` elements, sliced to at most `slice_elems`.
    pub fn new(chunks: Vec<(usize, usize)>, slice_elems: usize) -> Self {
        let longest = chunks.iter().map(|c| c.1).max().unwrap_or(0);
        let slices = longest.div_ceil(slice_elems.max(1)).max(1);
        Chunks { chunks, slices }
    }

    pub fn region(&self, buffer: BufferId, chunk: usize, slice: usize) -> Region {
        let (offset, len) = self.chunks[chunk];
        let (s, l) = part(len, self.slices, slice);
        Region::new(buffer, offset + s, l)
    }
}

/// One pass around the ring: at step k = 0..n-2, position p sends chunk p-k-`lag` to the next
/// position and receives chunk p-k-`lag`-1 from the previous one, reducing it into `buf` or
/// overwriting. Tags `tag_base + k * slices + s`.
///
/// `source`: where this rank's own data is when `buf` does not hold it yet (out of place).
/// Step 0 then sends straight from it, and each reduction seeds its target from it: every
/// chunk is received once per pass, so nothing needs copying beforehand.
#[allow(clippy::too_many_arguments)]
fn ring_pass(
    b: &mut PlanBuilder,
    layout: &Layout,
    chunks: &Chunks,
    buf: BufferId,
    tag_base: u32,
    lag: usize,
    reduce: bool,
    source: Option<BufferId>,
) {
    let (n, p) = (layout.world(), layout.position());
    let (next, prev) = (layout.next(), layout.prev());
    for k in 0..n.saturating_sub(1) {
        let send_chunk = (p + 2 * n - k - lag) % n;
        let recv_chunk = (p + 2 * n - k - lag - 1) % n;
        for s in 0..chunks.slices {
            let tag = tag_base + (k * chunks.slices + s) as u32;
            let from = match source {
                Some(src) if k == 0 => chunks.region(src, send_chunk, s),
                _ => chunks.region(buf, send_chunk, s),
            };
            if from.len > 0 {
                b.push(Action::Send {
                    peer: next,
                    tag,
                    from,
                    // An overwriting pass (the allgather) may let the next rank copy the
                    // slice straight out of this rank's buffer.
                    lend: true,
                });
            }
            let into = chunks.region(buf, recv_chunk, s);
            if into.len > 0 {
                b.push(Action::Recv {
                    peer: prev,
                    tag,
                    into,
                    reduce,
                    seed: source.map(|src| chunks.region(src, recv_chunk, s)),
                });
            }
        }
    }
}

/// Reduce-scatter on `buf`: afterwards ring position p holds the full reduction of chunk p.
/// With `source`, this rank's contribution is read from there instead of `buf` (out of
/// place; `buf` needs no copy of it first).
pub(crate) fn reduce_scatter_steps(
    b: &mut PlanBuilder,
    layout: &Layout,
    chunks: &Chunks,
    buf: BufferId,
    tag_base: u32,
    reduction: Reduction,
    source: Option<BufferId>,
) {
    ring_pass(b, layout, chunks, buf, tag_base, 1, true, source);
    // With one rank there is no pass: the result is the source itself.
    if let Some(src) = source
        && layout.world() == 1
    {
        for s in 0..chunks.slices {
            let to = chunks.region(buf, 0, s);
            if to.len > 0 {
                b.push(Action::Copy {
                    from: chunks.region(src, 0, s),
                    to,
                });
            }
        }
    }
    if reduction.average {
        for s in 0..chunks.slices {
            let region = chunks.region(buf, layout.position(), s);
            if region.len > 0 {
                b.push(Action::Divide { region });
            }
        }
    }
}

/// Allgather on `buf`: position p starts with chunk p, ends with all chunks.
pub(crate) fn allgather_steps(
    b: &mut PlanBuilder,
    layout: &Layout,
    chunks: &Chunks,
    buf: BufferId,
    tag_base: u32,
) {
    ring_pass(b, layout, chunks, buf, tag_base, 0, false, None);
}

/// Number of tags one ring phase uses.
pub(crate) fn phase_tags(layout: &Layout, chunks: &Chunks) -> u32 {
    (layout.world().saturating_sub(1) * chunks.slices) as u32
}

#[cfg(test)]
mod tests {
    use super::{part, part_of};

    #[test]
    fn parts_cover_exactly() {
        for total in [0usize, 1, 7, 10, 1000] {
            for n in 1..=9 {
                let mut next = 0;
                for i in 0..n {
                    let (s, l) = part(total, n, i);
                    assert_eq!(s, next);
                    next += l;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn the_part_holding_an_element_is_the_one_whose_range_holds_it() {
        for total in [1usize, 7, 10, 1000, 1003] {
            for n in 1..=12 {
                for x in 0..total {
                    let want = (0..n)
                        .find(|&c| {
                            let (o, l) = part(total, n, c);
                            o <= x && x < o + l
                        })
                        .expect("some part holds every element");
                    assert_eq!(part_of(total, n, x), want, "total {total} n {n} x {x}");
                }
            }
        }
        assert_eq!(part_of(5, 3, 5), 0, "past the end");
    }
}
