//! The symbolic checker: runs every rank's plan on an abstract network and proves that sends
//! and receives match, that no rank deadlocks, and that every output holds exactly what the
//! collective promises.
//!
//! Each element is symbolic: the set of (rank, input index) contributions it holds. A
//! reduction merges two sets and fails if they share a contribution (counted twice); a copy
//! overwrites; reading a never-written element fails. Steps run in a random order drawn from
//! a seed (any order the dependencies allow), so a missing dependency shows up as a wrong
//! result or a race for some seed, and the failure replays from that seed.

use super::plan::{Action, BufferId, Plan, Region};
use super::{Algorithm, Collective, Layout, build_plan};
use std::collections::{HashMap, HashSet, VecDeque};

type Contribution = (u16, u32);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Sym {
    parts: Vec<Contribution>,
    divided: u8,
}

type Cell = Option<Sym>;

struct RankState {
    plan: Plan,
    buffers: HashMap<BufferId, Vec<Cell>>,
    done: Vec<bool>,
    /// Ranks this rank has heard from, transitively (a causality check for barriers).
    knows: u64,
}

struct Message {
    cells: Vec<Cell>,
    knows: u64,
}

/// A small deterministic generator so a failing order replays from its seed.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// What a check run covers.
#[derive(Clone, Debug)]
pub struct Case {
    pub collective: Collective,
    pub algorithm: Algorithm,
    pub world: usize,
    pub count: usize,
    pub in_place: bool,
    pub slice_elems: usize,
    /// Ring order (position → rank); `None`: 0..world, or the hosts in turn.
    pub ring: Option<Vec<usize>>,
    /// The ranks of each host (the hierarchical algorithms follow them); `None`: one host.
    pub hosts: Option<Vec<Vec<usize>>>,
    /// Each rank's relative speed ([`Layout::with_weights`]); `None`: all alike.
    pub weights: Option<Vec<u32>>,
    pub seed: u64,
}

fn region_cells<'a>(state: &'a mut RankState, r: &Region) -> Result<&'a mut [Cell], String> {
    let buf = state
        .buffers
        .get_mut(&r.buffer)
        .ok_or_else(|| format!("uses {:?}, which this rank does not have", r.buffer))?;
    let len = buf.len();
    buf.get_mut(r.offset..r.offset + r.len)
        .ok_or_else(|| format!("region {r:?} is outside {:?} of {len} elements", r.buffer))
}

/// Run all ranks' plans for `case`; `Ok(())` when everything matched and the outputs are
/// exactly the closed-form result.
pub fn check(case: &Case) -> Result<(), String> {
    check_plans(case, &plans(case)?)
}

/// The plans of every rank for `case` (point to point: rank 0 sends to the last rank, the
/// others have nothing to do).
pub fn plans(case: &Case) -> Result<Vec<Plan>, String> {
    let n = case.world;
    let ring = (case.ring.clone())
        .or_else(|| (case.hosts.as_ref()).map(|h| h.iter().flatten().copied().collect()))
        .unwrap_or_else(|| (0..n).collect());
    (0..n)
        .map(|rank| {
            let mut layout = Layout::new(rank, ring.clone())?;
            if let Some(hosts) = &case.hosts {
                layout = layout.with_hosts(hosts.clone())?;
            }
            if let Some(weights) = &case.weights {
                layout = layout.with_weights(weights.clone())?;
            }
            Ok(match rank_collective(case, rank) {
                Some(c) => build_plan(
                    c,
                    case.algorithm,
                    &layout,
                    case.count,
                    case.in_place,
                    case.slice_elems,
                ),
                None => Plan::default(),
            })
        })
        .collect()
}

/// What `rank` calls for `case`.
fn rank_collective(case: &Case, rank: usize) -> Option<Collective> {
    role(case.collective, case.world, rank)
}

/// What `rank` of `world` calls when every rank tests `collective`: the collective itself, or
/// for send/recv rank 0 sends to the last rank, which receives, and the others sit out (as do
/// all in a world of one).
pub fn role(collective: Collective, world: usize, rank: usize) -> Option<Collective> {
    let last = world.saturating_sub(1);
    match collective {
        Collective::Send { .. } | Collective::Recv { .. } => match rank {
            0 if last > 0 => Some(Collective::Send { peer: last }),
            r if r == last && last > 0 => Some(Collective::Recv { peer: 0 }),
            _ => None,
        },
        c => Some(c),
    }
}

/// The symbolic starting state of `rank` running `plan`.
fn initial_state(case: &Case, rank: usize, plan: Plan) -> RankState {
    let n = case.world;
    let mut buffers = HashMap::new();
    if let Some(collective) = rank_collective(case, rank) {
        let (inp, out) = collective.buffer_elems(case.count, n, rank);
        let initial = |len: usize| -> Vec<Cell> {
            (0..len)
                .map(|i| {
                    Some(Sym {
                        parts: vec![(rank as u16, i as u32)],
                        divided: 0,
                    })
                })
                .collect()
        };
        if case.in_place {
            // The one buffer holds the input at the start (sized for the larger of the two).
            let len = inp.unwrap_or(0).max(out.unwrap_or(0));
            buffers.insert(BufferId::Output, initial(len));
        } else {
            buffers.insert(BufferId::Input, initial(inp.unwrap_or(0)));
            buffers.insert(BufferId::Output, vec![None; out.unwrap_or(0)]);
        }
        buffers.insert(BufferId::Scratch, vec![None; plan.scratch_elems]);
    }
    let done = vec![false; plan.steps.len()];
    RankState {
        plan,
        buffers,
        done,
        knows: 1 << rank,
    }
}

/// The network: (from, to, tag) → messages in order; a tag is used once per pair.
#[derive(Default)]
struct Network {
    queues: HashMap<(usize, usize, u32), VecDeque<Message>>,
    used_tags: HashSet<(usize, usize, u32)>,
}

/// Run `plans` (one per rank, as [`plans`] makes them, or altered) for `case`: `Ok(())` when
/// every send met its receive, nothing deadlocked, and every output holds exactly what the
/// collective promises.
pub fn check_plans(case: &Case, plans: &[Plan]) -> Result<(), String> {
    let mut ranks: Vec<RankState> = (plans.iter().enumerate())
        .map(|(rank, plan)| initial_state(case, rank, plan.clone()))
        .collect();
    simulate(case.world, case.seed, &mut ranks)?;
    verify_outputs(case, &ranks)
}

/// Prove [`Collective::AllToAllV`] for the count matrix `sends` (`sends[i][j]`: elements rank
/// `i` sends to rank `j`), sliced by `slice_elems`, steps in an order drawn from `seed`:
/// matching, no deadlock, and block `j` of rank `i`'s output holding exactly rank `j`'s
/// block `i`.
pub fn check_all_to_all_v(
    sends: &[Vec<usize>],
    slice_elems: usize,
    ring: Option<Vec<usize>>,
    seed: u64,
) -> Result<(), String> {
    use super::AllToAllCounts;
    let n = sends.len();
    let counts = |r: usize| AllToAllCounts {
        send: sends[r].clone(),
        recv: (0..n).map(|q| sends[q][r]).collect(),
    };
    let ranks = run_v(Collective::AllToAllV, n, &counts, slice_elems, ring, seed)?;
    for (r, st) in ranks.iter().enumerate() {
        let c = counts(r);
        let received_at = AllToAllCounts::offsets(&c.recv);
        for (q, (&at, &len)) in received_at.iter().zip(&c.recv).enumerate() {
            let their_at = AllToAllCounts::offsets(&sends[q])[r];
            for i in 0..len {
                expect_cell(r, st, at + i, &[(q as u16, (their_at + i) as u32)], 0)?;
            }
        }
    }
    Ok(())
}

/// Prove [`Collective::AllGatherV`] where rank `r` contributes `counts[r]` elements: every
/// rank's output holds every rank's block, packed in rank order.
pub fn check_all_gather_v(
    counts: &[usize],
    slice_elems: usize,
    ring: Option<Vec<usize>>,
    seed: u64,
) -> Result<(), String> {
    use super::AllToAllCounts;
    let n = counts.len();
    let of = |r: usize| AllToAllCounts {
        send: vec![counts[r]; n],
        recv: counts.to_vec(),
    };
    let ranks = run_v(Collective::AllGatherV, n, &of, slice_elems, ring, seed)?;
    let at = AllToAllCounts::offsets(counts);
    for (r, st) in ranks.iter().enumerate() {
        for (q, (&start, &len)) in at.iter().zip(counts).enumerate() {
            for i in 0..len {
                expect_cell(r, st, start + i, &[(q as u16, i as u32)], 0)?;
            }
        }
    }
    Ok(())
}

/// Prove [`Collective::ReduceScatterV`] (sum, or average where `average`) where rank `r`
/// receives `counts[r]` elements: its output element `i` holds every rank's input element
/// `offset(r) + i`, each once (divided once for an average).
pub fn check_reduce_scatter_v(
    counts: &[usize],
    average: bool,
    slice_elems: usize,
    ring: Option<Vec<usize>>,
    seed: u64,
) -> Result<(), String> {
    use super::AllToAllCounts;
    use bcl_backends::ReduceOp;
    let n = counts.len();
    let of = |r: usize| AllToAllCounts {
        send: counts.to_vec(),
        recv: vec![counts[r]; n],
    };
    let op = if average {
        ReduceOp::Avg
    } else {
        ReduceOp::Sum
    };
    let ranks = run_v(
        Collective::ReduceScatterV { op },
        n,
        &of,
        slice_elems,
        ring,
        seed,
    )?;
    let at = AllToAllCounts::offsets(counts);
    for (r, st) in ranks.iter().enumerate() {
        for i in 0..counts[r] {
            let all: Vec<Contribution> = (0..n).map(|q| (q as u16, (at[r] + i) as u32)).collect();
            expect_cell(r, st, i, &all, u8::from(average))?;
        }
    }
    Ok(())
}

/// Build and run the plans of a collective with per-rank counts (`counts(r)` for rank r;
/// its input holds `counts(r).send`'s total, except for an all-gather's single block).
fn run_v(
    collective: Collective,
    n: usize,
    counts: &dyn Fn(usize) -> super::AllToAllCounts,
    slice_elems: usize,
    ring: Option<Vec<usize>>,
    seed: u64,
) -> Result<Vec<RankState>, String> {
    let ring = ring.unwrap_or_else(|| (0..n).collect());
    let mut ranks = Vec::new();
    for r in 0..n {
        let layout = Layout::new(r, ring.clone())?;
        let c = counts(r);
        let plan = super::build_plan_v(collective, &layout, &c, slice_elems);
        let sent: usize = match collective {
            Collective::AllGatherV => c.send.get(r).copied().unwrap_or(0),
            _ => c.send.iter().sum(),
        };
        let received: usize = match collective {
            Collective::ReduceScatterV { .. } => c.recv.get(r).copied().unwrap_or(0),
            _ => c.recv.iter().sum(),
        };
        let mut buffers = HashMap::new();
        let input = (0..sent)
            .map(|i| {
                Some(Sym {
                    parts: vec![(r as u16, i as u32)],
                    divided: 0,
                })
            })
            .collect();
        buffers.insert(BufferId::Input, input);
        buffers.insert(BufferId::Output, vec![None; received]);
        buffers.insert(BufferId::Scratch, vec![None; plan.scratch_elems]);
        let done = vec![false; plan.steps.len()];
        ranks.push(RankState {
            plan,
            buffers,
            done,
            knows: 1 << r,
        });
    }
    simulate(n, seed, &mut ranks)?;
    Ok(ranks)
}

/// Output element `j` of rank `r` holds exactly `want` (in any order), divided `divided`×.
fn expect_cell(
    r: usize,
    st: &RankState,
    j: usize,
    want: &[Contribution],
    divided: u8,
) -> Result<(), String> {
    let got = st
        .buffers
        .get(&BufferId::Output)
        .and_then(|o| o.get(j))
        .cloned()
        .flatten()
        .ok_or_else(|| format!("rank {r} output[{j}] was never written"))?;
    let (mut parts, mut want) = (got.parts.clone(), want.to_vec());
    parts.sort_unstable();
    want.sort_unstable();
    if parts != want || got.divided != divided {
        return Err(format!(
            "rank {r} output[{j}] holds {parts:?} divided {}×, expected {want:?} divided {divided}×",
            got.divided
        ));
    }
    Ok(())
}

/// Run the ranks' plans on the abstract network in an order drawn from `seed`, until none
/// can move: a step left undone is a deadlock, a message left unread an error.
///
/// The ready steps are kept in (rank, step) order and drawn from by index, as a full scan
/// after every step would list them (the same seed runs the same order), but only the steps
/// a step can make ready or unready are looked at again: its dependents, and the receives on
/// the queue it pushed to or popped from. The full scan made the exhaustive small-world
/// suite quadratic in the steps (27 s of its 28).
fn simulate(world: usize, seed: u64, ranks: &mut [RankState]) -> Result<(), String> {
    let mut net = Network::default();
    let mut rng = XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    // Derived here from `deps`, not taken from the plan: an altered plan may not keep them
    // consistent.
    let dependents: Vec<Vec<Vec<usize>>> = (ranks.iter())
        .map(|st| {
            let mut out = vec![Vec::new(); st.plan.steps.len()];
            for (i, step) in st.plan.steps.iter().enumerate() {
                for &d in &step.deps {
                    out[d].push(i);
                }
            }
            out
        })
        .collect();
    // The receives waiting on each queue (from, to, tag).
    let mut receives: HashMap<(usize, usize, u32), Vec<usize>> = HashMap::new();
    for (r, st) in ranks.iter().enumerate() {
        for (i, step) in st.plan.steps.iter().enumerate() {
            if let Action::Recv { peer, tag, .. } = step.action {
                receives.entry((peer, r, tag)).or_default().push(i);
            }
        }
    }
    let mut ready = ready_steps(ranks, &net);
    let mut touched = Vec::new();
    while !ready.is_empty() {
        let (r, i) = ready.remove(rng.below(ready.len()));
        run_step(world, ranks, &mut net, r, i)?;
        ranks[r].done[i] = true;
        touched.clear();
        touched.extend(dependents[r][i].iter().map(|&d| (r, d)));
        let queue = match ranks[r].plan.steps[i].action {
            Action::Send { peer, tag, .. } => Some((r, peer, tag)),
            Action::Recv { peer, tag, .. } => Some((peer, r, tag)),
            _ => None,
        };
        if let Some(q) = queue {
            let to = q.1;
            touched.extend(receives.get(&q).into_iter().flatten().map(|&d| (to, d)));
        }
        for &(q, j) in &touched {
            let now = step_ready(ranks, &net, q, j);
            match (ready.binary_search(&(q, j)), now) {
                (Err(at), true) => ready.insert(at, (q, j)),
                (Ok(at), false) => {
                    ready.remove(at);
                }
                _ => {}
            }
        }
    }
    for (r, st) in ranks.iter().enumerate() {
        if let Some(i) = st.done.iter().position(|d| !d) {
            return Err(format!(
                "deadlock: rank {r} cannot run step {i} {:?}",
                st.plan.steps[i]
            ));
        }
    }
    if let Some(((from, to, tag), _)) = net.queues.iter().find(|(_, q)| !q.is_empty()) {
        return Err(format!(
            "message {tag} from rank {from} to rank {to} was never received"
        ));
    }
    Ok(())
}

/// Every (rank, step) whose dependencies are done and, for a receive, whose message is there,
/// in (rank, step) order.
fn ready_steps(ranks: &[RankState], net: &Network) -> Vec<(usize, usize)> {
    let mut ready = Vec::new();
    for (r, st) in ranks.iter().enumerate() {
        for i in 0..st.plan.steps.len() {
            if step_ready(ranks, net, r, i) {
                ready.push((r, i));
            }
        }
    }
    ready
}

/// Whether step `i` of rank `r` can run: not done, its dependencies done and, for a receive,
/// its message there.
fn step_ready(ranks: &[RankState], net: &Network, r: usize, i: usize) -> bool {
    let st = &ranks[r];
    let step = &st.plan.steps[i];
    if st.done[i] || !step.deps.iter().all(|d| st.done[*d]) {
        return false;
    }
    match step.action {
        Action::Recv { peer, tag, .. } => {
            (net.queues.get(&(peer, r, tag))).is_some_and(|q| !q.is_empty())
        }
        _ => true,
    }
}

/// Run step `i` of rank `r` on the symbolic state.
fn run_step(
    n: usize,
    ranks: &mut [RankState],
    net: &mut Network,
    r: usize,
    i: usize,
) -> Result<(), String> {
    let action = ranks[r].plan.steps[i].action.clone();
    let at = |e: String| format!("rank {r} step {i} {action:?}: {e}");
    match &action {
        Action::Send {
            peer, tag, from, ..
        } => {
            if *peer >= n || *peer == r {
                return Err(at(format!("bad peer {peer}")));
            }
            if !net.used_tags.insert((r, *peer, *tag)) {
                return Err(at("tag used twice on this link in one operation".into()));
            }
            let cells = region_cells(&mut ranks[r], from).map_err(at)?.to_vec();
            if cells.iter().any(Option::is_none) {
                return Err(at("sends an element never written".into()));
            }
            let knows = ranks[r].knows;
            net.queues
                .entry((r, *peer, *tag))
                .or_default()
                .push_back(Message { cells, knows });
        }
        Action::Recv {
            peer,
            tag,
            into,
            reduce,
            seed,
        } => {
            if let Some(seed) = seed {
                if seed.len != into.len {
                    return Err(at("seed and target of different lengths".into()));
                }
                let cells = region_cells(&mut ranks[r], seed).map_err(at)?.to_vec();
                region_cells(&mut ranks[r], into)
                    .map_err(at)?
                    .clone_from_slice(&cells);
            }
            let msg = net
                .queues
                .get_mut(&(*peer, r, *tag))
                .and_then(VecDeque::pop_front)
                .ok_or_else(|| at("no message".into()))?;
            ranks[r].knows |= msg.knows;
            let cells = region_cells(&mut ranks[r], into).map_err(at)?;
            if cells.len() != msg.cells.len() {
                return Err(at(format!(
                    "received {} elements into a region of {}",
                    msg.cells.len(),
                    cells.len()
                )));
            }
            for (c, m) in cells.iter_mut().zip(msg.cells) {
                *c = if *reduce {
                    merge(c.take(), m).map_err(at)?
                } else {
                    m
                };
            }
        }
        Action::Copy { from, to } => {
            if from.len != to.len {
                return Err(at("copy between regions of different lengths".into()));
            }
            let cells = region_cells(&mut ranks[r], from).map_err(at)?.to_vec();
            region_cells(&mut ranks[r], to)
                .map_err(at)?
                .clone_from_slice(&cells);
        }
        Action::Divide { region } => {
            for c in region_cells(&mut ranks[r], region).map_err(at)? {
                match c {
                    Some(s) => s.divided += 1,
                    None => return Err(at("divides an element never written".into())),
                }
            }
        }
    }
    Ok(())
}

fn merge(a: Cell, b: Cell) -> Result<Cell, String> {
    let (Some(mut a), Some(b)) = (a, b) else {
        return Err("reduces an element never written".into());
    };
    for p in b.parts {
        if a.parts.contains(&p) {
            return Err(format!("contribution {p:?} counted twice"));
        }
        a.parts.push(p);
    }
    a.divided += b.divided;
    Ok(Some(a))
}

fn verify_outputs(case: &Case, ranks: &[RankState]) -> Result<(), String> {
    let n = case.world;
    let count = case.count;
    let all =
        |idx: usize| -> Vec<Contribution> { (0..n).map(|q| (q as u16, idx as u32)).collect() };
    let average = case.collective.reduce_op() == Some(bcl_backends::ReduceOp::Avg);
    for (r, st) in ranks.iter().enumerate() {
        // (output index, expected contributions, expected divisions)
        let expected: Vec<(usize, Vec<Contribution>, u8)> = match case.collective {
            Collective::AllReduce { .. } => {
                (0..count).map(|i| (i, all(i), u8::from(average))).collect()
            }
            Collective::AllGather | Collective::AllGatherV => (0..n * count)
                .map(|j| {
                    let (b, i) = (j / count.max(1), j % count.max(1));
                    let src = if case.in_place { j } else { i };
                    (j, vec![(b as u16, src as u32)], 0)
                })
                .collect(),
            Collective::ReduceScatter { .. } | Collective::ReduceScatterV { .. } => (0..count)
                .map(|i| {
                    let home = if case.in_place { r * count + i } else { i };
                    (home, all(r * count + i), u8::from(average))
                })
                .collect(),
            Collective::Broadcast { root } => (0..count)
                .map(|i| (i, vec![(root as u16, i as u32)], 0))
                .collect(),
            Collective::Reduce { root, .. } if r == root => {
                (0..count).map(|i| (i, all(i), u8::from(average))).collect()
            }
            Collective::Reduce { .. } => Vec::new(),
            Collective::AllToAll | Collective::AllToAllV => (0..n * count)
                .map(|j| {
                    let (from, i) = (j / count.max(1), j % count.max(1));
                    (j, vec![(from as u16, (r * count + i) as u32)], 0)
                })
                .collect(),
            Collective::Gather { root } if r == root => (0..n * count)
                .map(|j| {
                    let (b, i) = (j / count.max(1), j % count.max(1));
                    // In place the root's block starts where it ends up; a sender's data is
                    // its one buffer, from 0.
                    let src = if case.in_place && b == root { j } else { i };
                    (j, vec![(b as u16, src as u32)], 0)
                })
                .collect(),
            Collective::Gather { .. } => Vec::new(),
            Collective::Scatter { root } => (0..count)
                .map(|i| {
                    let home = if case.in_place && r == root {
                        root * count + i
                    } else {
                        i
                    };
                    (home, vec![(root as u16, (r * count + i) as u32)], 0)
                })
                .collect(),
            Collective::Send { .. } | Collective::Recv { .. } if r == n - 1 && n > 1 => {
                (0..count).map(|i| (i, vec![(0, i as u32)], 0)).collect()
            }
            Collective::Send { .. } | Collective::Recv { .. } => Vec::new(),
            Collective::Barrier => {
                if st.knows != (1u64 << n) - 1 {
                    return Err(format!(
                        "rank {r} left the barrier having heard only from {:b}",
                        st.knows
                    ));
                }
                Vec::new()
            }
        };
        for (j, want, divided) in expected {
            expect_cell(r, st, j, &want, divided)?;
        }
    }
    Ok(())
}
