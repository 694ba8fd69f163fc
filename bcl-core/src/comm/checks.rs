//! Checks of a call before anything is sent: ranks, roots and peers, counts, buffer sizes,
//! and whether the communicator is still usable. A failed check is an
//! [`Error::InvalidArgument`] (or [`Error::Poisoned`]) and changes nothing.

use super::Communicator;
use crate::error::{Error, Result};
use crate::schedule::{AllToAllCounts, Collective};
use bcl_backends::DataType;

pub(super) fn check_rank(rank: usize, world: usize) -> Result<()> {
    if world == 0 || rank >= world {
        return Err(Error::InvalidArgument(format!(
            "rank {rank} is not in 0..{world} (world size must be at least 1)"
        )));
    }
    Ok(())
}

/// How a buffer's length must relate to what a call needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Fit {
    /// Host slices: their length is the count the caller meant, so it must match.
    Exact,
    /// Device buffers are allocations that may be larger than one call uses.
    AtLeast,
}

pub(super) fn check_len(
    what: &str,
    got: Option<usize>,
    want: Option<usize>,
    fit: Fit,
) -> Result<()> {
    match (got, want) {
        (Some(g), Some(w)) if g < w || (fit == Fit::Exact && g != w) => {
            Err(Error::InvalidArgument(format!(
                "{what} holds {g} bytes, but this call needs {w} bytes"
            )))
        }
        (None, Some(w)) if w > 0 => Err(Error::InvalidArgument(format!(
            "{what} is missing; this call needs {w} bytes"
        ))),
        _ => Ok(()),
    }
}

/// The bytes (input, output) a call's buffers must hold.
pub(super) type Needs = (Option<usize>, Option<usize>);

impl Communicator {
    /// `total` elements as `world` equal blocks: the per-rank count.
    pub(super) fn per_rank(&self, total: usize) -> Result<usize> {
        let n = self.world_size();
        if !total.is_multiple_of(n) {
            return Err(Error::InvalidArgument(format!(
                "a buffer of {total} elements cannot be split into {n} equal blocks"
            )));
        }
        Ok(total / n)
    }

    pub(super) fn check_usable(&self) -> Result<()> {
        match self.async_error() {
            Some(first) => Err(Error::Poisoned(first)),
            None => Ok(()),
        }
    }

    /// Check an all-to-all with per-pair counts: one count per rank each way, this rank's own
    /// block the same size both ways; returns the bytes of the packed send and receive
    /// buffers. (That rank j's `recv[me]` equals this rank's `send[j]` only rank j can tell:
    /// a difference fails there as a size mismatch naming this rank.)
    pub(super) fn check_call_v(
        &self,
        collective: Collective,
        counts: &AllToAllCounts,
        dtype: DataType,
    ) -> Result<Needs> {
        let what = collective.name();
        self.check_usable()?;
        let (rank, world) = (self.rank(), self.world_size());
        for (side, c) in [("send", &counts.send), ("receive", &counts.recv)] {
            if c.len() != world {
                return Err(Error::InvalidArgument(format!(
                    "{}: {} {side} counts for a communicator of {world} ranks",
                    collective.name(),
                    c.len()
                )));
            }
        }
        if counts.send[rank] != counts.recv[rank] {
            return Err(Error::InvalidArgument(format!(
                "{what}: rank {rank} sends itself {} elements but receives {} from itself",
                counts.send[rank], counts.recv[rank]
            )));
        }
        let bytes = |c: &[usize]| -> Result<usize> {
            c.iter()
                .try_fold(0usize, |a, &x| a.checked_add(x))
                .and_then(|e| e.checked_mul(dtype.size()))
                .filter(|b| *b <= isize::MAX as usize)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("{what}: counts {c:?} of {dtype} overflow"))
                })
        };
        // An all-gather sends one block (to everyone), a reduce-scatter receives one.
        let input = match collective {
            Collective::AllGatherV => &counts.send[rank..=rank],
            _ => &counts.send[..],
        };
        let output = match collective {
            Collective::ReduceScatterV { .. } => &counts.recv[rank..=rank],
            _ => &counts.recv[..],
        };
        Ok((Some(bytes(input)?), Some(bytes(output)?)))
    }

    /// Check a call's parameters against this communicator (usable, root or peer in range);
    /// returns the byte sizes its buffers must have (`in_place`: one buffer, the output).
    pub(super) fn check_call(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        in_place: bool,
    ) -> Result<Needs> {
        self.check_usable()?;
        let (rank, world) = (self.rank(), self.world_size());
        if let Some(r) = collective.root() {
            if r >= world {
                return Err(Error::InvalidArgument(format!(
                    "{}: rank {r} does not exist in a communicator of {world}",
                    collective.name()
                )));
            }
            if collective.is_point_to_point() && r == rank {
                return Err(Error::InvalidArgument(format!(
                    "{}: rank {rank} cannot address itself",
                    collective.name()
                )));
            }
        }
        let esize = dtype.size();
        let (i, o) = collective.buffer_elems(count, world, rank);
        let bytes = |e: Option<usize>| -> Result<Option<usize>> {
            e.map(|e| {
                e.checked_mul(esize).ok_or_else(|| {
                    Error::InvalidArgument(format!("count {count} of {dtype} overflows"))
                })
            })
            .transpose()
        };
        let (i, o) = (bytes(i)?, bytes(o)?);
        if !in_place {
            return Ok((i, o));
        }
        if collective.is_point_to_point() || collective == Collective::Barrier {
            return Ok((None, o));
        }
        // One buffer, sized for the larger side.
        Ok((None, Some(i.unwrap_or(0).max(o.unwrap_or(0)))))
    }
}
