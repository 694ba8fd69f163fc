//! N executors of one operation over the virtual network, driven in one thread in an order
//! drawn from the seed, with inputs drawn from the seed and results checked against
//! `bcl-oracle` (which shares no code with the kernels).

use super::fabric::{Faults, Net, Rng, VirtualClock};
use crate::exec::{Bindings, Clock, ExecError, Executor, Memory, OpContext, tag_base};
use crate::schedule::{Algorithm, Collective, Layout, Plan, build_plan};
use crate::signature::Signature;
use bcl_backends::cpu::CpuDevice;
use bcl_backends::sim::{SimConfig, SimDevice};
use bcl_backends::{Accelerator, DataType, DeviceBuffer, ReduceOp};
use bcl_oracle::{Op, Type, Value};
use std::sync::Arc;

/// One operation on every rank.
#[derive(Clone, Debug)]
pub struct Case {
    pub collective: Collective,
    pub algorithm: Algorithm,
    pub world: usize,
    pub count: usize,
    pub dtype: DataType,
    pub in_place: bool,
    pub slice_elems: usize,
    /// Ring position → rank.
    pub ring: Vec<usize>,
    /// The ranks of each host (the hierarchical algorithms follow them).
    pub hosts: Vec<Vec<usize>>,
    /// Each rank's relative speed (the hierarchical allreduce sizes shares by it).
    pub weights: Vec<u32>,
    /// Ranks whose buffers live on a `sim` device (reached through the accelerator only).
    pub on_device: Vec<bool>,
}

/// How the world ended: each rank done, failed, or still waiting (the peers it waits on).
#[derive(Debug)]
pub struct Outcome {
    pub done: Vec<bool>,
    pub errors: Vec<Option<ExecError>>,
    /// For ranks neither done nor failed: the peers their ready receives wait for, and the
    /// peers their ready sends cannot send to.
    pub waiting_on: Vec<Vec<usize>>,
    pub blocked_sends: Vec<Vec<usize>>,
    /// Each rank's output buffer afterwards (the one buffer, in place).
    pub outputs: Vec<Vec<u8>>,
    /// Messages the transport had filled in place (from device memory).
    pub filled: usize,
}

/// The collective rank `rank` calls for `case` (send/recv: rank 0 sends to the last rank).
pub fn rank_collective(case: &Case, rank: usize) -> Option<Collective> {
    crate::schedule::checker::role(case.collective, case.world, rank)
}

fn oracle_type(dtype: DataType) -> Type {
    Type::named(dtype.name()).expect("the oracle knows every dtype")
}

fn oracle_op(op: ReduceOp) -> Op {
    Op::named(op.name()).expect("the oracle knows every op")
}

/// One input element drawn so that every order of reduction gives the same result (the
/// oracle's exact domain): integers of the whole range; floats small integers for sums and
/// products, any finite or NaN value (no -0) for min and max.
fn draw(rng: &mut Rng, dtype: DataType, op: Option<ReduceOp>) -> Vec<u8> {
    let ty = oracle_type(dtype);
    let raw = rng.next().to_le_bytes()[..ty.size()].to_vec();
    if !ty.is_float() || op.is_none() {
        return raw;
    }
    let small = |rng: &mut Rng, choices: &[i128]| Value::Int(choices[rng.below(choices.len())]);
    let v = match op {
        Some(ReduceOp::Prod) => small(rng, &[-2, -1, 1, 2]),
        Some(ReduceOp::Min | ReduceOp::Max) => match bcl_oracle::value(ty, &raw) {
            Value::Float(x) if x.is_sign_negative() && x == 0.0 => Value::Float(0.0),
            Value::Float(x) if x.is_infinite() => Value::Float(1.0),
            v => v,
        },
        _ => small(rng, &[-4, -3, -2, -1, 0, 1, 2, 3, 4]),
    };
    bcl_oracle::bytes(ty, v)
}

/// Every rank's initial buffer (out of place: the input; in place: the one buffer).
pub fn inputs(case: &Case, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed ^ 0x1a2b);
    let esize = case.dtype.size();
    (0..case.world)
        .map(|rank| {
            let Some(c) = rank_collective(case, rank) else {
                return Vec::new();
            };
            let (i, o) = c.buffer_elems(case.count, case.world, rank);
            let (i, o) = (i.unwrap_or(0), o.unwrap_or(0));
            let len = if case.in_place { i.max(o) } else { i };
            let mut buf = vec![0u8; len * esize];
            let at = match c {
                Collective::AllGather if case.in_place => rank * case.count,
                _ => 0,
            };
            for e in at..at + i {
                let v = draw(&mut rng, case.dtype, c.reduce_op());
                buf[e * esize..(e + 1) * esize].copy_from_slice(&v);
            }
            buf
        })
        .collect()
}

/// The memory of one rank: host vectors, or sim device buffers.
struct RankMemory {
    input: Vec<u8>,
    output: Vec<u8>,
    scratch: Vec<u8>,
    device: Option<(Option<DeviceBuffer>, DeviceBuffer, DeviceBuffer)>,
}

/// Run `case` to quiescence: every rank done or failed, or nothing left that can move.
/// `stalled` never polls.
pub fn run(case: &Case, seed: u64, faults: Faults, stalled: Option<usize>) -> Outcome {
    run_ranks(&vec![case; case.world], seed, faults, stalled)
}

/// As [`run`], each rank running its own case (ranks that disagree: a desync).
pub fn run_mixed(cases: &[&Case], seed: u64) -> Outcome {
    run_ranks(cases, seed, Faults::default(), None)
}

fn run_ranks(cases: &[&Case], seed: u64, faults: Faults, stalled: Option<usize>) -> Outcome {
    let n = cases[0].world;
    let mut rng = Rng::new(seed);
    let clock = Arc::new(VirtualClock::new());
    let net = Net::new(n, seed, faults, clock.clone());
    let devices: Vec<Arc<dyn Accelerator>> = (0..n)
        .map(|r| -> Arc<dyn Accelerator> {
            if cases[0].on_device[r] {
                Arc::new(SimDevice::new(r as u32, SimConfig::default()))
            } else {
                Arc::new(CpuDevice::new(r as u32))
            }
        })
        .collect();
    let plans: Vec<Plan> = (0..n).map(|r| plan(cases[r], r)).collect();
    let mut memory: Vec<RankMemory> = (0..n)
        .map(|r| {
            let start = inputs(cases[r], seed).swap_remove(r);
            RankMemory::new(cases[r], r, start, &plans[r], devices[r].as_ref())
        })
        .collect();
    let mut nodes: Vec<Node<'_>> = (memory.iter_mut().enumerate())
        .map(|(r, m)| {
            Node::new(
                cases[r],
                r,
                m,
                &plans[r],
                devices[r].as_ref(),
                clock.as_ref(),
                &net,
            )
        })
        .collect();
    let outcome = drive(&mut nodes, &net, clock.as_ref(), &mut rng, stalled);
    drop(nodes);
    let outputs = (memory.iter_mut().zip(&devices))
        .map(|(m, acc)| m.output_bytes(acc.as_ref()))
        .collect();
    let filled = net.filled();
    Outcome {
        outputs,
        filled,
        ..outcome
    }
}

/// Rank `r`'s plan for `case`.
fn plan(case: &Case, r: usize) -> Plan {
    match rank_collective(case, r) {
        Some(c) => {
            let layout = Layout::new(r, case.ring.clone())
                .and_then(|l| l.with_hosts(case.hosts.clone()))
                .and_then(|l| l.with_weights(case.weights.clone()))
                .expect("a permutation, a partition and a weight per rank");
            build_plan(
                c,
                case.algorithm,
                &layout,
                case.count,
                case.in_place,
                case.slice_elems,
            )
        }
        None => Plan::default(),
    }
}

impl RankMemory {
    /// Rank `r`'s buffers, starting with `start`, on `device` where the case says.
    fn new(case: &Case, r: usize, start: Vec<u8>, plan: &Plan, device: &dyn Accelerator) -> Self {
        let esize = case.dtype.size();
        let out_elems = rank_collective(case, r)
            .map(|c| c.buffer_elems(case.count, case.world, r).1.unwrap_or(0))
            .unwrap_or(0);
        let (input, output) = if case.in_place {
            (Vec::new(), start)
        } else {
            (start, vec![0u8; out_elems * esize])
        };
        let scratch = vec![0u8; plan.scratch_elems * esize];
        let up = |bytes: &[u8]| {
            let b = device.allocate(bytes.len()).expect("allocate");
            device
                .copy_to_device(b.full(), bytes, &device.default_stream())
                .expect("h2d");
            b
        };
        let on_device = case.on_device[r].then(|| {
            (
                (!case.in_place).then(|| up(&input)),
                up(&output),
                up(&scratch),
            )
        });
        RankMemory {
            input,
            output,
            scratch,
            device: on_device,
        }
    }

    /// The output buffer's bytes, from the device where they live there.
    fn output_bytes(&mut self, device: &dyn Accelerator) -> Vec<u8> {
        if let Some((_, out, _)) = &self.device {
            (device.copy_to_host(&mut self.output, out.full(), &device.default_stream()))
                .expect("d2h");
        }
        std::mem::take(&mut self.output)
    }
}

/// One rank of the world: its executor, memory, operation and network end.
struct Node<'a> {
    exec: Executor<'a>,
    bindings: Bindings<'a>,
    ctx: OpContext<'a>,
    endpoint: super::fabric::Endpoint,
}

impl<'a> Node<'a> {
    fn new(
        case: &Case,
        r: usize,
        m: &'a mut RankMemory,
        plan: &'a Plan,
        device: &'a dyn Accelerator,
        clock: &'a VirtualClock,
        net: &Net,
    ) -> Self {
        let collective = rank_collective(case, r).unwrap_or(Collective::Barrier);
        let bindings = match &m.device {
            Some((input, output, scratch)) => Bindings {
                input: input.as_ref().map(Memory::Device),
                output: Some(Memory::Device(output)),
                scratch: Some(Memory::Device(scratch)),
            },
            None => Bindings {
                input: (!case.in_place).then_some(Memory::HostRead(&m.input[..])),
                output: Some(Memory::HostWrite(&mut m.output[..])),
                scratch: Some(Memory::HostWrite(&mut m.scratch[..])),
            },
        };
        let signature = Signature {
            seq: 1,
            collective,
            count: case.count as u64,
            dtype: case.dtype,
        };
        let ctx = OpContext {
            tag_base: tag_base(1, collective.is_point_to_point()),
            dtype: case.dtype,
            op: collective
                .reduce_op()
                .unwrap_or(ReduceOp::Sum)
                .accumulate_op(),
            world: case.world,
            accelerator: device,
            stream: device.default_stream(),
            rank: r,
            signature,
            clock,
            lend_bytes: 1,
        };
        Node {
            exec: Executor::new(plan, case.world, clock.now()),
            bindings,
            ctx,
            endpoint: net.endpoint(r),
        }
    }
}

/// Poll the ranks in an order drawn from `rng` until every one is done or failed, or nothing
/// can move any more (no rank moved and no message is in flight); `stalled` never polls.
fn drive(
    nodes: &mut [Node<'_>],
    net: &Net,
    clock: &VirtualClock,
    rng: &mut Rng,
    stalled: Option<usize>,
) -> Outcome {
    let n = nodes.len();
    let mut done = vec![false; n];
    let mut errors: Vec<Option<ExecError>> = (0..n).map(|_| None).collect();
    let mut order: Vec<usize> = (0..n).filter(|r| Some(*r) != stalled).collect();
    for _round in 0..50_000_000u64 {
        rng.shuffle(&mut order);
        let mut moved = false;
        for &r in &order {
            if done[r] || errors[r].is_some() {
                continue;
            }
            let node = &mut nodes[r];
            match node
                .exec
                .poll(&mut node.endpoint, &mut node.bindings, &node.ctx)
            {
                Ok(m) => moved |= m,
                Err(e) => {
                    errors[r] = Some(e);
                    moved = true;
                }
            }
            done[r] = node.exec.is_done();
        }
        if order.iter().all(|&r| done[r] || errors[r].is_some()) {
            break;
        }
        if !moved {
            // Nothing can move before the next arrival; with none in flight, nothing ever will.
            match net.next_arrival() {
                Some(t) => clock.advance_to(t),
                None => break,
            }
        }
    }
    let unfinished = |r: usize| !done[r] && errors[r].is_none();
    let waiting_on = (nodes.iter().enumerate())
        .map(|(r, node)| {
            if unfinished(r) {
                node.exec.waiting_on()
            } else {
                Vec::new()
            }
        })
        .collect();
    let blocked_sends = (nodes.iter().enumerate())
        .map(|(r, node)| {
            if unfinished(r) {
                node.exec.blocked_sends()
            } else {
                Vec::new()
            }
        })
        .collect();
    Outcome {
        waiting_on,
        blocked_sends,
        done,
        errors,
        outputs: Vec::new(),
        filled: 0,
    }
}

/// Check every specified output element against the oracle; `Err` names the first wrong one.
pub fn verify(case: &Case, start: &[Vec<u8>], outputs: &[Vec<u8>]) -> Result<(), String> {
    let (n, count, esize) = (case.world, case.count, case.dtype.size());
    let ty = oracle_type(case.dtype);
    let elem = |buf: &[u8], e: usize| buf[e * esize..(e + 1) * esize].to_vec();
    // Input element `i` of rank `q`, wherever its buffer keeps it.
    let input = |q: usize, i: usize| -> Vec<u8> {
        let at = match case.collective {
            Collective::AllGather if case.in_place => q * count,
            Collective::Gather { root } if case.in_place && q == root => q * count,
            _ => 0,
        };
        elem(&start[q], at + i)
    };
    let reduced = |i: usize, op: ReduceOp| -> Result<Vec<u8>, String> {
        let values: Vec<Value> = (0..n)
            .map(|q| bcl_oracle::value(ty, &input(q, i)))
            .collect();
        bcl_oracle::reduce(ty, oracle_op(op), &values)
    };
    for (r, out) in outputs.iter().enumerate() {
        let Some(c) = rank_collective(case, r) else {
            continue;
        };
        // (element of the output buffer, expected bytes)
        let expect: Vec<(usize, Vec<u8>)> = match c {
            Collective::AllReduce { op } => (0..count)
                .map(|i| Ok((i, reduced(i, op)?)))
                .collect::<Result<_, String>>()?,
            Collective::ReduceScatter { op } | Collective::ReduceScatterV { op } => {
                let home = if case.in_place { r * count } else { 0 };
                (0..count)
                    .map(|j| Ok((home + j, reduced(r * count + j, op)?)))
                    .collect::<Result<_, String>>()?
            }
            Collective::Reduce { op, root } if root == r => (0..count)
                .map(|i| Ok((i, reduced(i, op)?)))
                .collect::<Result<_, String>>()?,
            Collective::AllGather | Collective::AllGatherV => (0..n * count)
                .map(|j| (j, input(j / count, j % count)))
                .collect(),
            Collective::Broadcast { root } => (0..count).map(|i| (i, input(root, i))).collect(),
            Collective::AllToAll | Collective::AllToAllV => (0..n * count)
                .map(|j| (j, input(j / count, r * count + j % count)))
                .collect(),
            Collective::Recv { peer } => (0..count).map(|i| (i, input(peer, i))).collect(),
            Collective::Gather { root } if root == r => (0..n * count)
                .map(|j| (j, input(j / count, j % count)))
                .collect(),
            Collective::Scatter { root } => {
                let home = if case.in_place && r == root {
                    r * count
                } else {
                    0
                };
                (0..count)
                    .map(|i| (home + i, input(root, r * count + i)))
                    .collect()
            }
            Collective::Reduce { .. }
            | Collective::Gather { .. }
            | Collective::Send { .. }
            | Collective::Barrier => Vec::new(),
        };
        for (e, want) in expect {
            let got = elem(out, e);
            if !bcl_oracle::same(ty, &got, &want) {
                return Err(format!(
                    "rank {r} output element {e}: got {got:02x?}, expected {want:02x?}"
                ));
            }
        }
    }
    Ok(())
}
