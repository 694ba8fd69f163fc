//! Agreeing on who leaves, before survivors shrink a communicator: a sans-IO state machine
//! (messages in, messages out, no clock or socket), driven by `comm/shrink.rs` over the health
//! channel and tested here with deliveries in random order and ranks dying meanwhile.
//!
//! The protocol, for one rank `i` with excluded set `F` (the ranks found dead or
//! unresponsive, or the caller's list):
//! * `i` sends `(F, seq)` to every rank not in `F`; whenever `F` grows, `seq` grows and `i`
//!   sends again. `F` never shrinks.
//! * A proposal from `j` is merged: `F ← F ∪ F_j` (union mode), or must equal `F` (a list the
//!   caller gave: two lists are a conflict naming both). A proposal that excludes `i` itself
//!   ends `i`'s part: the others have given up on it.
//! * A rank found gone while `i` waits (its health port refuses) joins `F`.
//! * `i` decides `F` once the latest proposal of every rank not in `F` equals `F`.
//!
//! Why two deciders agree: if `i` decides `F` and `j` decides `F'`, `i` saw `j` propose `F`
//! and `j` saw `i` propose `F'`; each rank's proposals only grow, so `F ⊆ F'` (from `j`'s) and
//! `F' ⊆ F` (from `i`'s). What this cannot promise alone: a rank dying after `i` decided (the
//! others wait for it and add it) or a rank wrongly thought dead. Both are caught when the new
//! communicator is built, because its secret is derived from its exact membership (ranks of
//! different memberships cannot connect), and the shrink then carries on from the larger set.

use std::collections::{BTreeMap, BTreeSet};

/// One rank's proposal: the ranks it would exclude, and how often its set has grown.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Proposal {
    pub from: u32,
    pub seq: u32,
    pub excluded: Vec<u32>,
}

/// How proposals combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Exclude every rank any survivor found failed (`BCL_SHRINK_FAILED`).
    Union,
    /// Every survivor must pass the same list.
    Fixed,
}

/// Why the agreement cannot end in a communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// `by` excludes this rank (it found it dead or unresponsive, or its list says so).
    Excluded { by: u32, excluded: Vec<u32> },
    /// Two survivors passed different lists.
    Conflict {
        mine: Vec<u32>,
        theirs: Vec<u32>,
        from: u32,
    },
    /// A rank the caller's list keeps is gone.
    KeptRankGone { rank: u32 },
}

/// One rank's side of the agreement.
#[derive(Debug)]
pub struct Agreement {
    me: u32,
    world: u32,
    mode: Mode,
    excluded: BTreeSet<u32>,
    seq: u32,
    /// The latest proposal of each rank (highest seq).
    latest: BTreeMap<u32, Proposal>,
}

impl Agreement {
    /// `me` of `world`, starting from `excluded` (which must not hold `me`).
    pub fn new(me: u32, world: u32, excluded: impl IntoIterator<Item = u32>, mode: Mode) -> Self {
        Agreement {
            me,
            world,
            mode,
            excluded: excluded.into_iter().filter(|&r| r < world).collect(),
            seq: 0,
            latest: BTreeMap::new(),
        }
    }

    /// What this rank proposes now.
    pub fn proposal(&self) -> Proposal {
        Proposal {
            from: self.me,
            seq: self.seq,
            excluded: self.excluded.iter().copied().collect(),
        }
    }

    /// The ranks this rank's proposal goes to (every other rank not excluded).
    pub fn members_but_me(&self) -> Vec<u32> {
        (0..self.world)
            .filter(|r| *r != self.me && !self.excluded.contains(r))
            .collect()
    }

    /// The excluded set now.
    pub fn excluded(&self) -> Vec<u32> {
        self.excluded.iter().copied().collect()
    }

    /// Whether `p` is one this rank already had (a member sending it again because it still
    /// waits for this rank's proposal).
    pub fn already_had(&self, p: &Proposal) -> bool {
        self.latest.get(&p.from).is_some_and(|old| old.seq >= p.seq)
    }

    /// Take a proposal. `Ok(true)`: this rank's set grew (send the new proposal).
    pub fn receive(&mut self, p: Proposal) -> Result<bool, Failure> {
        if p.from >= self.world || p.from == self.me {
            return Ok(false);
        }
        if p.excluded.contains(&self.me) {
            return Err(Failure::Excluded {
                by: p.from,
                excluded: p.excluded,
            });
        }
        if self.latest.get(&p.from).is_some_and(|old| old.seq >= p.seq) {
            return Ok(false);
        }
        let theirs: BTreeSet<u32> = p
            .excluded
            .iter()
            .copied()
            .filter(|&r| r < self.world)
            .collect();
        self.latest.insert(p.from, p.clone());
        match self.mode {
            Mode::Fixed if theirs != self.excluded => Err(Failure::Conflict {
                mine: self.excluded(),
                theirs: p.excluded,
                from: p.from,
            }),
            Mode::Fixed => Ok(false),
            Mode::Union => {
                let before = self.excluded.len();
                self.excluded.extend(theirs);
                Ok(self.grew(before))
            }
        }
    }

    /// `rank` was found gone while this rank waited for it. `Ok(true)`: the set grew.
    pub fn found_gone(&mut self, rank: u32) -> Result<bool, Failure> {
        if rank >= self.world || rank == self.me || self.excluded.contains(&rank) {
            return Ok(false);
        }
        match self.mode {
            Mode::Fixed => Err(Failure::KeptRankGone { rank }),
            Mode::Union => {
                let before = self.excluded.len();
                self.excluded.insert(rank);
                Ok(self.grew(before))
            }
        }
    }

    fn grew(&mut self, before: usize) -> bool {
        let grew = self.excluded.len() > before;
        if grew {
            self.seq += 1;
        }
        grew
    }

    /// The members whose latest proposal differs from this rank's set (or who sent none).
    pub fn waiting_on(&self) -> Vec<u32> {
        self.members_but_me()
            .into_iter()
            .filter(|r| {
                self.latest.get(r).is_none_or(|p| {
                    p.excluded.iter().copied().collect::<BTreeSet<_>>() != self.excluded
                })
            })
            .collect()
    }

    /// The agreed excluded set, once every member proposed it.
    pub fn decided(&self) -> Option<Vec<u32>> {
        self.waiting_on().is_empty().then(|| self.excluded())
    }

    /// Whether any other rank's proposal arrived.
    pub fn heard_from_anyone(&self) -> bool {
        !self.latest.is_empty()
    }

    /// Whether `rank`'s latest proposal excludes more than this rank's set does: it has moved
    /// on to a larger set, so whatever was built from this one will not meet it.
    pub fn overtaken_by(&self, rank: u32) -> bool {
        self.latest
            .get(&rank)
            .is_some_and(|p| p.excluded.iter().any(|r| !self.excluded.contains(r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator (no dependency for one test).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    /// `world` ranks run the agreement over a network that delivers messages in random order;
    /// `dead` ranks are dead from the start (known to `known` only), and `dying` die after
    /// sending a few messages. Ranks that find a peer silent eventually find it gone (a probe
    /// that is refused). Returns each live rank's decision.
    fn run(
        world: u32,
        known: &[(u32, u32)],
        dying: &[(u32, usize)],
        seed: u64,
    ) -> Vec<(u32, Vec<u32>)> {
        let mut rng = Lcg(seed);
        let dead0: BTreeSet<u32> = known.iter().map(|(d, _)| *d).collect();
        let mut ranks: Vec<Agreement> = (0..world)
            .map(|r| {
                let ex = known.iter().filter(|(_, k)| *k == r).map(|(d, _)| *d);
                Agreement::new(r, world, ex, Mode::Union)
            })
            .collect();
        let mut alive: Vec<bool> = (0..world).map(|r| !dead0.contains(&r)).collect();
        let mut decided: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        let mut net: Vec<(u32, Proposal)> = Vec::new();
        let broadcast = |a: &Agreement, net: &mut Vec<(u32, Proposal)>| {
            for to in a.members_but_me() {
                net.push((to, a.proposal()));
            }
        };
        for r in 0..world {
            if alive[r as usize] {
                broadcast(&ranks[r as usize], &mut net);
            }
        }
        for round in 0..100_000 {
            let live_undecided: Vec<u32> = (0..world)
                .filter(|r| alive[*r as usize] && !decided.contains_key(r))
                .collect();
            if live_undecided.is_empty() {
                break;
            }
            if !net.is_empty() && rng.below(4) != 0 {
                let i = rng.below(net.len() as u64) as usize;
                let (to, p) = net.swap_remove(i);
                let from = p.from;
                if !alive[to as usize] || !alive[from as usize] && rng.below(2) == 0 {
                    continue; // to a dead rank, or lost with its dead sender
                }
                if decided.contains_key(&to) {
                    continue;
                }
                let a = &mut ranks[to as usize];
                if a.receive(p).expect("no false exclusion in this model") {
                    broadcast(a, &mut net);
                }
                if let Some(d) = a.decided() {
                    decided.insert(to, d);
                }
            } else {
                // A waiting rank probes someone it waits on: the dead are found gone.
                let r = live_undecided[rng.below(live_undecided.len() as u64) as usize];
                let a = &mut ranks[r as usize];
                let waits = a.waiting_on();
                if let Some(&w) = waits.get(rng.below(waits.len().max(1) as u64) as usize)
                    && !alive[w as usize]
                    && a.found_gone(w).expect("union mode")
                {
                    broadcast(a, &mut net);
                }
                if let Some(d) = a.decided() {
                    decided.insert(r, d);
                }
            }
            for &(d, after) in dying {
                if round == after * 5 {
                    alive[d as usize] = false;
                }
            }
        }
        decided
            .into_iter()
            .filter(|(r, _)| alive[*r as usize])
            .collect()
    }

    #[test]
    fn survivors_that_decide_decide_alike_whatever_the_order_and_deaths() {
        for seed in 0..300 {
            let world = 2 + (seed % 9) as u32;
            let victim = (seed as u32 * 7) % world;
            let knower = (victim + 1) % world;
            let second = (victim + 2) % world;
            let dying: Vec<(u32, usize)> = if world > 3 && seed % 3 == 0 {
                vec![(second, (seed % 5) as usize)]
            } else {
                vec![]
            };
            let decisions = run(world, &[(victim, knower)], &dying, seed);
            let first = &decisions.first().expect("someone decides").1;
            for (r, d) in &decisions {
                assert_eq!(
                    d, first,
                    "seed {seed}: rank {r} decided {d:?}, another {first:?}"
                );
                assert!(d.contains(&victim), "seed {seed}: the dead rank was kept");
            }
            if dying.is_empty() {
                assert_eq!(
                    first,
                    &vec![victim],
                    "seed {seed}: only the dead rank leaves"
                );
                assert_eq!(
                    decisions.len() as u32,
                    world - 1,
                    "seed {seed}: every survivor decides"
                );
            }
        }
    }

    #[test]
    fn two_ranks_dead_at_once_known_to_different_survivors() {
        for seed in 0..50 {
            let d = run(8, &[(3, 4), (6, 0)], &[], seed);
            assert_eq!(d.len(), 6, "seed {seed}");
            assert!(
                d.iter().all(|(_, x)| x == &vec![3, 6]),
                "seed {seed}: {d:?}"
            );
        }
    }

    #[test]
    fn different_lists_are_a_conflict_naming_both() {
        let mut a = Agreement::new(0, 4, [3], Mode::Fixed);
        let err = a
            .receive(Proposal {
                from: 1,
                seq: 0,
                excluded: vec![2],
            })
            .expect_err("conflict");
        assert_eq!(
            err,
            Failure::Conflict {
                mine: vec![3],
                theirs: vec![2],
                from: 1
            }
        );
        let mut b = Agreement::new(0, 4, [3], Mode::Fixed);
        assert_eq!(b.found_gone(1), Err(Failure::KeptRankGone { rank: 1 }));
    }

    #[test]
    fn a_proposal_that_excludes_me_ends_my_part() {
        let mut a = Agreement::new(2, 4, [], Mode::Union);
        assert_eq!(
            a.receive(Proposal {
                from: 0,
                seq: 1,
                excluded: vec![2]
            }),
            Err(Failure::Excluded {
                by: 0,
                excluded: vec![2]
            })
        );
    }

    #[test]
    fn a_stale_proposal_does_not_overwrite_a_newer_one() {
        let mut a = Agreement::new(0, 3, [], Mode::Union);
        assert_eq!(
            a.receive(Proposal {
                from: 1,
                seq: 1,
                excluded: vec![2]
            }),
            Ok(true)
        );
        assert_eq!(
            a.receive(Proposal {
                from: 1,
                seq: 0,
                excluded: vec![]
            }),
            Ok(false)
        );
        assert_eq!(a.decided(), Some(vec![2]));
    }
}
