//! The discrete-event engine: every simulated rank runs its `schedule::build_plan` plan as
//! the executor would (a step starts once the steps it depends on are done; a receive also
//! waits for its message), in virtual time over the flow model of [`crate::network`].
//!
//! Costs: a send is a flow of its bytes over the message's path, delivered α after its last
//! byte; a receive that reduces (or seeds) is a flow of its bytes through the receiver's
//! device engine; a copy is one at the copy speed; a plain receive costs nothing beyond its
//! message. On an uncongested ring this is the cost model's closed form,
//! 2(p−1)·(α + c·β) + (p−1)·c·γ (a test holds it to that).
//!
//! A symmetric run simulates the ranks of the first `group` hosts only, assuming every rank
//! behaves as its stand-in in the group (rank mod group size) does: true when hosts are
//! alike and the plans are symmetric, under rotation by whole groups (rings, chains) or
//! translation by XOR (recursive doubling and halving). A message to a rank outside the
//! group is delivered to the rank inside it that stands in the same place, from the sender
//! that really sends it there (an image of the stand-in); the engine builds that sender's
//! plan and checks that its step is the same send (same step index, size within one element
//! for uneven parts), so plans
//! that are not symmetric are refused rather than simulated wrongly.
//!
//! A run may also simulate only the first `locals` ranks of each host, where a host's ranks
//! are turned copies of each other (local rank i's plan is local rank 0's with every rank of
//! the host moved on by i: the hierarchical plans on hosts of equal size) and share nothing
//! (their own devices, ports and NICs). A message to local rank j is delivered to local rank
//! j mod `locals` from the sender turned back by the same amount, with the sender's own tag.
//! That is checked before the run on the first and last hosts, every plan of their ranks
//! against the turned plan of their first rank (peers, tags inside the host, sizes and
//! dependencies); a message between hosts that would need turning is refused.

use crate::channels::Channels;
use crate::deliveries::Deliveries;
use crate::fast_hash::FastMap;
use crate::flows::Route;
use crate::network::Network;
use crate::plan_diff::{self, PlanDiff};
use crate::steps::{Op, Steps};
use crate::topology::Topology;
use bcl_core::schedule::{Action, Algorithm, Collective, Layout, Plan, Step, build_plan};
use std::collections::VecDeque;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes of memory a step takes at most as the engine holds it with what is in flight (the
/// 100k-rank 512 MiB allreduce: 4.2 GB at its peak for 51 M steps), rounded up.
pub const STEP_BYTES: usize = 100;

/// Steps of all simulated ranks' plans at most where the caller gives no limit: about 4 GB,
/// so a run is refused instead of running out of memory. (`bcl-sim` sizes its own limit to
/// the memory the machine has available.)
pub const MAX_STEPS: usize = 40_000_000;

/// One simulated call.
#[derive(Clone, Debug)]
pub struct Case {
    /// What each rank calls; `None` for every rank: `collective` itself.
    pub collective: Collective,
    /// Every rank also sends to the next (nccl-tests' sendrecv, with `Recv` from the previous).
    pub sendrecv: bool,
    pub algorithm: Algorithm,
    pub count: usize,
    pub elem_bytes: usize,
    pub in_place: bool,
    pub slice_elems: usize,
}

/// What a run found.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// From the common start to the last rank's last step.
    pub seconds: f64,
    /// Ranks whose plans ran (all, or one group).
    pub simulated_ranks: usize,
    /// Steps run.
    pub steps: u64,
    /// How the flows' changes were settled (`--rate-stats`).
    pub rates: crate::flows::RateStats,
}

#[derive(Clone, Copy, Debug)]
enum Job {
    /// A send's bytes: on their end the step is done and the message delivered α later.
    Send { sim: usize, step: usize, alpha: f64 },
    /// Device work (a reduce or a copy): the step is done when it ends.
    Work { sim: usize, step: usize },
}

struct RankRun {
    plan: Steps,
    waiting: Vec<u32>,
    left: usize,
    end: f64,
    /// Per step, where recorded: when it could go on (it started; a receive: its message was
    /// there as well), and when it ended.
    times: Vec<[f64; 2]>,
}

/// The layout BCL would give `rank`: hosts in ring order, a weight per rank from its
/// device's reduce speed when the vendors differ.
pub fn layout(topo: &Topology, rank: usize) -> Result<Layout, String> {
    let n = topo.world();
    let mut layout = Layout::new(rank, (0..n).collect())?;
    if topo.hosts > 1 {
        let hosts = (0..topo.hosts)
            .map(|h| (h * topo.per_host..(h + 1) * topo.per_host).collect())
            .collect();
        layout = layout.with_hosts(hosts)?;
    }
    if topo.fabric().mixed_speeds {
        let weights = (0..n)
            .map(|r| ((topo.vendor(r / topo.per_host).reduce / 1e9).round() as u32).max(1))
            .collect();
        layout = layout.with_weights(weights)?;
    }
    Ok(layout)
}

/// The plan `rank` runs for `case`, with `layout` (every rank's, from [`layout`]) turned to it.
pub fn plan_of(layout: &mut Layout, case: &Case, rank: usize) -> Result<Plan, String> {
    layout.set_rank(rank)?;
    let layout = &*layout;
    let build = |c: Collective| {
        build_plan(
            c,
            case.algorithm,
            layout,
            case.count,
            case.in_place,
            case.slice_elems,
        )
    };
    if !case.sendrecv {
        return Ok(build(case.collective));
    }
    let n = layout.world();
    let mut plan = build(Collective::Send {
        peer: (rank + 1) % n,
    });
    let recv = build(Collective::Recv {
        peer: (rank + n - 1) % n,
    });
    // The two plans touch different buffers (Input and Output): side by side, no order.
    let base = plan.steps.len();
    for mut s in recv.steps {
        s.deps.iter_mut().for_each(|d| *d += base);
        plan.steps.push(s);
    }
    for d in recv.dependents {
        plan.dependents
            .push(d.into_iter().map(|x| x + base).collect());
    }
    plan.scratch_elems = plan.scratch_elems.max(recv.scratch_elems);
    Ok(plan)
}

/// The ranks a run simulates for all: the first `locals` ranks of each of the first `hosts`
/// hosts (every rank: `topo.hosts` and `topo.per_host`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    pub hosts: usize,
    pub locals: usize,
}

impl Group {
    /// Every rank of the first `hosts` hosts.
    pub fn hosts(topo: &Topology, hosts: usize) -> Group {
        Group {
            hosts,
            locals: topo.per_host,
        }
    }

    /// Every rank.
    pub fn all(topo: &Topology) -> Group {
        Group::hosts(topo, topo.hosts)
    }
}

/// Simulate `case` on `topo`: every rank (`group` = `topo.hosts`), or the first `group`
/// hosts' ranks standing for all (see the module's doc); at most [`MAX_STEPS`] steps.
pub fn simulate(topo: &Topology, case: &Case, group: usize) -> Result<Outcome, String> {
    simulate_within(topo, case, Group::hosts(topo, group), MAX_STEPS)
}

/// [`simulate`] with the ranks of `group` standing for all.
pub fn simulate_group(topo: &Topology, case: &Case, group: Group) -> Result<Outcome, String> {
    simulate_within(topo, case, group, MAX_STEPS)
}

/// Whether a host's ranks share nothing that carries load (cores, a NIC, an uplink of one
/// plane), so that one of them can stand for the others.
pub fn ranks_share_nothing(topo: &Topology) -> bool {
    topo.cores == 0
        && topo.nics >= topo.per_host
        && (topo.rails || topo.oversub * topo.pod_oversub <= 1.0)
}

/// [`simulate_group`], refused (before running) where the plans hold more than `max_steps`
/// steps.
pub fn simulate_within(
    topo: &Topology,
    case: &Case,
    g: Group,
    max_steps: usize,
) -> Result<Outcome, String> {
    let mut e = engine(topo, case, g, max_steps, false)?;
    e.run()?;
    Ok(e.outcome())
}

/// Two cases on the same ranks (out of place, then in place). The second runs only where it
/// might take another time: its plans are the first's (actions, peers, tags, sizes) but for
/// dependencies it adds, and each of those was done, in the first run, strictly before the
/// step that gains it started (a receive: before it started or its message arrived,
/// whichever was later). Then every step of the second starts, receives and ends when the
/// first's did, and the first's outcome stands for both. (In place, phase 3 of the
/// hierarchical allreduce waits for phase 1's sends out of the same region, long done.)
pub fn simulate_both(
    topo: &Topology,
    first: &Case,
    second: &Case,
    g: Group,
) -> Result<Both, String> {
    simulate_both_within(topo, first, second, g, MAX_STEPS)
}

/// [`simulate_both`], each run refused (before it starts) where its plans hold more than
/// `max_steps` steps.
pub fn simulate_both_within(
    topo: &Topology,
    first: &Case,
    second: &Case,
    g: Group,
    max_steps: usize,
) -> Result<Both, String> {
    // The second case's plans are held against the first's on a thread beside the run.
    let ranks: Vec<usize> = (0..g.hosts * g.locals)
        .map(|sim| sim_rank(sim, g.locals, topo.per_host))
        .collect();
    let stop = AtomicBool::new(false);
    let (run, diff) = std::thread::scope(|s| {
        let diff = s.spawn(|| {
            let mut layout = layout(topo, 0)?;
            let mut plans = |k: usize| {
                let a = plan_of(&mut layout, first, ranks[k])?;
                Ok((a, plan_of(&mut layout, second, ranks[k])?))
            };
            plan_diff::compare(ranks.len(), &mut plans, &stop)
        });
        let run = engine(topo, first, g, max_steps, true).and_then(|mut e| e.run().map(|()| e));
        if run.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        let diff = diff.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (run, diff)
    });
    let mut e = run?;
    let out = e.outcome();
    if e.same_times(second, diff?)? {
        return Ok(Both {
            first: out.clone(),
            second: out,
            second_ran: false,
        });
    }
    drop(e);
    Ok(Both {
        first: out,
        second: simulate_within(topo, second, g, max_steps)?,
        second_ran: true,
    })
}

/// The rank simulated as `sim` where the first `locals` ranks of each host of `per_host` are.
fn sim_rank(sim: usize, locals: usize, per_host: usize) -> usize {
    (sim / locals) * per_host + sim % locals
}

/// What [`simulate_both`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Both {
    pub first: Outcome,
    pub second: Outcome,
    /// Whether the second case was run (or the first's outcome stood for it).
    pub second_ran: bool,
}

/// An engine with the plans of `g`'s ranks for `case`, ready to run.
fn engine<'a>(
    topo: &'a Topology,
    case: &'a Case,
    g: Group,
    max_steps: usize,
    record: bool,
) -> Result<Engine<'a>, String> {
    let n = topo.world();
    if u32::try_from(n).is_err() {
        return Err(format!("{n} ranks: the simulator numbers ranks in 32 bits"));
    }
    let group = g.hosts;
    if group == 0 || group > topo.hosts || !topo.hosts.is_multiple_of(group) {
        return Err(format!(
            "a group of {group} hosts does not divide {} hosts",
            topo.hosts
        ));
    }
    if g.locals == 0 || !topo.per_host.is_multiple_of(g.locals) {
        return Err(format!(
            "{} ranks per host do not divide hosts of {}",
            g.locals, topo.per_host
        ));
    }
    if g.locals < topo.per_host && !ranks_share_nothing(topo) {
        return Err(format!(
            "a host's ranks share cores, NICs or uplinks here, so {} of them cannot stand for \
             {} (plans not symmetric by ranks; run them all: --locals {})",
            g.locals, topo.per_host, topo.per_host
        ));
    }
    // Halving-doubling passes the per-message check below but does not keep time by groups
    // once sliced: the two sides of a round send the same sizes, but the lower one sends its
    // upper half, whose slices arrive (from the round or phase before) later than the lower
    // half its partner sends (64 ranks, 4 MiB in 512 KiB slices: one host standing for all
    // was 30% fast). Refused, so that a symmetric figure is one the check vouches for.
    if group < topo.hosts
        && matches!(
            case.algorithm,
            Algorithm::HalvingDoubling | Algorithm::HierHalving
        )
    {
        return Err(format!(
            "{} plans are not symmetric by groups of {group} hosts: the halves of a round \
             wait on different slices (run it exactly: --group 0)",
            case.algorithm.name()
        ));
    }
    let span = group * topo.per_host;
    let mut e = Engine {
        topo,
        case,
        net: Network::new(topo, group, g.locals),
        span,
        locals: g.locals,
        world: n,
        now: 0.0,
        runs: Vec::with_capacity(span),
        ready: Vec::new(),
        matches: FastMap::default(),
        jobs: Vec::new(),
        deliveries: Deliveries::default(),
        others: FastMap::default(),
        steps: 0,
        channels: Channels::default(),
        layout: layout(topo, 0)?,
    };
    if g.locals < topo.per_host {
        for host in [0, topo.hosts - 1] {
            e.check_turned(case, host)?;
        }
    }
    let sims = group * g.locals;
    let mut total = 0usize;
    for r in 0..sims {
        let rank = e.rank_of(r);
        let plan = Steps::of(&plan_of(&mut e.layout, case, rank)?)?;
        total += plan.len();
        // After the first host, an estimate for all: a run far too large is refused before
        // it builds the rest (a 100k-rank 512 MiB row spent two minutes reaching the limit).
        let estimate = total as u128 * sims as u128 / g.locals as u128;
        if r + 1 == g.locals && sims > g.locals && estimate > (max_steps as u128) * 5 / 4 {
            return Err(format!(
                "too large to simulate: the first host's {} simulated ranks' plans hold \
                 {total} steps, about {estimate} for all {sims} (at most {max_steps}, about \
                 {:.1} GB); simulate fewer ranks (a symmetric algorithm such as ring or \
                 hier-ring runs one group of hosts) or larger slices",
                g.locals,
                max_steps.saturating_mul(STEP_BYTES) as f64 * 1e-9
            ));
        }
        if total > max_steps {
            return Err(format!(
                "too large to simulate: the first {} of {sims} ranks' plans already hold \
                 {total} steps (at most {max_steps}, about {:.1} GB); simulate fewer ranks (a \
                 symmetric algorithm such as ring or hier-ring runs one group of hosts) or \
                 larger slices",
                r + 1,
                max_steps.saturating_mul(STEP_BYTES) as f64 * 1e-9
            ));
        }
        let waiting: Vec<u32> = (0..plan.len()).map(|i| plan.deps(i).len() as u32).collect();
        for (i, w) in waiting.iter().enumerate() {
            if *w == 0 {
                e.ready.push((r, i));
            }
        }
        let times = if record {
            vec![[f64::NAN; 2]; plan.len()]
        } else {
            Vec::new()
        };
        e.runs.push(RankRun {
            left: plan.len(),
            plan,
            waiting,
            end: 0.0,
            times,
        });
    }
    // Start in plan order.
    e.ready.reverse();
    Ok(e)
}

/// Whether two steps do the same once the first is turned: same kind, peers (`turn` maps the
/// first's), tags for messages inside the host (`same_host`), sizes within `slack` elements.
/// Dependencies are not compared.
fn same_action(
    a: &Step,
    b: &Step,
    turn: impl Fn(usize) -> usize,
    same_host: impl Fn(usize) -> bool,
    slack: usize,
) -> bool {
    let near = |x: usize, y: usize| x.abs_diff(y) <= slack;
    match (&a.action, &b.action) {
        (
            Action::Send {
                peer, tag, from, ..
            },
            Action::Send {
                peer: p2,
                tag: t2,
                from: f2,
                ..
            },
        ) => turn(*peer) == *p2 && (!same_host(*peer) || tag == t2) && near(from.len, f2.len),
        (
            Action::Recv {
                peer,
                tag,
                into,
                reduce,
                seed,
            },
            Action::Recv {
                peer: p2,
                tag: t2,
                into: i2,
                reduce: r2,
                seed: s2,
            },
        ) => {
            turn(*peer) == *p2
                && (!same_host(*peer) || tag == t2)
                && near(into.len, i2.len)
                && (*reduce || seed.is_some()) == (*r2 || s2.is_some())
        }
        (Action::Copy { from, .. }, Action::Copy { from: f2, .. }) => near(from.len, f2.len),
        (Action::Divide { region }, Action::Divide { region: r2 }) => near(region.len, r2.len),
        _ => false,
    }
}

/// A message's match, keyed by (from, to, tag): what is outstanding for it, messages
/// delivered and not yet received or receives ready and waiting for their message (never both
/// at once). Receives are held in the order they became ready: nearly always one, without an
/// allocation (a 100k-rank run has millions waiting at once, so an entry is 16 bytes and one
/// lookup serves each receive and each arrival).
enum Match {
    Arrived(u32),
    One(u32, u32),
    // Boxed so that the common entry stays small.
    #[allow(clippy::box_collection)]
    Many(Box<VecDeque<(u32, u32)>>),
}

impl Match {
    fn holds(&self, x: (u32, u32)) -> bool {
        match self {
            Match::Arrived(_) => false,
            Match::One(sim, step) => (*sim, *step) == x,
            Match::Many(q) => q.contains(&x),
        }
    }
}

const _: () = assert!(std::mem::size_of::<Match>() == 16);

/// A message's key: (from, to, tag), ranks as u32 to keep entries small.
type Key = (u32, u32, u32);

struct Engine<'a> {
    topo: &'a Topology,
    case: &'a Case,
    net: Network,
    span: usize,
    /// Ranks of each host simulated (`topo.per_host`, or fewer standing for the rest).
    locals: usize,
    world: usize,
    now: f64,
    runs: Vec<RankRun>,
    ready: Vec<(usize, usize)>,
    /// Per message key, what is outstanding: entries go once empty, so the map holds what is
    /// outstanding, not every tag.
    matches: FastMap<Key, Match>,
    jobs: Vec<Option<Job>>,
    /// Messages sent and not yet delivered, by the key of their match.
    deliveries: Deliveries<Key>,
    /// Plans of ranks outside the group that send into it (symmetric runs).
    others: FastMap<usize, Steps>,
    steps: u64,
    /// Per (sender, receiver): sends in flight, and those waiting their turn.
    channels: Channels,
    /// Every rank's layout, turned to the rank whose plan is built.
    layout: Layout,
}

impl Engine<'_> {
    fn outcome(&self) -> Outcome {
        Outcome {
            seconds: self.runs.iter().map(|r| r.end).fold(0.0, f64::max),
            simulated_ranks: self.runs.len(),
            steps: self.steps,
            rates: self.net.flows.stats(),
        }
    }

    /// Whether `other` would run as this recorded run did (see [`simulate_both`]), given how
    /// its plans differ from this run's (compared again here where that is not known).
    fn same_times(&mut self, other: &Case, diff: PlanDiff) -> Result<bool, String> {
        // The second case's plans turn as the first's did (where one rank stands for its host).
        if self.locals < self.topo.per_host {
            for host in [0, self.topo.hosts - 1] {
                if self.check_turned(other, host).is_err() {
                    return Ok(false);
                }
            }
        }
        // Images of senders outside the group lend their tags: the same actions.
        let images: Vec<usize> = self.others.keys().copied().collect();
        for rank in images {
            let b = Steps::of(&plan_of(&mut self.layout, other, rank)?)?;
            if self.others[&rank].ops != b.ops {
                return Ok(false);
            }
        }
        match diff {
            PlanDiff::Actions => return Ok(false),
            PlanDiff::Deps(steps) => {
                return Ok((steps.iter())
                    .all(|(sim, i, y)| self.gains_done_steps(*sim as usize, *i as usize, y)));
            }
            PlanDiff::Unknown => {}
        }
        for sim in 0..self.runs.len() {
            let rank = self.rank_of(sim);
            let b = plan_of(&mut self.layout, other, rank)?;
            let run = &self.runs[sim];
            if b.steps.len() != run.plan.len() {
                return Ok(false);
            }
            for (i, step) in b.steps.iter().enumerate() {
                if Op::of(&step.action)? != run.plan.ops[i] {
                    return Ok(false);
                }
                let (x, y) = (run.plan.deps(i), &step.deps);
                if x.len() == y.len() && x.iter().zip(y).all(|(&a, &b)| a as usize == b) {
                    continue;
                }
                let y: Vec<u32> = y.iter().map(|&d| d as u32).collect();
                if !self.gains_done_steps(sim, i, &y) {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Whether step `i` of `sim`, waiting for `y` in the other case's plan, keeps every
    /// dependency it has here and gains only steps this run had done before it started.
    fn gains_done_steps(&self, sim: usize, i: usize, y: &[u32]) -> bool {
        let run = &self.runs[sim];
        let x = run.plan.deps(i);
        let by = run.times[i][0];
        let kept = x.iter().all(|d| y.contains(d));
        let idle = (y.iter().filter(|&d| !x.contains(d))).all(|&d| run.times[d as usize][1] < by);
        kept && idle
    }

    /// The rank simulated as `sim`.
    fn rank_of(&self, sim: usize) -> usize {
        sim_rank(sim, self.locals, self.topo.per_host)
    }

    /// The simulated index of `rank`, if it is simulated.
    fn sim_of(&self, rank: usize) -> Option<usize> {
        let (host, local) = (rank / self.topo.per_host, rank % self.topo.per_host);
        (rank < self.span && local < self.locals).then(|| host * self.locals + local)
    }

    /// `rank` moved on by `by` ranks inside its host.
    fn turn(&self, rank: usize, by: usize) -> usize {
        let l = self.topo.per_host;
        rank - rank % l + (rank % l + by) % l
    }

    /// Every plan of `host`'s ranks is its first rank's turned (see the module's doc).
    fn check_turned(&mut self, case: &Case, host: usize) -> Result<(), String> {
        let l = self.topo.per_host;
        let first = host * l;
        let base = plan_of(&mut self.layout, case, first)?;
        for by in 1..l {
            let plan = plan_of(&mut self.layout, case, first + by)?;
            let same_host = |p: usize| p / l == host;
            let bad = if plan.steps.len() != base.steps.len() {
                Some(format!(
                    "{} steps against {}",
                    plan.steps.len(),
                    base.steps.len()
                ))
            } else {
                (base.steps.iter().zip(&plan.steps).enumerate())
                    .find(|(_, (a, b))| {
                        !same_action(a, b, |p| self.turn(p, by), same_host, 1) || a.deps != b.deps
                    })
                    .map(|(i, (a, b))| format!("step {i} is {:?} against {:?}", b.action, a.action))
            };
            if let Some(bad) = bad {
                return Err(format!(
                    "the plans are not symmetric by ranks inside a host: rank {} is not rank \
                     {first} turned by {by}: {bad} (run every rank of a host: --locals {l})",
                    first + by
                ));
            }
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(), String> {
        loop {
            while let Some((sim, step)) = self.ready.pop() {
                self.start(sim, step)?;
            }
            let flow_end = self.net.flows.next_end();
            let timer = self.deliveries.next_time().map(|t| t - self.now);
            let dt = match (flow_end, timer) {
                (None, None) => break,
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
            }
            .max(0.0);
            self.now += dt;
            for id in self.net.flows.advance(dt) {
                match self.jobs[id].take() {
                    Some(Job::Send { sim, step, alpha }) => {
                        self.next_on_channel(sim, step);
                        self.done(sim, step);
                        self.sent(sim, step, alpha)?;
                    }
                    Some(Job::Work { sim, step }) => self.done(sim, step),
                    None => return Err(format!("flow {id} ended with no step behind it")),
                }
            }
            while let Some(key) = self.deliveries.pop_due(self.now) {
                self.arrive(key);
            }
        }
        for (r, run) in self.runs.iter().enumerate() {
            if run.left > 0 {
                let stuck = (0..run.plan.len())
                    .find(|&i| run.waiting[i] > 0 || self.is_pending(r, i))
                    .map(|i| format!("step {i} {:?}", run.plan.ops[i]))
                    .unwrap_or_default();
                return Err(format!(
                    "simulated rank {} stopped with {} steps left, first {stuck}",
                    self.rank_of(r),
                    run.left
                ));
            }
        }
        Ok(())
    }

    fn is_pending(&self, sim: usize, step: usize) -> bool {
        let x = (sim as u32, step as u32);
        self.matches.values().any(|m| m.holds(x))
    }

    fn flow(&mut self, bytes: f64, path: Route, job: Job) {
        let id = self.net.flows.start(bytes, path);
        if self.jobs.len() <= id {
            self.jobs.resize(id + 1, None);
        }
        self.jobs[id] = Some(job);
    }

    fn start(&mut self, sim: usize, step: usize) -> Result<(), String> {
        if let Some(t) = self.runs[sim].times.get_mut(step) {
            t[0] = self.now;
        }
        let esize = self.case.elem_bytes as f64;
        let op = self.runs[sim].plan.ops[step];
        let rank = self.rank_of(sim);
        match op {
            Op::Send { peer, len, .. } => {
                let peer = peer as usize;
                let net = &self.net;
                let ch = (self.channels).get_or_insert(sim, peer, || net.path(rank, peer));
                let (path, alpha) = (ch.path.resources, ch.path.alpha);
                let bytes = len as f64 * esize;
                if bytes > 0.0 {
                    if ch.busy < self.topo.channels {
                        ch.busy += 1;
                        self.flow(bytes, path, Job::Send { sim, step, alpha });
                    } else {
                        ch.queue.push_back((sim as u32, step as u32));
                    }
                } else {
                    self.done(sim, step);
                    self.sent(sim, step, alpha)?;
                }
            }
            Op::Recv { peer, tag, .. } => {
                let me = (sim as u32, step as u32);
                match self.matches.entry((peer, rank as u32, tag)) {
                    Entry::Vacant(v) => {
                        v.insert(Match::One(me.0, me.1));
                    }
                    Entry::Occupied(mut o) => match o.get_mut() {
                        Match::Arrived(c) => {
                            *c -= 1;
                            if *c == 0 {
                                o.remove();
                            }
                            self.receive(sim, step);
                        }
                        Match::One(s0, t0) => {
                            let q = VecDeque::from([(*s0, *t0), me]);
                            *o.get_mut() = Match::Many(Box::new(q));
                        }
                        Match::Many(q) => q.push_back(me),
                    },
                }
            }
            Op::Copy { len } => {
                let work = self.net.work(rank, false);
                self.work(sim, step, len as f64 * esize, work);
            }
            Op::Divide { len } => {
                let work = self.net.work(rank, true);
                self.work(sim, step, len as f64 * esize, work);
            }
        }
        Ok(())
    }

    /// A send of `sim`'s step `step` has left: the next waiting on its channel goes.
    fn next_on_channel(&mut self, sim: usize, step: usize) {
        let Op::Send { peer, .. } = self.runs[sim].plan.ops[step] else {
            return;
        };
        let Some(ch) = self.channels.get_mut(sim, peer as usize) else {
            return;
        };
        match ch.queue.pop_front() {
            Some((s, st)) => {
                let (sim, step) = (s as usize, st as usize);
                let (path, alpha) = (ch.path.resources, ch.path.alpha);
                let Op::Send { len, .. } = self.runs[sim].plan.ops[step] else {
                    return;
                };
                let bytes = len as f64 * self.case.elem_bytes as f64;
                self.flow(bytes, path, Job::Send { sim, step, alpha });
            }
            None => ch.busy -= 1,
        }
    }

    fn work(&mut self, sim: usize, step: usize, bytes: f64, path: Route) {
        if bytes > 0.0 {
            self.flow(bytes, path, Job::Work { sim, step });
        } else {
            self.done(sim, step);
        }
    }

    /// A receive whose message is here.
    fn receive(&mut self, sim: usize, step: usize) {
        // Never before the step started: a message already there is received at the start.
        if let Some(t) = self.runs[sim].times.get_mut(step) {
            t[0] = self.now;
        }
        let Op::Recv { len, work, .. } = self.runs[sim].plan.ops[step] else {
            return;
        };
        if work {
            let bytes = len as f64 * self.case.elem_bytes as f64;
            let work = self.net.work(self.rank_of(sim), true);
            self.work(sim, step, bytes, work);
        } else {
            self.done(sim, step);
        }
    }

    fn done(&mut self, sim: usize, step: usize) {
        self.steps += 1;
        let run = &mut self.runs[sim];
        if let Some(t) = run.times.get_mut(step) {
            t[1] = self.now;
        }
        run.left -= 1;
        run.end = run.end.max(self.now);
        for &d in run.plan.dependents(step) {
            let d = d as usize;
            run.waiting[d] -= 1;
            if run.waiting[d] == 0 {
                self.ready.push((sim, d));
            }
        }
    }

    /// Step `step` of `sim`, a send, has left: deliver it α from now, to the rank simulated
    /// that stands where its receiver does.
    fn sent(&mut self, sim: usize, step: usize, alpha: f64) -> Result<(), String> {
        let Op::Send { peer, tag, len } = self.runs[sim].plan.ops[step] else {
            return Err(format!("rank {sim} step {step} is not a send"));
        };
        let (peer, len) = (peer as usize, len as usize);
        let rank = self.rank_of(sim);
        let l = self.topo.per_host;
        let by = peer % l - peer % l % self.locals;
        let (from_rank, to, tag) = if self.sim_of(peer).is_some() {
            (rank, peer, tag)
        } else if by > 0 {
            // Inside the host: turn back by `by`; the sender so turned sends this with the
            // same tag (checked before the run).
            if peer / l != rank / l {
                return Err(format!(
                    "the plans are not symmetric by ranks inside a host: rank {rank} step \
                     {step} sends to rank {peer} on another host and local place (run every \
                     rank of a host: --locals {l})"
                ));
            }
            (self.turn(rank, l - by), peer - by, tag)
        } else {
            // Move by whole groups so the receiver lands in the group: rotate (rings,
            // chains), or translate by XOR (recursive doubling and halving, whose partners
            // differ in one bit). The sender is whichever image of `rank` really sends this.
            let k = peer / self.span;
            let to = peer - k * self.span;
            let rotated = (rank + self.world - k * self.span) % self.world;
            let xored = rank ^ (k * self.span);
            match self.image_tag(rotated, step, to, len) {
                Ok(tag) => (rotated, to, tag),
                Err(rotation) if xored < self.world => match self.image_tag(xored, step, to, len) {
                    Ok(tag) => (xored, to, tag),
                    Err(xor) => return Err(format!("{rotation}; {xor}")),
                },
                Err(rotation) => return Err(rotation),
            }
        };
        let key = (from_rank as u32, to as u32, tag);
        self.deliveries.push(self.now, alpha, key);
        Ok(())
    }

    /// The tag of step `step` of rank `image` (outside the group), which must be a send to
    /// `to` of `len` elements, as step `step` of its stand-in is.
    fn image_tag(
        &mut self,
        image: usize,
        step: usize,
        to: usize,
        len: usize,
    ) -> Result<u32, String> {
        if !self.others.contains_key(&image) {
            let plan = Steps::of(&plan_of(&mut self.layout, self.case, image)?)?;
            self.others.insert(image, plan);
        }
        let plan = &self.others[&image];
        match plan.ops.get(step) {
            // Parts of a count that does not divide evenly differ by one element.
            Some(Op::Send { peer, tag, len: l })
                if *peer as usize == to && (*l as usize).abs_diff(len) <= 1 =>
            {
                Ok(*tag)
            }
            other => Err(format!(
                "the plans are not symmetric by groups of {} ranks: rank {image} step {step} is {other:?}, \
                 where its stand-in in the group sends {len} elements to rank {to} (run it exactly: --group 0)",
                self.span
            )),
        }
    }

    fn arrive(&mut self, key: Key) {
        let first = match self.matches.entry(key) {
            Entry::Vacant(v) => {
                v.insert(Match::Arrived(1));
                None
            }
            Entry::Occupied(mut o) => match o.get_mut() {
                Match::Arrived(c) => {
                    *c += 1;
                    None
                }
                Match::One(sim, step) => {
                    let first = (*sim, *step);
                    o.remove();
                    Some(first)
                }
                Match::Many(q) => {
                    let first = q.pop_front();
                    if q.is_empty() {
                        o.remove();
                    }
                    first
                }
            },
        };
        if let Some((sim, step)) = first {
            self.receive(sim as usize, step as usize);
        }
    }
}
