//! Where one received message goes: reduced into, or written over, a region of the bound
//! memory, with the device time and the link's wire rate recorded for slow-node detection.

use super::stats::RATE_MIN_BYTES;
use super::{Bindings, ExecError, OpContext};
use crate::schedule::Region;

/// Where one received message goes: reduced into or written over a region (seeded first, for
/// out-of-place reductions), with the time and bytes the device spent on it.
pub(super) struct Sink<'s, 'm, 'c> {
    pub(super) peer: usize,
    pub(super) expected: usize,
    pub(super) into: Region,
    pub(super) reduce: bool,
    pub(super) seed: Option<Region>,
    pub(super) memory: &'s mut Bindings<'m>,
    pub(super) ctx: &'s OpContext<'c>,
    pub(super) device_secs: &'s mut f64,
    pub(super) device_bytes: &'s mut u64,
    pub(super) link_rates: &'s mut Vec<(usize, f32)>,
}

impl Sink<'_, '_, '_> {
    /// Deliver `data`; returns the bytes it filled.
    pub(super) fn deliver(
        &mut self,
        data: &[u8],
        transfer: Option<std::time::Duration>,
    ) -> Result<usize, ExecError> {
        let (esize, ctx) = (self.ctx.dtype.size(), self.ctx);
        let got = data.len();
        if got != self.expected {
            return Err(ExecError::Mismatch {
                peer: self.peer,
                got,
                expected: self.expected,
            });
        }
        // Device speed is measured on messages large enough to carry it (and the clock is not
        // read for small ones: on a VM a read costs a visible part of a small allreduce).
        let timed = got >= RATE_MIN_BYTES;
        let started = timed.then(|| ctx.clock.now());
        let done = match (self.seed, self.reduce) {
            (Some(seed), true) => self.memory.reduce_seeded(seed, self.into, esize, data, ctx),
            (seed, reduce) => {
                if let Some(seed) = seed {
                    self.memory.copy(seed, self.into, esize, ctx)?;
                }
                if reduce {
                    self.memory.reduce_into(self.into, esize, data, ctx)
                } else {
                    self.memory.write(self.into, esize, data, ctx)
                }
            }
        };
        if let Some(started) = started {
            let spent = ctx.clock.now().saturating_duration_since(started);
            *self.device_secs += spent.as_secs_f64();
            *self.device_bytes += got as u64;
        }
        record_link_rate(self.link_rates, self.peer, got, transfer);
        done.map(|()| got)
    }
}

/// The wire rate of a message from `peer` large enough to carry one (slow-node detection).
pub(super) fn record_link_rate(
    link_rates: &mut Vec<(usize, f32)>,
    peer: usize,
    bytes: usize,
    transfer: Option<std::time::Duration>,
) {
    if bytes >= RATE_MIN_BYTES
        && let Some(t) = transfer
    {
        let secs = t.as_secs_f64().max(1e-6);
        link_rates.push((peer, (bytes as f64 / secs / 1e9) as f32));
    }
}
