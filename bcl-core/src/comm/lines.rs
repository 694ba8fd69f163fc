//! The small-message path: an all-reduce or barrier of a few KiB among ranks that all share
//! this host runs without a plan or an executor. Every rank posts its signature and its data
//! to every peer's lines (`bcl_transport::Lines`: data and arrival flag in one cache line),
//! collects every peer's, and reduces them in rank order, so every rank gets the same result
//! bit for bit. One cache-line transfer per 56 bytes from each peer, and no per-call setup,
//! where the planned path pays a ring record, its tail, the executor and the signature exchange
//! (2 ranks, 8 B, this VM: about 2 µs; OpenMPI's shared-memory path 0.5 µs).
//!
//! Every rank posts and every rank collects from all, which is what lets the lines go without
//! acknowledgements (see `Lines`). A peer whose post of the same number is for another
//! operation is a desync, named with both signatures; one that runs this operation on the
//! planned path (a different `BCL_LL_BYTES`) sends its signature as a message, found while
//! waiting.

use super::Shared;
use super::errors::{device_error, exec_error, fault_error, poison_if_fatal};
use super::wait::{Awaiting, SLEEP, Waiter};
use crate::error::{Error, Result};
use crate::exec::{Bindings, ExecError, Measurements, Memory, PeerBytes, signature_tag};
use crate::peers::RankInfo;
use crate::schedule::Collective;
use crate::signature::{SIGNATURE_BYTES, Signature};
use bcl_backends::{DeviceBuffer, ReduceOp, Vendor, kernels};
use bcl_transport::{Collected, Transport};
use std::time::Instant;

/// Whether a host call of `collective` over `bytes` takes the lines: a barrier, or an
/// all-reduce small enough (not an empty one: that stays a no-op, as in NCCL), every peer on
/// this host's shared memory, no algorithm forced. The same answer on every rank for the same
/// call.
pub(super) fn taken(shared: &Shared, collective: Collective, bytes: usize) -> bool {
    let kind = match collective {
        Collective::AllReduce { .. } => bytes > 0,
        Collective::Barrier => true,
        _ => false,
    };
    kind && shared.config.algorithm.is_none()
        && shared.lines_bytes > 0
        && bytes <= shared.lines_bytes
}

/// The largest all-reduce this communicator's lines carry: `configured` bytes (checked against
/// what the lines hold beside a signature); 0 when some peer is not on this host's shared memory, or
/// some rank's buffers are device memory (a rank of another vendor calls through its device:
/// it would run the planned path while its peers took the lines).
pub(super) fn capacity(
    transport: &mut dyn Transport,
    peers: &[RankInfo],
    configured: usize,
) -> usize {
    let world = peers.len();
    if peers.iter().any(|p| p.device.vendor != Vendor::Cpu) {
        return 0;
    }
    let Some(lines) = transport.lines() else {
        return 0;
    };
    let me_excluded = (0..world).filter(|&p| lines.reaches(p)).count();
    if world < 2 || me_excluded + 1 != world {
        return 0;
    }
    configured.min(lines.max_payload().saturating_sub(SIGNATURE_BYTES))
}

/// The stamp of the `post`-th post, for `op`: the post's number, and a check of the whole
/// signature (sequence number included).
///
/// Posts are numbered by the lines path alone, not by the collective sequence number: a
/// broadcast in between lets its root run one operation ahead of a rank that is still
/// collecting, and numbering only the operations in which everyone collects from everyone is
/// what keeps a set of lines from being reused too early (see `Lines`).
fn stamp(op: &Signature, post: u32) -> u64 {
    // FNV-1a.
    let mut h: u32 = 0x811c_9dc5;
    for b in op.encode() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    (u64::from(post) << 32) | u64::from(h | 1)
}

/// The lines path's state, kept between operations: the number of the last post, and a slot
/// per rank (signature, then data).
#[derive(Debug, Default)]
pub(super) struct LineScratch {
    posts: u32,
    slots: Vec<u8>,
    pending: Vec<usize>,
    /// The result of a call on device buffers, before it is copied there.
    result: Vec<u8>,
}

/// Where the gathering stands, for the waiter.
struct Gathering<'s> {
    pending: &'s [usize],
}

impl Awaiting for Gathering<'_> {
    fn last_progress(&self) -> Option<Instant> {
        None
    }

    fn waiting_on(&self) -> Vec<usize> {
        self.pending.to_vec()
    }

    fn blocked_sends(&self) -> Vec<usize> {
        Vec::new()
    }

    fn lost_peer(&mut self, transport: &dyn Transport) -> Option<usize> {
        self.pending
            .iter()
            .copied()
            .find(|&p| transport.peer_lost(p))
    }
}

fn no_lines() -> Error {
    Error::Internal("the transport's lines went away after init".into())
}

/// Run `op` (an all-reduce or a barrier) over the lines, its data in `bindings`.
pub(super) fn run(
    shared: &Shared,
    transport: &mut dyn Transport,
    scratch: &mut LineScratch,
    op: Signature,
    bindings: Bindings<'_>,
) -> Result<()> {
    let started = Instant::now();
    shared.health.op_started_at(op, "ll", started);
    let outcome = gather_and_reduce(shared, transport, scratch, op, bindings, started);
    let bytes = scratch.slots.len() / shared.world.max(1);
    let peers = (0..shared.world)
        .filter(|&p| p != shared.rank)
        .map(|peer| PeerBytes {
            peer,
            sent: bytes as u64,
            received: bytes as u64,
        });
    let error = outcome.as_ref().err().map(|e| e.to_string());
    shared
        .health
        .op_finished(peers, error, Measurements::default());
    poison_if_fatal(shared, &outcome);
    outcome
}

fn gather_and_reduce(
    shared: &Shared,
    transport: &mut dyn Transport,
    scratch: &mut LineScratch,
    op: Signature,
    bindings: Bindings<'_>,
    started: Instant,
) -> Result<()> {
    let (rank, world) = (shared.rank, shared.world);
    let Bindings { input, output, .. } = bindings;
    let len = op.count as usize * op.dtype.size();
    let slot = SIGNATURE_BYTES + len;
    let LineScratch {
        posts,
        slots,
        pending,
        result,
    } = scratch;
    *posts = posts.wrapping_add(1);
    let stamp = stamp(&op, *posts);
    slots.clear();
    slots.resize(slot * world, 0);
    slots[rank * slot..][..SIGNATURE_BYTES].copy_from_slice(&op.encode());
    let mine = &mut slots[rank * slot + SIGNATURE_BYTES..][..len];
    match input.as_ref().or(output.as_ref()) {
        Some(Memory::HostRead(i)) => mine.copy_from_slice(i),
        Some(Memory::HostWrite(o)) => mine.copy_from_slice(o),
        Some(Memory::Device(b)) => to_host(shared, mine, b)?,
        None => {}
    }
    pending.clear();
    pending.extend((0..world).filter(|&p| p != rank));
    transport
        .lines()
        .ok_or_else(no_lines)?
        .post(pending, stamp, &slots[rank * slot..][..slot])
        .map_err(|e| exec_error(shared, ExecError::Transport(e), op))?;
    let mut waiter = Waiter::starting_at(shared, started);
    while !pending.is_empty() {
        if shared.health.faulted() {
            return Err(fault_error(shared, shared.health.verdict(), op));
        }
        let lines = transport.lines().ok_or_else(no_lines)?;
        let mut moved = false;
        let mut k = 0;
        while k < pending.len() {
            let peer = pending[k];
            let out = &mut slots[peer * slot..][..slot];
            let found = lines
                .collect(peer, stamp, out)
                .map_err(|e| exec_error(shared, ExecError::Transport(e), op))?;
            match found {
                Collected::Complete => {
                    pending.swap_remove(k);
                    moved = true;
                }
                Collected::Partial => k += 1,
                Collected::Foreign(_) => {
                    let theirs = Signature::decode(&out[..SIGNATURE_BYTES]);
                    return Err(exec_error(shared, ExecError::Desync { peer, theirs }, op));
                }
            }
        }
        if pending.is_empty() {
            break;
        }
        if moved {
            waiter.moved();
            continue;
        }
        let mut state = Gathering { pending };
        if !waiter.idle(shared, &mut state, transport, op)? {
            continue;
        }
        planned_peer(shared, transport, op, pending)?;
        let awaited: Vec<(usize, u64, usize)> = pending.iter().map(|&p| (p, stamp, slot)).collect();
        let lines = transport.lines().ok_or_else(no_lines)?;
        lines
            .sleep(&awaited, SLEEP)
            .map_err(|e| exec_error(shared, ExecError::Transport(e), op))?;
    }
    let (out, device_out): (&mut [u8], _) = match output {
        None => return Ok(()),
        Some(Memory::HostWrite(o)) => (o, None),
        Some(Memory::Device(b)) => {
            result.resize(len, 0);
            (result.as_mut_slice(), Some(b))
        }
        Some(Memory::HostRead(_)) => {
            return Err(Error::Internal(format!("{op}: a read-only output")));
        }
    };
    let data = |r: usize| &slots[r * slot + SIGNATURE_BYTES..][..len];
    let reduce = op.collective.reduce_op().unwrap_or(ReduceOp::Sum);
    let kernel = |e: kernels::KernelError| Error::Internal(format!("{op}: {e}"));
    kernels::combine_bytes(out, data(0), data(1), op.dtype, reduce.accumulate_op())
        .map_err(kernel)?;
    for r in 2..world {
        kernels::reduce_bytes(out, data(r), op.dtype, reduce.accumulate_op()).map_err(kernel)?;
    }
    if reduce == ReduceOp::Avg {
        kernels::divide_bytes(out, op.dtype, world).map_err(kernel)?;
    }
    if let Some(b) = device_out {
        let acc = &shared.accelerator;
        let stream = acc.default_stream();
        acc.copy_to_device(b.full(), out, &stream)
            .and_then(|()| acc.synchronize(&stream))
            .map_err(|e| device_error(shared, e))?;
    }
    Ok(())
}

/// Copy a device buffer (host memory behind the cpu backend: the lines run only where every
/// rank computes there) into `dst`.
fn to_host(shared: &Shared, dst: &mut [u8], src: &DeviceBuffer) -> Result<()> {
    let acc = &shared.accelerator;
    let stream = acc.default_stream();
    acc.copy_to_host(dst, src.full(), &stream)
        .and_then(|()| acc.synchronize(&stream))
        .map_err(|e| device_error(shared, e))
}

/// A peer that runs this operation on the planned path sends its signature as a message
/// (tagged as the executor tags it): that is a desync, however equal the operations look.
fn planned_peer(
    shared: &Shared,
    transport: &mut dyn Transport,
    op: Signature,
    pending: &[usize],
) -> Result<()> {
    let tag = signature_tag(op.seq);
    for &peer in pending {
        let message = transport
            .try_recv(peer, tag)
            .map_err(|e| exec_error(shared, ExecError::Transport(e), op))?;
        if let Some(m) = message {
            let theirs = m.data.get(..SIGNATURE_BYTES).and_then(Signature::decode);
            transport.release(m);
            return Err(exec_error(shared, ExecError::Desync { peer, theirs }, op));
        }
    }
    Ok(())
}
