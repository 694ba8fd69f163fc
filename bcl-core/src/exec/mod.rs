//! The steppable executor: drives one [`Plan`] through a Transport and an Accelerator.
//!
//! `poll` issues every step whose dependencies are done: sends are handed to the transport
//! (which copies them into its own slots, or answers "not now" under back-pressure), arrived
//! messages are reduced or copied into their region, local copies and divisions run at once.
//! It never sleeps; whoever drives it (the progress thread, or the caller for blocking calls)
//! decides how to wait when nothing moved. Many slices are in flight at once, so a slice is
//! reduced while the next ones are on the wire.

mod clock;
mod memory;
mod signatures;
mod sink;
mod stats;
#[cfg(test)]
mod tests;

pub use clock::{Clock, WallClock};
pub use memory::{Bindings, Memory};
pub use stats::{Measurements, PeerBytes};

use crate::schedule::{Action, Plan, Region};
use crate::signature::Signature;
use bcl_backends::{Accelerator, DataType, DeviceError, Download, ReduceOp, Stream};
use bcl_transport::{Landing, LoanId, Tag, Transport, TransportError};
use signatures::SignatureExchange;
use sink::{Sink, record_link_rate};
use std::time::Instant;

/// Why a step failed; the communicator turns it into an [`crate::Error`] naming the peers.
#[derive(Debug)]
pub enum ExecError {
    Transport(TransportError),
    Device(DeviceError),
    /// A message's size differs from the region it must fill.
    Mismatch {
        peer: usize,
        got: usize,
        expected: usize,
    },
    /// A peer's first message of this operation says it runs a different one (`None`: what
    /// it sent is not a signature at all).
    Desync {
        peer: usize,
        theirs: Option<Signature>,
    },
    /// A plan used a buffer the caller did not bind (a core bug or a bad call).
    Binding(String),
}

impl From<TransportError> for ExecError {
    fn from(e: TransportError) -> Self {
        ExecError::Transport(e)
    }
}

impl From<DeviceError> for ExecError {
    fn from(e: DeviceError) -> Self {
        ExecError::Device(e)
    }
}

/// The facts about the running operation every step needs.
#[derive(Debug)]
pub struct OpContext<'a> {
    /// Upper bits of every message tag of this operation (see [`tag_base`]).
    pub tag_base: u64,
    pub dtype: DataType,
    /// The reduction applied hop by hop (`avg` runs as `sum`, then `Divide` steps).
    pub op: ReduceOp,
    pub world: usize,
    pub accelerator: &'a dyn Accelerator,
    pub stream: Stream,
    /// This rank, and what it runs: sent to every peer before any data, and compared with
    /// what each peer sends.
    pub rank: usize,
    pub signature: Signature,
    /// Where the executor reads the time.
    pub clock: &'a dyn Clock,
    /// The smallest message lent where the plan allows it (`Action::Send::lend`) and the
    /// transport can (`bcl_transport::Lend`); 0: never.
    pub lend_bytes: usize,
}

impl OpContext<'_> {
    fn tag(&self, tag: u32) -> Tag {
        self.tag_base | u64::from(tag)
    }
}

/// The tag bits of an operation: collectives use the communicator's sequence number;
/// point-to-point operations, which involve two ranks only, a per-peer, per-direction sequence number in a
/// separate space (top bit set), so ranks that skip a send/recv stay in step for the rest.
pub fn tag_base(seq: u32, point_to_point: bool) -> u64 {
    let space = if point_to_point { 1u64 << 63 } else { 0 };
    space | (u64::from(seq & 0x7fff_ffff) << 32)
}

/// The tag of collective `seq`'s signature messages (see `signatures.rs`).
pub fn signature_tag(seq: u32) -> u64 {
    tag_base(seq, false) | u64::from(signatures::SIGNATURE_TAG)
}

/// Progress of one plan.
#[derive(Debug)]
pub struct Executor<'p> {
    plan: &'p Plan,
    waiting_for: Vec<usize>,
    ready: Vec<usize>,
    done: Vec<bool>,
    finished: usize,
    staging: Vec<u8>,
    /// The operation's signature, sent to and checked from every peer.
    signatures: SignatureExchange,
    /// When a step last completed (for the health layer and timeouts).
    pub last_progress: Instant,
    /// Bytes sent to and received from each peer (indexed by rank).
    peer_bytes: Vec<[u64; 2]>,
    /// One mark per peer, for `lost_peer`.
    peer_marks: Vec<bool>,
    /// Measurements for slow-node detection: wire rates (peer, GB/s) of large messages, and
    /// the bytes and seconds of this rank's reductions and copies of received data.
    pub link_rates: Vec<(usize, f32)>,
    pub device_bytes: u64,
    pub device_secs: f64,
    /// Device-to-host copies started ahead of their send steps (step, copy), so that slice
    /// k+1 is copied while slice k is on the wire; `None` until the device says whether it
    /// copies asynchronously at all.
    downloads: Vec<(usize, Box<dyn Download>)>,
    downloads_ahead: Option<bool>,
    /// Send steps whose bytes were lent (single copy), with the loan: each is done once the
    /// peer has copied them.
    loans: Vec<(usize, LoanId)>,
    /// A loan was made since the last `poll` (something moved).
    lent: bool,
}

/// The vectors an executor works in, kept between operations by whoever drives them.
#[derive(Debug, Default)]
pub struct ExecScratch {
    waiting_for: Vec<usize>,
    ready: Vec<usize>,
    done: Vec<bool>,
    staging: Vec<u8>,
    signatures: SignatureExchange,
    peer_bytes: Vec<[u64; 2]>,
    link_rates: Vec<(usize, f32)>,
    peer_marks: Vec<bool>,
    loans: Vec<(usize, LoanId)>,
}

/// The most device-to-host copies an executor keeps in flight ahead of their sends.
const DOWNLOADS_AHEAD: usize = 8;

impl<'p> Executor<'p> {
    /// An executor for `plan` among `world` ranks, started at `now`.
    #[cfg(test)]
    pub fn new(plan: &'p Plan, world: usize, now: Instant) -> Self {
        Self::reusing(plan, world, ExecScratch::default(), now)
    }

    /// An executor that takes its vectors from `scratch` (the previous operation's, given
    /// back by [`Executor::into_scratch`]): no allocation per operation in steady state.
    pub fn reusing(plan: &'p Plan, world: usize, scratch: ExecScratch, now: Instant) -> Self {
        let ExecScratch {
            mut waiting_for,
            mut ready,
            mut done,
            staging,
            mut signatures,
            mut peer_bytes,
            mut link_rates,
            peer_marks,
            mut loans,
        } = scratch;
        let n = plan.steps.len();
        waiting_for.clear();
        waiting_for.extend(plan.steps.iter().map(|s| s.deps.len()));
        signatures.reset(plan, world);
        ready.clear();
        ready.extend((0..n).filter(|i| waiting_for[*i] == 0));
        done.clear();
        done.resize(n, false);
        peer_bytes.clear();
        peer_bytes.resize(world, [0; 2]);
        link_rates.clear();
        loans.clear();
        Executor {
            plan,
            waiting_for,
            ready,
            done,
            finished: 0,
            staging,
            signatures,
            last_progress: now,
            peer_bytes,
            link_rates,
            peer_marks,
            device_bytes: 0,
            device_secs: 0.0,
            downloads: Vec::new(),
            downloads_ahead: None,
            loans,
            lent: false,
        }
    }

    /// The vectors of this executor, for the next operation's (see [`Executor::reusing`]).
    pub fn into_scratch(self) -> ExecScratch {
        ExecScratch {
            waiting_for: self.waiting_for,
            ready: self.ready,
            done: self.done,
            staging: self.staging,
            signatures: self.signatures,
            peer_bytes: self.peer_bytes,
            link_rates: self.link_rates,
            peer_marks: self.peer_marks,
            loans: self.loans,
        }
    }

    /// Start the device-to-host copies of ready sends from device memory (up to
    /// `DOWNLOADS_AHEAD` in flight), on devices that copy asynchronously.
    fn start_downloads(
        &mut self,
        memory: &Bindings<'_>,
        ctx: &OpContext<'_>,
    ) -> Result<(), ExecError> {
        if self.downloads_ahead == Some(false) {
            return Ok(());
        }
        let esize = ctx.dtype.size();
        for &step in &self.ready {
            if self.downloads.len() >= DOWNLOADS_AHEAD {
                break;
            }
            let Action::Send { from, .. } = &self.plan.steps[step].action else {
                continue;
            };
            if self.downloads.iter().any(|(s, _)| *s == step) {
                continue;
            }
            let Some(slice) = memory.device_slice(*from, esize) else {
                continue;
            };
            match ctx.accelerator.start_download(slice, &ctx.stream)? {
                Some(d) => {
                    self.downloads_ahead = Some(true);
                    self.downloads.push((step, d));
                }
                None => {
                    self.downloads_ahead = Some(false);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Bytes this operation moved per peer so far.
    pub fn peer_bytes(&self) -> impl Iterator<Item = PeerBytes> + '_ {
        self.peer_bytes
            .iter()
            .enumerate()
            .map(|(peer, b)| PeerBytes {
                peer,
                sent: b[0],
                received: b[1],
            })
    }

    pub fn is_done(&self) -> bool {
        self.finished == self.plan.steps.len() && self.signatures.complete()
    }

    /// The peers whose messages this rank is waiting for now (ready receives).
    pub fn waiting_on(&self) -> Vec<usize> {
        self.ready_peers(true)
    }

    /// The peers this rank cannot send to because their queues are full (ready sends).
    pub fn blocked_sends(&self) -> Vec<usize> {
        self.ready_peers(false)
    }

    fn ready_peers(&self, receives: bool) -> Vec<usize> {
        let mut peers: Vec<usize> = self
            .ready
            .iter()
            .filter_map(|&i| match self.plan.steps[i].action {
                Action::Recv { peer, .. } if receives => Some(peer),
                Action::Send { peer, .. } if !receives => Some(peer),
                _ => None,
            })
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// A peer that unfinished steps still need but whose link the transport reports lost.
    /// (Asked while waiting: each such peer once, and no allocation.)
    pub fn lost_peer(&mut self, transport: &dyn Transport) -> Option<usize> {
        let needed = &mut self.peer_marks;
        needed.clear();
        needed.resize(self.peer_bytes.len(), false);
        for (i, step) in self.plan.steps.iter().enumerate() {
            match step.action {
                Action::Send { peer, .. } | Action::Recv { peer, .. } if !self.done[i] => {
                    needed[peer] = true;
                }
                _ => {}
            }
        }
        (0..needed.len()).find(|&peer| needed[peer] && transport.peer_lost(peer))
    }

    /// Issue every ready step. Returns whether anything moved.
    pub fn poll(
        &mut self,
        transport: &mut dyn Transport,
        memory: &mut Bindings<'_>,
        ctx: &OpContext<'_>,
    ) -> Result<bool, ExecError> {
        let mut moved = transport.progress()?;
        if !self.signatures.complete() {
            moved |= self.signatures.receive(transport, ctx)?;
        }
        self.start_downloads(memory, ctx)?;
        let mut i = 0;
        while i < self.ready.len() {
            let step = self.ready[i];
            if self.run_step(step, transport, memory, ctx)? {
                self.ready.swap_remove(i);
                self.done[step] = true;
                self.finished += 1;
                moved = true;
                let plan = self.plan;
                for &d in &plan.dependents[step] {
                    self.waiting_for[d] -= 1;
                    if self.waiting_for[d] == 0 {
                        self.ready.push(d);
                    }
                }
            } else {
                i += 1;
            }
        }
        moved |= std::mem::take(&mut self.lent);
        if moved {
            self.last_progress = ctx.clock.now();
        }
        Ok(moved)
    }

    fn run_step(
        &mut self,
        index: usize,
        transport: &mut dyn Transport,
        memory: &mut Bindings<'_>,
        ctx: &OpContext<'_>,
    ) -> Result<bool, ExecError> {
        let esize = ctx.dtype.size();
        match &self.plan.steps[index].action {
            Action::Send {
                peer,
                tag,
                from,
                lend,
            } => {
                let (peer, tag) = (*peer, *tag);
                // Lent: done once the peer has copied the bytes out of `from`.
                if let Some(at) = self.loans.iter().position(|(s, _)| *s == index) {
                    let loan = self.loans[at].1;
                    let back = match transport.lend() {
                        Some(lender) => lender.returned(peer, loan)?,
                        None => false,
                    };
                    if back {
                        self.loans.swap_remove(at);
                    }
                    return Ok(back);
                }
                let len = from.len * esize;
                if *lend
                    && ctx.lend_bytes > 0
                    && len >= ctx.lend_bytes
                    && let Some(bytes) = memory.host(*from, esize)?
                    && transport.lend().is_some_and(|l| l.reaches(peer))
                {
                    if let Some(loan) = self.signatures.lend(transport, ctx, peer, tag, bytes)? {
                        self.loans.push((index, loan));
                        self.peer_bytes[peer][0] += len as u64;
                        self.lent = true;
                    }
                    return Ok(false);
                }
                let sent = match self.downloads.iter().position(|(s, _)| *s == index) {
                    // Its bytes were copied off the device ahead of this step.
                    Some(at) => {
                        if !self.downloads[at].1.ready()? {
                            return Ok(false);
                        }
                        let bytes = self.downloads[at].1.bytes();
                        let sent = self.signatures.send(transport, ctx, peer, tag, bytes)?;
                        if sent {
                            self.downloads.swap_remove(at);
                        }
                        sent
                    }
                    None => {
                        match self.send_from_device(transport, memory, ctx, peer, tag, *from)? {
                            Some(sent) => sent,
                            None => {
                                let bytes = memory.read(*from, esize, ctx, &mut self.staging)?;
                                self.signatures.send(transport, ctx, peer, tag, bytes)?
                            }
                        }
                    }
                };
                if sent {
                    self.peer_bytes[peer][0] += (from.len * esize) as u64;
                }
                Ok(sent)
            }
            Action::Recv { peer, tag, .. } => {
                let (peer, tag) = (*peer, *tag);
                let outcome = match self.signatures.take_carried(peer, tag) {
                    Some(message) => {
                        let outcome = self
                            .sink(index, memory, ctx)?
                            .deliver(SignatureExchange::payload(&message), None);
                        transport.release(message);
                        outcome
                    }
                    None => match self.receive(index, transport, memory, ctx)? {
                        Some(outcome) => outcome,
                        None => return Ok(false),
                    },
                };
                match outcome {
                    Ok(bytes) => {
                        self.peer_bytes[peer][1] += bytes as u64;
                        Ok(true)
                    }
                    Err(ExecError::Mismatch { .. }) => {
                        // A different operation, most likely: its signature (sent on its own
                        // ahead of large data) says which, if it is here.
                        self.signatures.receive(transport, ctx)?;
                        outcome.map(|_| true)
                    }
                    Err(e) => Err(e),
                }
            }
            Action::Copy { from, to } => {
                memory.copy(*from, *to, esize, ctx)?;
                Ok(true)
            }
            Action::Divide { region } => {
                memory.divide(*region, esize, ctx)?;
                Ok(true)
            }
        }
    }

    /// Send `from`, which lies on a device that copies synchronously, by copying it off the
    /// device straight into the transport's memory (the shm ring): one pass over the bytes
    /// where staging them in host memory first took two. `Ok(None)`: not this way (host
    /// memory, a device that downloads ahead, or a transport that does not fill in place).
    fn send_from_device(
        &mut self,
        transport: &mut dyn Transport,
        memory: &Bindings<'_>,
        ctx: &OpContext<'_>,
        peer: usize,
        tag: u32,
        from: Region,
    ) -> Result<Option<bool>, ExecError> {
        if self.downloads_ahead != Some(false) {
            return Ok(None);
        }
        let Some(slice) = memory.device_slice(from, ctx.dtype.size()) else {
            return Ok(None);
        };
        let mut failed = None;
        let mut fill = |dest: &mut [u8]| {
            let copied = ctx
                .accelerator
                .copy_to_host(dest, slice, &ctx.stream)
                .and_then(|()| ctx.accelerator.synchronize(&ctx.stream));
            copied.map_err(|e| failed = Some(e)).is_ok()
        };
        let sent = self
            .signatures
            .send_filled(transport, ctx, peer, tag, slice.len, &mut fill)?;
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(sent),
        }
    }

    /// Take the message of receive step `index` from the transport: `Ok(None)`, it has not
    /// arrived; `Ok(Some(outcome))`, what delivering it did (the bytes it filled).
    fn receive(
        &mut self,
        index: usize,
        transport: &mut dyn Transport,
        memory: &mut Bindings<'_>,
        ctx: &OpContext<'_>,
    ) -> Result<Option<Result<usize, ExecError>>, ExecError> {
        let Action::Recv {
            peer,
            tag,
            into,
            reduce,
            seed,
        } = &self.plan.steps[index].action
        else {
            return Err(ExecError::Binding(format!("step {index} is not a receive")));
        };
        let (peer, tag, expected) = (*peer, ctx.tag(*tag), into.len * ctx.dtype.size());
        // A message that overwrites host memory is written there by the transport (tcp:
        // straight from the socket, with no copy through a buffer of its own).
        if !*reduce
            && seed.is_none()
            && expected > 0
            && let Some(dest) = memory.host_mut(*into, ctx.dtype.size())?
        {
            return Ok(match transport.try_recv_into(peer, tag, dest)? {
                Landing::Pending => None,
                Landing::Filled(transfer) => {
                    record_link_rate(&mut self.link_rates, peer, expected, transfer);
                    Some(Ok(expected))
                }
                Landing::WrongLength(got) => Some(Err(ExecError::Mismatch {
                    peer,
                    got,
                    expected,
                })),
            });
        }
        // Handed over where it lies (in a shared-memory ring: no copy out).
        let mut outcome = None;
        let mut sink = self.sink(index, memory, ctx)?;
        let arrived = transport.try_recv_with(peer, tag, &mut |data, transfer| {
            outcome = Some(sink.deliver(data, transfer));
        })?;
        if !arrived {
            return Ok(None);
        }
        Ok(Some(outcome.unwrap_or_else(|| {
            Err(ExecError::Binding(
                "a transport reported a message it never handed over".into(),
            ))
        })))
    }

    /// Where the message of receive step `index` goes.
    fn sink<'s, 'm, 'c>(
        &'s mut self,
        index: usize,
        memory: &'s mut Bindings<'m>,
        ctx: &'s OpContext<'c>,
    ) -> Result<Sink<'s, 'm, 'c>, ExecError> {
        let Action::Recv {
            peer,
            into,
            reduce,
            seed,
            ..
        } = &self.plan.steps[index].action
        else {
            return Err(ExecError::Binding(format!("step {index} is not a receive")));
        };
        Ok(Sink {
            peer: *peer,
            expected: into.len * ctx.dtype.size(),
            into: *into,
            reduce: *reduce,
            seed: *seed,
            memory,
            ctx,
            device_secs: &mut self.device_secs,
            device_bytes: &mut self.device_bytes,
            link_rates: &mut self.link_rates,
        })
    }
}
