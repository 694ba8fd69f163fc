//! What a schedule produces: a `Plan`, the steps one rank takes for one collective.
//!
//! Steps work on symbolic buffers ([`BufferId`]) in element units, so a plan is independent
//! of memory kind, element size and transport. Each step lists the steps it must wait for;
//! everything else may run in any order and overlap (several slices in flight per peer).

use std::collections::BTreeMap;

/// The buffers a plan refers to. The executor binds them to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufferId {
    /// The caller's send buffer (read only). Never used by in-place plans.
    Input,
    /// The caller's receive buffer (for in-place calls: the one buffer).
    Output,
    /// Temporary space of [`Plan::scratch_elems`] elements, owned by the executor.
    Scratch,
}

/// `len` elements of a buffer starting at element `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    pub buffer: BufferId,
    pub offset: usize,
    pub len: usize,
}

impl Region {
    pub fn new(buffer: BufferId, offset: usize, len: usize) -> Self {
        Region {
            buffer,
            offset,
            len,
        }
    }

    pub fn overlaps(&self, other: &Region) -> bool {
        self.buffer == other.buffer
            && self.offset < other.offset + other.len
            && other.offset < self.offset + self.len
    }
}

/// One thing a rank does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Send `from` to `peer` labelled `tag`. With `lend`, the receiver overwrites its region
    /// with it, so the transport may let it copy the bytes straight out of `from` (single copy,
    /// see `bcl_transport::Lend`); the step then ends when the receiver has.
    Send {
        peer: usize,
        tag: u32,
        from: Region,
        lend: bool,
    },
    /// Receive the message `tag` from `peer` into `into`, reducing with what is there when
    /// `reduce` is set, else overwriting. With a `seed`, `into` is first set from it when the
    /// message arrives (`into = seed ⊕ message`): an out-of-place reduction touches each
    /// slice once, just in time and cache-hot, instead of copying the whole input up front.
    Recv {
        peer: usize,
        tag: u32,
        into: Region,
        reduce: bool,
        seed: Option<Region>,
    },
    /// Copy between local regions.
    Copy { from: Region, to: Region },
    /// Divide every element of `region` by the number of ranks (the end of `avg`).
    Divide { region: Region },
}

/// An action and the indices of the steps that must finish before it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub action: Action,
    pub deps: Vec<usize>,
}

/// The steps of one rank for one collective.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub scratch_elems: usize,
    /// For each step, the steps that wait for it (the reverse of `deps`), computed once per
    /// plan so that running a cached plan does not rebuild it.
    pub dependents: Vec<Vec<usize>>,
}

/// Builds a plan, adding the data-hazard dependencies itself: a step waits for every earlier
/// step whose regions overlap its own where either writes, directly or through a step it
/// waits for. Algorithms then only state the order of their steps, not the hazards.
///
/// An access covered by a later write is forgotten: whatever overlaps it overlaps the write,
/// which waits for it, so a dependency on it would say nothing more. A region written round
/// after round (halving-doubling's kept half) then costs a step one dependency, not one per
/// round before it, and the search for overlaps stays among the accesses still visible.
#[derive(Debug, Default)]
pub struct PlanBuilder {
    plan: Plan,
    /// Every access so far, per buffer (indexed by [`slot`]).
    touched: [Touched; 3],
    /// The dependencies of the step being pushed, kept to spare an allocation per step.
    found: Vec<usize>,
    /// Accesses a write of the step being pushed covers, likewise.
    covered: Vec<(usize, usize)>,
}

/// The accesses to one buffer not yet covered by a later write, reads apart from writes (a
/// read looks among the writes only: a send from the input, which nothing writes, finds
/// nothing at once).
#[derive(Debug, Default)]
struct Touched {
    reads: Accesses,
    writes: Accesses,
}

/// Accesses: len by (offset, step), and the longest len ever seen, so that the accesses
/// overlapping a region are found among those starting at most that far before it (plans of
/// thousands of steps, as a 1024-rank ring's, would otherwise cost a scan of every earlier
/// access per step). One map entry per access, not a list per offset: a 10k-rank simulation
/// builds millions of steps, and a list each cost more than the search.
#[derive(Debug, Default)]
struct Accesses {
    by_offset: BTreeMap<(usize, usize), usize>,
    longest: usize,
}

impl Accesses {
    /// The steps of the accesses overlapping `region` onto `deps`; with `covering` (a write
    /// of `region`), the keys of those inside it onto `covered` as well.
    fn overlapping(
        &self,
        region: Region,
        deps: &mut Vec<usize>,
        mut covering: Option<&mut Vec<(usize, usize)>>,
    ) {
        // An earlier access [o, o + l) overlaps [a, a + len) when o < a + len and
        // o + l > a, so o > a - longest.
        let (a, end) = (region.offset, region.offset + region.len);
        let from = (a + 1).saturating_sub(self.longest);
        if from >= end {
            return;
        }
        for (&(o, step), &l) in self.by_offset.range((from, 0)..(end, 0)) {
            if o + l > a {
                deps.push(step);
                if let Some(covered) = covering.as_deref_mut()
                    && o >= a
                    && o + l <= end
                {
                    covered.push((o, step));
                }
            }
        }
    }

    fn insert(&mut self, region: Region, step: usize) {
        if region.len > 0 {
            self.longest = self.longest.max(region.len);
            self.by_offset.insert((region.offset, step), region.len);
        }
    }
}

/// Where a buffer's accesses are kept in [`PlanBuilder::touched`].
fn slot(buffer: BufferId) -> usize {
    match buffer {
        BufferId::Input => 0,
        BufferId::Output => 1,
        BufferId::Scratch => 2,
    }
}

impl PlanBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn scratch(&mut self, elems: usize) {
        self.plan.scratch_elems = self.plan.scratch_elems.max(elems);
    }

    /// The index the next step will get.
    pub fn next_index(&self) -> usize {
        self.plan.steps.len()
    }

    /// Add a step; returns its index.
    pub fn push(&mut self, action: Action) -> usize {
        self.push_after(action, &[])
    }

    /// Add a step that also waits for `after` (for ordering that no data hazard expresses,
    /// such as the rounds of a barrier).
    pub fn push_after(&mut self, action: Action, after: &[usize]) -> usize {
        let index = self.plan.steps.len();
        let accesses: [Option<(Region, bool)>; 2] = match &action {
            Action::Send { from, .. } => [Some((*from, false)), None],
            Action::Recv { into, seed, .. } => [Some((*into, true)), seed.map(|s| (s, false))],
            Action::Copy { from, to } => [Some((*from, false)), Some((*to, true))],
            Action::Divide { region } => [Some((*region, true)), None],
        };
        let (deps, covered) = (&mut self.found, &mut self.covered);
        deps.clear();
        deps.extend_from_slice(after);
        for (region, writes) in accesses.iter().flatten() {
            let t = &mut self.touched[slot(region.buffer)];
            if !writes {
                t.writes.overlapping(*region, deps, None);
                continue;
            }
            for seen in [&mut t.reads, &mut t.writes] {
                covered.clear();
                seen.overlapping(*region, deps, Some(covered));
                for key in covered.iter() {
                    seen.by_offset.remove(key);
                }
            }
        }
        deps.sort_unstable();
        deps.dedup();
        for (region, writes) in accesses.into_iter().flatten() {
            let t = &mut self.touched[slot(region.buffer)];
            let seen = if writes { &mut t.writes } else { &mut t.reads };
            seen.insert(region, index);
        }
        let deps = deps.clone();
        self.plan.steps.push(Step { action, deps });
        index
    }

    pub fn finish(mut self) -> Plan {
        // Counted first, so that each list is allocated once at its size.
        let mut counts = vec![0usize; self.plan.steps.len()];
        for step in &self.plan.steps {
            for &d in &step.deps {
                counts[d] += 1;
            }
        }
        let mut dependents: Vec<Vec<usize>> = counts.into_iter().map(Vec::with_capacity).collect();
        for (i, step) in self.plan.steps.iter().enumerate() {
            for &d in &step.deps {
                dependents[d].push(i);
            }
        }
        self.plan.dependents = dependents;
        self.plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dependencies the builder must find, by the definition: every earlier step with a
    /// non-empty region overlapping one of this step's, where either writes.
    fn brute_force(steps: &[(Region, Region)]) -> Vec<Vec<usize>> {
        (0..steps.len())
            .map(|i| {
                let (from, to) = steps[i];
                let mut deps: Vec<usize> = (0..i)
                    .filter(|&j| {
                        let (f2, t2) = steps[j];
                        let hit = |r: Region, w: bool, r2: Region, w2: bool| {
                            r2.len > 0 && (w || w2) && r.overlaps(&r2)
                        };
                        hit(from, false, f2, false)
                            || hit(from, false, t2, true)
                            || hit(to, true, f2, false)
                            || hit(to, true, t2, true)
                    })
                    .collect();
                deps.sort_unstable();
                deps
            })
            .collect()
    }

    /// For each step, every step it waits for directly or through others.
    fn closure(deps: &[Vec<usize>]) -> Vec<Vec<bool>> {
        let mut reach: Vec<Vec<bool>> = Vec::with_capacity(deps.len());
        for (i, direct) in deps.iter().enumerate() {
            let mut r = vec![false; i];
            for &d in direct {
                r[d] = true;
                for (e, &via) in reach[d].iter().enumerate() {
                    r[e] |= via;
                }
            }
            reach.push(r);
        }
        reach
    }

    #[test]
    fn hazards_found_by_offset_order_steps_as_a_scan_of_every_earlier_access_does() {
        // Copies between random regions of three buffers, some empty, some long.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |m: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m as u64) as usize
        };
        let buffers = [BufferId::Input, BufferId::Output, BufferId::Scratch];
        let mut steps = Vec::new();
        for _ in 0..400 {
            let region = |next: &mut dyn FnMut(usize) -> usize| {
                let len = match next(4) {
                    0 => 0,
                    1 => next(200),
                    _ => next(12),
                };
                Region::new(buffers[next(3)], next(256), len)
            };
            steps.push((region(&mut next), region(&mut next)));
        }
        let mut b = PlanBuilder::new();
        for &(from, to) in &steps {
            b.push(Action::Copy { from, to });
        }
        let plan = b.finish();
        let got: Vec<Vec<usize>> = plan.steps.iter().map(|s| s.deps.clone()).collect();
        let want = brute_force(&steps);
        // Every dependency found is a hazard, and every hazard is waited for, directly or
        // through steps that are.
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.iter().all(|d| w.contains(d)),
                "step {i}: {g:?} not within {w:?}"
            );
        }
        assert_eq!(closure(&got), closure(&want));
        assert!(
            want.iter().any(|d| d.len() > 3),
            "the case has real hazards"
        );
        let (found, hazards): (usize, usize) = (
            got.iter().map(Vec::len).sum(),
            want.iter().map(Vec::len).sum(),
        );
        assert!(
            found < hazards,
            "covered accesses are forgotten: {found} of {hazards}"
        );
    }
}
