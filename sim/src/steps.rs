//! A rank's plan as the engine holds it: what each step costs and which steps wait for which,
//! in flat arrays. A 10k-rank run holds millions of steps; as `Plan`s (two vectors and a full
//! `Action` a step) they took three times the memory, and the allocations and page faults
//! cost more than running them.

use bcl_core::schedule::{Action, Plan};

/// What the engine needs of a step: its kind, peer and tag for messages, its size in
/// elements. 16 bytes: a 100k-rank run holds about a hundred million.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Send {
        peer: u32,
        tag: u32,
        len: u32,
    },
    /// `work`: the message is reduced into (or seeded from) the buffer, costing device time.
    Recv {
        peer: u32,
        tag: u32,
        len: u32,
        work: bool,
    },
    Copy {
        len: u32,
    },
    Divide {
        len: u32,
    },
}

const _: () = assert!(std::mem::size_of::<Op>() == 16);

/// `x` as a field of an [`Op`], or an error naming what is too large.
fn small(x: usize, what: &str) -> Result<u32, String> {
    u32::try_from(x).map_err(|_| format!("a {what} of {x} is more than the simulator holds (2^32)"))
}

impl Op {
    /// The op of `action`; an action the simulator does not know, or one too large to hold,
    /// is an error naming it.
    pub fn of(action: &Action) -> Result<Op, String> {
        let len = |n: usize| small(n, "step's length in elements");
        Ok(match action {
            Action::Send {
                peer, tag, from, ..
            } => Op::Send {
                peer: small(*peer, "peer rank")?,
                tag: *tag,
                len: len(from.len)?,
            },
            Action::Recv {
                peer,
                tag,
                into,
                reduce,
                seed,
            } => Op::Recv {
                peer: small(*peer, "peer rank")?,
                tag: *tag,
                len: len(into.len)?,
                work: *reduce || seed.is_some(),
            },
            Action::Copy { from, .. } => Op::Copy {
                len: len(from.len)?,
            },
            Action::Divide { region } => Op::Divide {
                len: len(region.len)?,
            },
            other => return Err(format!("an action the simulator does not know: {other:?}")),
        })
    }
}

/// One rank's steps: ops, and dependencies both ways as offsets into flat lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steps {
    pub ops: Vec<Op>,
    dep_at: Vec<u32>,
    deps: Vec<u32>,
    next_at: Vec<u32>,
    nexts: Vec<u32>,
}

impl Steps {
    /// `plan`'s steps; refused where an action is unknown or the plan is too large to index
    /// with 32 bits.
    pub fn of(plan: &Plan) -> Result<Steps, String> {
        let n = plan.steps.len();
        let too_large = || format!("a plan of {n} steps is too large to simulate");
        let index = |i: usize| u32::try_from(i).map_err(|_| too_large());
        // Sized exactly: these vectors live for the whole run, millions of steps long.
        let ndeps = plan.steps.iter().map(|s| s.deps.len()).sum();
        let nnexts = plan.dependents.iter().map(Vec::len).sum();
        let mut s = Steps {
            ops: Vec::with_capacity(n),
            dep_at: Vec::with_capacity(n + 1),
            deps: Vec::with_capacity(ndeps),
            next_at: Vec::with_capacity(n + 1),
            nexts: Vec::with_capacity(nnexts),
        };
        s.dep_at.push(0);
        s.next_at.push(0);
        for (i, step) in plan.steps.iter().enumerate() {
            s.ops
                .push(Op::of(&step.action).map_err(|e| format!("step {i}: {e}"))?);
            for &d in &step.deps {
                s.deps.push(index(d)?);
            }
            s.dep_at.push(index(s.deps.len())?);
        }
        for after in &plan.dependents {
            for &d in after {
                s.nexts.push(index(d)?);
            }
            s.next_at.push(index(s.nexts.len())?);
        }
        if s.next_at.len() != n + 1 {
            return Err(format!(
                "a plan of {n} steps lists dependents of {}",
                s.next_at.len() - 1
            ));
        }
        Ok(s)
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The steps step `i` waits for.
    pub fn deps(&self, i: usize) -> &[u32] {
        &self.deps[self.dep_at[i] as usize..self.dep_at[i + 1] as usize]
    }

    /// The steps that wait for step `i`.
    pub fn dependents(&self, i: usize) -> &[u32] {
        &self.nexts[self.next_at[i] as usize..self.next_at[i + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcl_core::schedule::{Algorithm, Collective, Layout, build_plan};

    #[test]
    fn steps_keep_every_dependency_and_the_cost_of_every_action() {
        let layout = Layout::new(2, (0..5).collect()).expect("layout");
        let ar = Collective::AllReduce {
            op: bcl_core::ReduceOp::Sum,
        };
        let plan = build_plan(ar, Algorithm::Ring, &layout, 1003, false, 64);
        let steps = Steps::of(&plan).expect("steps");
        assert_eq!(steps.len(), plan.steps.len());
        let mut works = 0;
        for (i, step) in plan.steps.iter().enumerate() {
            let deps: Vec<usize> = steps.deps(i).iter().map(|&d| d as usize).collect();
            assert_eq!(deps, step.deps, "step {i}");
            let after: Vec<usize> = steps.dependents(i).iter().map(|&d| d as usize).collect();
            assert_eq!(after, plan.dependents[i], "step {i}");
            match (&step.action, steps.ops[i]) {
                (
                    Action::Send {
                        peer, tag, from, ..
                    },
                    Op::Send {
                        peer: p,
                        tag: t,
                        len,
                    },
                ) => {
                    assert_eq!((*peer, *tag, from.len), (p as usize, t, len as usize));
                }
                (
                    Action::Recv {
                        peer, tag, into, ..
                    },
                    Op::Recv {
                        peer: p,
                        tag: t,
                        len,
                        work,
                    },
                ) => {
                    assert_eq!((*peer, *tag, into.len), (p as usize, t, len as usize));
                    works += usize::from(work);
                }
                (Action::Copy { from, .. }, Op::Copy { len }) => assert_eq!(from.len, len as usize),
                (Action::Divide { region }, Op::Divide { len }) => {
                    assert_eq!(region.len, len as usize)
                }
                (a, op) => panic!("step {i}: {a:?} held as {op:?}"),
            }
        }
        // A ring's reduce-scatter half reduces what it receives; its allgather half does not.
        assert!(
            works > 0 && works < steps.len() / 2,
            "{works} of {}",
            steps.len()
        );
    }
}
