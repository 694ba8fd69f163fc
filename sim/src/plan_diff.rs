//! Where a second case's plans differ from a first's on the same ranks (in place against out
//! of place), found rank by rank on a thread beside the first case's run: the engine reuses
//! the first run's times for the second where the plans allow it (see
//! `engine::simulate_both`), and checking that meant building every plan a second time after
//! the run: 18% of the 100k 64 MiB row (`perf record`) on the one core. Only the steps whose
//! dependencies differ are kept, for the engine to hold against the first run's times.

use crate::steps::Op;
use bcl_core::schedule::Plan;
use std::sync::atomic::{AtomicBool, Ordering};

/// Dependencies of differing steps kept at most (64 MB of them); past it the engine compares
/// the plans after its run, as it did before.
const MOST_DEPS: usize = 1 << 24;

/// What the second plans differ in.
#[derive(Debug, PartialEq, Eq)]
pub enum PlanDiff {
    /// A plan's length or some step's op (kind, peer, tag, size): the second case must run.
    Actions,
    /// The same ops; the steps whose dependencies differ, as (index of the rank in the list,
    /// step, the second plan's dependencies).
    Deps(Vec<(u32, u32, Box<[u32]>)>),
    /// More differing dependencies than kept (16 M), or stopped before the end: not known.
    Unknown,
}

/// Compare the plans `plans(k)` gives (first, second) for k in `0..ranks`; stops early, with
/// [`PlanDiff::Unknown`], once `stop` is set.
pub fn compare(
    ranks: usize,
    mut plans: impl FnMut(usize) -> Result<(Plan, Plan), String>,
    stop: &AtomicBool,
) -> Result<PlanDiff, String> {
    let mut diff = Vec::new();
    let mut held = 0usize;
    for k in 0..ranks {
        if stop.load(Ordering::Relaxed) {
            return Ok(PlanDiff::Unknown);
        }
        let (a, b) = plans(k)?;
        if a.steps.len() != b.steps.len() {
            return Ok(PlanDiff::Actions);
        }
        for (i, (x, y)) in a.steps.iter().zip(&b.steps).enumerate() {
            if Op::of(&x.action)? != Op::of(&y.action)? {
                return Ok(PlanDiff::Actions);
            }
            if x.deps != y.deps {
                held += y.deps.len() + 1;
                if held > MOST_DEPS {
                    return Ok(PlanDiff::Unknown);
                }
                let deps = y.deps.iter().map(|&d| d as u32).collect();
                diff.push((k as u32, i as u32, deps));
            }
        }
    }
    Ok(PlanDiff::Deps(diff))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcl_core::schedule::{Action, BufferId, Region, Step};

    fn plan(steps: &[(Action, &[usize])]) -> Plan {
        Plan {
            steps: (steps.iter())
                .map(|(action, deps)| Step {
                    action: action.clone(),
                    deps: deps.to_vec(),
                })
                .collect(),
            ..Plan::default()
        }
    }

    fn copy(len: usize) -> Action {
        Action::Copy {
            from: Region::new(BufferId::Input, 0, len),
            to: Region::new(BufferId::Output, 0, len),
        }
    }

    /// Differing dependencies are listed with the second plan's; a differing op or length
    /// ends the comparison; a stop is not an answer.
    #[test]
    fn lists_steps_whose_dependencies_differ_and_stops_at_an_action() {
        let a = plan(&[(copy(4), &[]), (copy(4), &[0]), (copy(4), &[1])]);
        let b = plan(&[(copy(4), &[]), (copy(4), &[0]), (copy(4), &[0, 1])]);
        let go = AtomicBool::new(false);
        let pairs = [(a.clone(), a.clone()), (a.clone(), b.clone())];
        let got = compare(2, |k| Ok(pairs[k].clone()), &go).expect("plans compare");
        assert_eq!(got, PlanDiff::Deps(vec![(1, 2, Box::from([0, 1]))]));
        let other = plan(&[(copy(4), &[]), (copy(8), &[0]), (copy(4), &[1])]);
        let got = compare(1, |_| Ok((a.clone(), other.clone())), &go).expect("plans compare");
        assert_eq!(got, PlanDiff::Actions);
        let shorter = plan(&[(copy(4), &[])]);
        let got = compare(1, |_| Ok((a.clone(), shorter.clone())), &go).expect("plans compare");
        assert_eq!(got, PlanDiff::Actions);
        let stop = AtomicBool::new(true);
        let got = compare(1, |_| Ok((a.clone(), b.clone())), &stop).expect("plans compare");
        assert_eq!(got, PlanDiff::Unknown);
        let err = compare(1, |_| Err("no plan".to_string()), &go);
        assert_eq!(err, Err("no plan".to_string()));
    }
}
