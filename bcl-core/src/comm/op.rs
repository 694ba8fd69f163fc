//! One operation's life, in three stages:
//! * **begin**: the next sequence number (per collective, or per peer and direction for
//!   send/recv), the signature every peer will check, the algorithm, the plan (cached), and
//!   scratch space bound to the plan's `Scratch` buffer;
//! * **drive**: the executor polls the transport and the device until the plan is done; when
//!   nothing moves, the [`Waiter`] decides how to wait and when to give up;
//! * **end**: the measurements and the outcome go to the health layer (flight recorder,
//!   slow-node detector), and an error that poisons marks the communicator.

use super::Shared;
use super::errors::{device_error, exec_error, fault_error, poison_if_fatal};
use super::lines::{self, LineScratch};
use super::wait::{SLEEP, Waiter};
use crate::error::Result;
use crate::exec::{
    Bindings, Clock, ExecError, ExecScratch, Executor, Measurements, Memory, OpContext, tag_base,
};
use crate::schedule::{
    Algorithm, AllToAllCounts, Collective, Plan, build_plan, build_plan_v, connections_per_peer,
    lend_from, select,
};
use crate::signature::Signature;
use bcl_backends::{DataType, DeviceBuffer, ReduceOp};
use bcl_transport::Transport;
use std::sync::Arc;

/// What one call asks for.
#[derive(Clone, Debug)]
pub(super) struct Call {
    pub collective: Collective,
    /// As NCCL counts; for [`Collective::AllToAllV`] the elements sent in all.
    pub count: usize,
    pub dtype: DataType,
    /// The buffers are device memory (scratch is then made on the device too).
    pub on_device: bool,
    /// The per-pair counts of an [`Collective::AllToAllV`].
    pub counts: Option<Arc<AllToAllCounts>>,
}

/// The state one operation at a time works on: the transport, sequence numbers, plans and
/// scratch space.
pub(super) struct Engine {
    pub(super) transport: Box<dyn Transport>,
    sequences: Sequences,
    plans: PlanCache,
    host_scratch: Vec<u8>,
    device_scratch: Option<DeviceBuffer>,
    /// The executor's vectors, reused from operation to operation.
    exec_scratch: ExecScratch,
    /// The small-message path's buffers.
    line_scratch: LineScratch,
}

impl Engine {
    pub(super) fn new(transport: Box<dyn Transport>, world: usize) -> Self {
        Engine {
            transport,
            sequences: Sequences {
                collective: 0,
                sent_to: vec![0; world],
                received_from: vec![0; world],
            },
            plans: PlanCache::default(),
            host_scratch: Vec::new(),
            device_scratch: None,
            exec_scratch: ExecScratch::default(),
            line_scratch: LineScratch::default(),
        }
    }
}

/// Sequence numbers: of the last collective (every rank takes part), and of the last message
/// sent to / received from each peer. A transfer from A to B is A's n-th send to B and B's
/// n-th receive from A, whatever else either rank does in between.
struct Sequences {
    collective: u32,
    sent_to: Vec<u32>,
    received_from: Vec<u32>,
}

impl Sequences {
    /// The sequence number of the next `collective` (send/recv count in their own space,
    /// see [`tag_base`]).
    fn next(&mut self, collective: Collective) -> u32 {
        let counter = match collective {
            Collective::Send { peer } => &mut self.sent_to[peer],
            Collective::Recv { peer } => &mut self.received_from[peer],
            _ => &mut self.collective,
        };
        *counter = counter.wrapping_add(1);
        *counter
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct PlanKey {
    collective: Collective,
    algorithm: Algorithm,
    count: usize,
    in_place: bool,
    slice_elems: usize,
}

/// How many plans a communicator keeps (least recently used dropped first).
const PLANS_KEPT: usize = 64;

/// Plans by key, most recently used first (a few keys at a time: a linear search beats
/// hashing the key); and the plan of the last all-to-all with per-pair counts, which is
/// built for each call (its counts are the caller's every time).
#[derive(Default)]
struct PlanCache {
    kept: Vec<(PlanKey, Plan)>,
    one_off: Option<Plan>,
}

impl PlanCache {
    fn one_off(&mut self, plan: Plan) -> &Plan {
        self.one_off.insert(plan)
    }

    fn get(&mut self, key: PlanKey, build: impl FnOnce() -> Plan) -> &Plan {
        let plans = &mut self.kept;
        match plans.iter().position(|(k, _)| *k == key) {
            Some(0) => {}
            Some(at) => {
                let entry = plans.remove(at);
                plans.insert(0, entry);
            }
            None => {
                plans.truncate(PLANS_KEPT - 1);
                plans.insert(0, (key, build()));
            }
        }
        &plans[0].1
    }
}

/// Run one operation to completion (or error) on the calling thread.
pub(super) fn run<'a>(
    shared: &Shared,
    engine: &'a mut Engine,
    call: Call,
    mut bindings: Bindings<'a>,
) -> Result<()> {
    let Engine {
        transport,
        sequences,
        plans,
        host_scratch,
        device_scratch,
        exec_scratch,
        line_scratch,
    } = engine;
    if takes_lines(shared, &call) {
        let op = signature_of(sequences, &call);
        return lines::run(shared, transport.as_mut(), line_scratch, op, bindings);
    }
    let begun = begin(shared, sequences, plans, &call, bindings.input.is_none());
    let scratch = begun.plan.scratch_elems * call.dtype.size();
    bindings.scratch = bind_scratch(shared, &call, scratch, host_scratch, device_scratch)?;
    let bytes = call.count * call.dtype.size();
    let ctx = OpContext {
        tag_base: tag_base(begun.signature.seq, call.collective.is_point_to_point()),
        dtype: call.dtype,
        op: call
            .collective
            .reduce_op()
            .unwrap_or(ReduceOp::Sum)
            .accumulate_op(),
        world: shared.world,
        accelerator: shared.accelerator.as_ref(),
        stream: shared.accelerator.default_stream(),
        rank: shared.rank,
        signature: begun.signature,
        clock: &shared.clock,
        lend_bytes: lend_from(
            call.collective,
            begun.algorithm,
            bytes,
            shared.config.algorithm.is_some(),
            shared.config.single_copy_bytes,
        ),
    };
    shared
        .health
        .op_started(begun.signature, begun.algorithm.name());
    let per_peer = (shared.config.sockets_per_op)
        .or_else(|| connections_per_peer(call.collective, bytes, shared.fabric));
    transport.limit_connections(per_peer);
    let scratch = std::mem::take(exec_scratch);
    let mut exec = Executor::reusing(begun.plan, shared.world, scratch, shared.clock.now());
    let outcome = drive(shared, transport.as_mut(), &mut exec, &mut bindings, &ctx);
    end(shared, &exec, &outcome);
    // Links that moved path during the operation: the list is fetched only when it grew.
    if transport.path_change_count() > shared.health.degraded_count() {
        shared.health.note_path_changes(&transport.path_changes());
    }
    *exec_scratch = exec.into_scratch();
    outcome
}

/// An operation that has begun: what every peer will check, and the plan to run.
struct Begun<'e> {
    signature: Signature,
    algorithm: Algorithm,
    plan: &'e Plan,
}

/// Whether `call` goes over the lines instead of a plan (`lines.rs`): a small all-reduce or a
/// barrier, every peer on this host's shared memory and on the cpu backend (device buffers
/// are host memory there, so a call through a stream takes the same path as one without), no
/// algorithm forced. The same answer on every rank for the same call.
fn takes_lines(shared: &Shared, call: &Call) -> bool {
    call.counts.is_none() && lines::taken(shared, call.collective, call.count * call.dtype.size())
}

/// The next sequence number, and the signature every peer will check.
fn signature_of(sequences: &mut Sequences, call: &Call) -> Signature {
    Signature {
        seq: sequences.next(call.collective),
        collective: call.collective,
        // Ranks of an all-to-all with per-pair counts send different totals: its counts are
        // checked pair by pair, by each message's size.
        count: if call.counts.is_some() {
            0
        } else {
            call.count as u64
        },
        dtype: call.dtype,
    }
}

/// The first stage: sequence number, signature, algorithm and plan.
fn begin<'e>(
    shared: &Shared,
    sequences: &mut Sequences,
    plans: &'e mut PlanCache,
    call: &Call,
    in_place: bool,
) -> Begun<'e> {
    let signature = signature_of(sequences, call);
    let bytes = call.count * call.dtype.size();
    let algorithm = (shared.config.algorithm)
        .unwrap_or_else(|| select(call.collective, bytes, shared.fabric))
        .for_collective(call.collective);
    let slice_elems = (shared.config.slice_bytes / call.dtype.size()).max(1);
    if let Some(counts) = &call.counts {
        let plan = plans.one_off(build_plan_v(
            call.collective,
            &shared.layout,
            counts,
            slice_elems,
        ));
        return Begun {
            signature,
            algorithm,
            plan,
        };
    }
    let key = PlanKey {
        collective: call.collective,
        algorithm,
        count: call.count,
        in_place,
        slice_elems,
    };
    let plan = plans.get(key, || {
        let layout = &shared.layout;
        build_plan(
            key.collective,
            algorithm,
            layout,
            key.count,
            in_place,
            key.slice_elems,
        )
    });
    Begun {
        signature,
        algorithm,
        plan,
    }
}

/// Scratch memory of `bytes` for the plan (on the device for device calls), kept between
/// operations and grown when a plan needs more.
fn bind_scratch<'a>(
    shared: &Shared,
    call: &Call,
    bytes: usize,
    host: &'a mut Vec<u8>,
    device: &'a mut Option<DeviceBuffer>,
) -> Result<Option<Memory<'a>>> {
    if bytes == 0 {
        return Ok(None);
    }
    if !call.on_device {
        if host.len() < bytes {
            host.resize(bytes, 0);
        }
        return Ok(Some(Memory::HostWrite(&mut host[..bytes])));
    }
    if device.as_ref().is_none_or(|b| b.len() < bytes) {
        let fresh = shared.accelerator.allocate(bytes);
        *device = Some(fresh.map_err(|e| device_error(shared, e))?);
    }
    Ok(device.as_ref().map(Memory::Device))
}

/// Poll the executor until the plan is done and every accepted send has left this process,
/// or the operation fails.
fn drive(
    shared: &Shared,
    transport: &mut dyn Transport,
    exec: &mut Executor<'_>,
    bindings: &mut Bindings<'_>,
    ctx: &OpContext<'_>,
) -> Result<()> {
    let signature = ctx.signature;
    let mut waiter = Waiter::new(shared);
    loop {
        if shared.health.faulted() {
            return Err(fault_error(shared, shared.health.verdict(), signature));
        }
        match exec.poll(transport, bindings, ctx) {
            Err(e) => return Err(exec_error(shared, e, signature)),
            // A transport that still queues bytes (tcp's socket buffers full, rdma out of
            // credits) needs this rank's progress to deliver them, and an idle rank makes none.
            Ok(_) if exec.is_done() && transport.flushed() => return Ok(()),
            Ok(true) => waiter.moved(),
            Ok(false) => {
                if waiter.idle(shared, exec, transport, signature)? {
                    transport
                        .wait(SLEEP)
                        .map_err(|e| exec_error(shared, ExecError::Transport(e), signature))?;
                }
            }
        }
    }
}

/// Hand the operation's figures and outcome to the health layer; poison on a fault.
fn end(shared: &Shared, exec: &Executor<'_>, outcome: &Result<()>) {
    let measured = Measurements {
        link_rates: exec.link_rates.clone(),
        device_bytes: exec.device_bytes,
        device_secs: exec.device_secs,
    };
    shared.health.op_finished(
        exec.peer_bytes().filter(|b| b.sent > 0 || b.received > 0),
        outcome.as_ref().err().map(|e| e.to_string()),
        measured,
    );
    poison_if_fatal(shared, outcome);
}
