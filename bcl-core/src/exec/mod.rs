//! The steppable executor: drives one [`Plan`] through a Transport and an Accelerator.
//!
//! `poll` issues every step whose dependencies are done: sends are handed to the transport
//! (which copies them into its own slots, or answers "not now" under back-pressure), arrived
//! messages are reduced or copied into their region, local copies and divisions run at once.
//! It never sleeps; whoever drives it (the progress thread, or the caller for blocking calls)
//! decides how to wait when nothing moved. Many slices are in flight at once, so a slice is
//! reduced while the next ones are on the wire.

mod memory;
mod stats;

pub use memory::{Bindings, Memory};
pub use stats::{Measurements, PeerBytes, RATE_MIN_BYTES};

use crate::schedule::{Action, Plan, Region};
use crate::signature::{SIGNATURE_BYTES, Signature};
use bcl_backends::{Accelerator, DataType, DeviceError, Download, ReduceOp, Stream, kernels};
use bcl_transport::{Landing, Received, Tag, Transport, TransportError};
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
}

/// The tag of an operation's signature message, the same whatever the operation (plans
/// number their messages from 0 up), so ranks that disagree still meet on it. Its payload is
/// the signature, then, for a small first message, that message's own tag and data: one frame
/// and no extra syscall on the latency path. Larger first messages follow the signature in
/// their own frame, which costs less than copying them.
const SIGNATURE_TAG: u32 = u32::MAX;
/// The largest first message carried inside the signature message.
const BUNDLE_MAX: usize = 16 << 10;
/// Signature, then the carried message's tag.
const BUNDLE_HEADER: usize = SIGNATURE_BYTES + 4;

/// Per peer: the signature still has to be sent to it / received from it.
const SIGNATURE_TO_SEND: u8 = 1;
const SIGNATURE_AWAITED: u8 = 2;

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

/// Progress of one plan.
#[derive(Debug)]
pub struct Executor<'p> {
    plan: &'p Plan,
    waiting_for: Vec<usize>,
    ready: Vec<usize>,
    done: Vec<bool>,
    finished: usize,
    staging: Vec<u8>,
    /// A small message with the signature in front.
    bundle: Vec<u8>,
    /// Messages that arrived inside a signature message, waiting for their receive step:
    /// (peer, tag, message); at most one per peer.
    carried: Vec<(usize, u32, Received)>,
    /// Signature exchange state per peer (`SIGNATURE_*` bits), and the peers whose
    /// signature has not arrived yet (the operation is not done before they have).
    signature_state: Vec<u8>,
    signature_peers: Vec<usize>,
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
}

/// The vectors an executor works in, kept between operations by whoever drives them.
#[derive(Debug, Default)]
pub struct ExecScratch {
    waiting_for: Vec<usize>,
    ready: Vec<usize>,
    done: Vec<bool>,
    staging: Vec<u8>,
    bundle: Vec<u8>,
    carried: Vec<(usize, u32, Received)>,
    signature_state: Vec<u8>,
    signature_peers: Vec<usize>,
    peer_bytes: Vec<[u64; 2]>,
    link_rates: Vec<(usize, f32)>,
    peer_marks: Vec<bool>,
}

/// The most device-to-host copies an executor keeps in flight ahead of their sends.
const DOWNLOADS_AHEAD: usize = 8;

impl<'p> Executor<'p> {
    pub fn new(plan: &'p Plan, world: usize) -> Self {
        Self::reusing(plan, world, ExecScratch::default())
    }

    /// An executor that takes its vectors from `scratch` (the previous operation's, given
    /// back by [`Executor::into_scratch`]): no allocation per operation in steady state.
    pub fn reusing(plan: &'p Plan, world: usize, scratch: ExecScratch) -> Self {
        let ExecScratch {
            mut waiting_for,
            mut ready,
            mut done,
            staging,
            bundle,
            mut carried,
            mut signature_state,
            mut signature_peers,
            mut peer_bytes,
            mut link_rates,
            peer_marks,
        } = scratch;
        let n = plan.steps.len();
        waiting_for.clear();
        waiting_for.extend(plan.steps.iter().map(|s| s.deps.len()));
        signature_state.clear();
        signature_state.resize(world, 0);
        signature_peers.clear();
        for step in &plan.steps {
            let (peer, tag, bit) = match step.action {
                Action::Send { peer, tag, .. } => (peer, tag, SIGNATURE_TO_SEND),
                Action::Recv { peer, tag, .. } => (peer, tag, SIGNATURE_AWAITED),
                _ => continue,
            };
            debug_assert_ne!(tag, SIGNATURE_TAG, "a plan used the signature's tag");
            if bit == SIGNATURE_AWAITED && signature_state[peer] & bit == 0 {
                signature_peers.push(peer);
            }
            signature_state[peer] |= bit;
        }
        ready.clear();
        ready.extend((0..n).filter(|i| waiting_for[*i] == 0));
        carried.clear();
        done.clear();
        done.resize(n, false);
        peer_bytes.clear();
        peer_bytes.resize(world, [0; 2]);
        link_rates.clear();
        Executor {
            plan,
            waiting_for,
            ready,
            done,
            finished: 0,
            staging,
            bundle,
            carried,
            signature_state,
            signature_peers,
            last_progress: Instant::now(),
            peer_bytes,
            link_rates,
            peer_marks,
            device_bytes: 0,
            device_secs: 0.0,
            downloads: Vec::new(),
            downloads_ahead: None,
        }
    }

    /// The vectors of this executor, for the next operation's (see [`Executor::reusing`]).
    pub fn into_scratch(self) -> ExecScratch {
        ExecScratch {
            waiting_for: self.waiting_for,
            ready: self.ready,
            done: self.done,
            staging: self.staging,
            bundle: self.bundle,
            carried: self.carried,
            signature_state: self.signature_state,
            signature_peers: self.signature_peers,
            peer_bytes: self.peer_bytes,
            link_rates: self.link_rates,
            peer_marks: self.peer_marks,
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
        self.finished == self.plan.steps.len() && self.signature_peers.is_empty()
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
        if !self.signature_peers.is_empty() {
            moved |= self.exchange_signatures(transport, ctx)?;
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
        if moved {
            self.last_progress = Instant::now();
        }
        Ok(moved)
    }

    /// Check the separate signature frames that have arrived (small messages carry theirs
    /// in front of their data instead, see `run_step`).
    fn exchange_signatures(
        &mut self,
        transport: &mut dyn Transport,
        ctx: &OpContext<'_>,
    ) -> Result<bool, ExecError> {
        let mut moved = false;
        let mut k = 0;
        while k < self.signature_peers.len() {
            let peer = self.signature_peers[k];
            if let Some(message) = transport.try_recv(peer, ctx.tag(SIGNATURE_TAG))? {
                let theirs = message
                    .data
                    .get(..SIGNATURE_BYTES)
                    .and_then(Signature::decode);
                let carried = message
                    .data
                    .get(SIGNATURE_BYTES..BUNDLE_HEADER)
                    .map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]));
                if let Err(e) = check_signature(ctx, peer, theirs) {
                    transport.release(message);
                    return Err(e);
                }
                match carried {
                    Some(tag) => self.carried.push((peer, tag, message)),
                    None => transport.release(message),
                }
                self.signature_state[peer] &= !SIGNATURE_AWAITED;
                self.signature_peers.swap_remove(k);
                moved = true;
            } else {
                k += 1;
            }
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
            Action::Send { peer, tag, from } => {
                let (peer, tag) = (*peer, *tag);
                if let Some(at) = self.downloads.iter().position(|(s, _)| *s == index) {
                    if !self.downloads[at].1.ready()? {
                        return Ok(false);
                    }
                    let (step, download) = self.downloads.swap_remove(at);
                    let sent = send_bytes(
                        transport,
                        ctx,
                        peer,
                        tag,
                        download.bytes(),
                        &mut self.bundle,
                        &mut self.signature_state,
                        &mut self.peer_bytes,
                    )?;
                    if !sent {
                        self.downloads.push((step, download));
                    }
                    return Ok(sent);
                }
                let bytes = memory.read(*from, esize, ctx, &mut self.staging)?;
                send_bytes(
                    transport,
                    ctx,
                    peer,
                    tag,
                    bytes,
                    &mut self.bundle,
                    &mut self.signature_state,
                    &mut self.peer_bytes,
                )
            }
            Action::Recv {
                peer,
                tag,
                into,
                reduce,
                seed,
            } => {
                let (peer, expected) = (*peer, into.len * esize);
                let carried = self
                    .carried
                    .iter()
                    .position(|(p, t, _)| *p == peer && t == tag);
                // A message that overwrites host memory is written there by the transport
                // (tcp: straight from the socket, with no copy through a buffer of its own).
                let landing = if carried.is_none() && !*reduce && seed.is_none() && expected > 0 {
                    match memory.host_mut(*into, esize)? {
                        Some(dest) => Some(transport.try_recv_into(peer, ctx.tag(*tag), dest)?),
                        None => None,
                    }
                } else {
                    None
                };
                let outcome = match landing {
                    Some(Landing::Pending) => return Ok(false),
                    Some(Landing::Filled(transfer)) => {
                        record_link_rate(&mut self.link_rates, peer, expected, transfer);
                        Ok(())
                    }
                    Some(Landing::WrongLength(got)) => Err(ExecError::Mismatch {
                        peer,
                        got,
                        expected,
                    }),
                    None => match self.deliver(index, transport, memory, ctx, carried)? {
                        Some(outcome) => outcome,
                        None => return Ok(false),
                    },
                };
                match outcome {
                    Ok(()) => {
                        self.peer_bytes[peer][1] += expected as u64;
                        Ok(true)
                    }
                    Err(ExecError::Mismatch { .. }) => {
                        // A different operation, most likely: its signature (sent on its own
                        // ahead of large data) says which, if it is here.
                        self.exchange_signatures(transport, ctx)?;
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

    /// Hand the message of receive step `index` to its [`Sink`] (the carried one, if any):
    /// `Ok(None)`, it has not arrived; `Ok(Some(outcome))`, what delivering it did.
    fn deliver(
        &mut self,
        index: usize,
        transport: &mut dyn Transport,
        memory: &mut Bindings<'_>,
        ctx: &OpContext<'_>,
        carried: Option<usize>,
    ) -> Result<Option<Result<(), ExecError>>, ExecError> {
        let plan = self.plan;
        let Action::Recv {
            peer,
            tag,
            into,
            reduce,
            seed,
        } = &plan.steps[index].action
        else {
            return Err(ExecError::Binding(format!("step {index} is not a receive")));
        };
        let (peer, expected) = (*peer, into.len * ctx.dtype.size());
        let mut sink = Sink {
            peer,
            expected,
            into: *into,
            reduce: *reduce,
            seed: *seed,
            memory,
            ctx,
            device_secs: &mut self.device_secs,
            device_bytes: &mut self.device_bytes,
            link_rates: &mut self.link_rates,
        };
        match carried {
            Some(at) => {
                let message = self.carried.swap_remove(at).2;
                let outcome = sink.deliver(&message.data[BUNDLE_HEADER..], None);
                transport.release(message);
                Ok(Some(outcome))
            }
            None => {
                // Handed over where it lies (in a shared-memory ring: no copy out).
                let mut outcome = None;
                let arrived =
                    transport.try_recv_with(peer, ctx.tag(*tag), &mut |data, transfer| {
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
        }
    }
}

/// Send one message of a plan to `peer`, the operation's signature in front of the first
/// (bundled into one frame when small). Returns whether the transport took it.
#[allow(clippy::too_many_arguments)]
fn send_bytes(
    transport: &mut dyn Transport,
    ctx: &OpContext<'_>,
    peer: usize,
    tag: u32,
    bytes: &[u8],
    bundle: &mut Vec<u8>,
    signature_state: &mut [u8],
    peer_bytes: &mut [[u64; 2]],
) -> Result<bool, ExecError> {
    let len = bytes.len();
    let sent = if signature_state[peer] & SIGNATURE_TO_SEND == 0 {
        transport.try_send(peer, ctx.tag(tag), bytes)?
    } else if len <= BUNDLE_MAX {
        bundle.clear();
        bundle.extend_from_slice(&ctx.signature.encode());
        bundle.extend_from_slice(&tag.to_le_bytes());
        bundle.extend_from_slice(bytes);
        let sent = transport.try_send(peer, ctx.tag(SIGNATURE_TAG), bundle)?;
        if sent {
            signature_state[peer] &= !SIGNATURE_TO_SEND;
        }
        sent
    } else {
        if !transport.try_send(peer, ctx.tag(SIGNATURE_TAG), &ctx.signature.encode())? {
            return Ok(false);
        }
        signature_state[peer] &= !SIGNATURE_TO_SEND;
        transport.try_send(peer, ctx.tag(tag), bytes)?
    };
    if sent {
        peer_bytes[peer][0] += len as u64;
    }
    Ok(sent)
}

/// Where one received message goes: reduced into or written over a region (seeded first, for
/// out-of-place reductions), with the time and bytes the device spent on it.
struct Sink<'s, 'm, 'c> {
    peer: usize,
    expected: usize,
    into: Region,
    reduce: bool,
    seed: Option<Region>,
    memory: &'s mut Bindings<'m>,
    ctx: &'s OpContext<'c>,
    device_secs: &'s mut f64,
    device_bytes: &'s mut u64,
    link_rates: &'s mut Vec<(usize, f32)>,
}

impl Sink<'_, '_, '_> {
    fn deliver(
        &mut self,
        data: &[u8],
        transfer: Option<std::time::Duration>,
    ) -> Result<(), ExecError> {
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
        let started = timed.then(Instant::now);
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
            *self.device_secs += started.elapsed().as_secs_f64();
            *self.device_bytes += got as u64;
        }
        record_link_rate(self.link_rates, self.peer, got, transfer);
        done
    }
}

/// The wire rate of a message from `peer` large enough to carry one (slow-node detection).
fn record_link_rate(
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

/// `theirs`, received from `peer`, must be the counterpart of this operation's signature.
fn check_signature(
    ctx: &OpContext<'_>,
    peer: usize,
    theirs: Option<Signature>,
) -> Result<(), ExecError> {
    match theirs {
        Some(t) if ctx.signature.matches(ctx.rank, peer, &t) => Ok(()),
        theirs => Err(ExecError::Desync { peer, theirs }),
    }
}

/// Host-side reduction used for host-memory regions: the reference kernels.
fn host_reduce(dst: &mut [u8], src: &[u8], ctx: &OpContext<'_>) -> Result<(), ExecError> {
    kernels::reduce_bytes(dst, src, ctx.dtype, ctx.op)
        .map_err(|e| ExecError::Binding(e.to_string()))
}

fn byte_range(r: Region, esize: usize) -> std::ops::Range<usize> {
    r.offset * esize..(r.offset + r.len) * esize
}
