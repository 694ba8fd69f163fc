//! `shrink`: the survivors of a fault build a communicator without the ranks that left
//! (ncclCommShrink, MPIX_Comm_shrink). Only survivors call it; they first agree on who left
//! ([`crate::agreement`], over the health channel, which works while the data path is
//! poisoned and serves messages whether or not its rank has called shrink yet), then send
//! each other the new communicator's addresses, connect, and meet in a barrier. A rank that
//! dies meanwhile is found (its health port refuses) and the survivors carry on from the
//! larger set; the new communicator's secret is derived from its exact membership, so ranks
//! that ended up with different sets cannot connect to each other.

use super::Communicator;
use super::child::decode_record;
use super::init::finish;
use crate::agreement::{Agreement, Failure, Mode};
use crate::error::{Error, Result};
use crate::health::Liveness;
use crate::health::Sent;
use crate::peers::{RankInfo, label_of};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Which ranks a shrink leaves out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Exclude<'a> {
    /// Exactly these ranks (every survivor must pass the same list).
    Ranks(&'a [usize]),
    /// The ranks the health layer found dead or unresponsive, and any found gone during the
    /// shrink, as the survivors agree (`BCL_SHRINK_FAILED`).
    Failed,
}

/// What happens to operations still outstanding on this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShrinkMode {
    /// None may be outstanding (`BCL_SHRINK_DEFAULT`): an error says how many are.
    Default,
    /// Revoke the communicator first, so they fail, and wait for them (`BCL_SHRINK_ABORT`).
    Abort,
}

/// How long a rank waited on is left alone before it is asked whether it is there.
const CHECK_AFTER: Duration = Duration::from_millis(100);

/// How long a rank that finds a member gone out of the shrink waits for a proposal that
/// explains why (a conflicting list) before it reports the member's reason.
const ABANDON_GRACE: Duration = Duration::from_millis(200);

/// When this rank last answered each member's repeated proposal (see
/// `Communicator::take_proposals`).
#[derive(Default)]
struct Answers(BTreeMap<u32, Instant>);

impl Answers {
    /// Whether `rank` may be answered now (and note that it is).
    fn due(&mut self, rank: u32) -> bool {
        let now = Instant::now();
        if self
            .0
            .get(&rank)
            .is_some_and(|t| now.duration_since(*t) < CHECK_AFTER)
        {
            return false;
        }
        self.0.insert(rank, now);
        true
    }
}

/// Why an attempt ended without a communicator.
enum Retry {
    /// The set grew (a rank found gone, or a larger proposal): agree again.
    Again,
    Fail(Error),
}

impl From<Error> for Retry {
    fn from(e: Error) -> Self {
        Retry::Fail(e)
    }
}

impl Communicator {
    /// Shrink: the survivors (every rank but the excluded, each calling this) form a new
    /// communicator, renumbered densely in rank order. `Exclude::Failed` leaves out exactly
    /// the ranks found dead or unresponsive, as the survivors agree; survivors that pass
    /// different lists get an error naming both. Works on a poisoned or revoked communicator
    /// (that is what it is for); needs the health channel. This communicator stays as it is
    /// (poisoned, if it was) until dropped. Bounded by the init timeout.
    pub fn shrink(&self, exclude: Exclude<'_>, mode: ShrinkMode) -> Result<Communicator> {
        let started = Instant::now();
        let deadline = started + self.config().init_timeout;
        let shared = &self.shared;
        let me = self.rank();
        if !shared.health.enabled() {
            return Err(Error::Unavailable(format!(
                "rank {me}: shrink needs the health channel, which is off (BCL_HEALTH=off)"
            )));
        }
        let (initial, agree_mode) = match exclude {
            Exclude::Ranks(list) => (self.check_exclusions(list)?, Mode::Fixed),
            Exclude::Failed => (shared.health.failed_ranks(), Mode::Union),
        };
        if initial.contains(&me) {
            // The verdict in force names this rank (a stopped rank that continues and reads
            // the others' verdict on it): the survivors go on without it.
            let by = shared.health.verdict().map_or(me, |v| v.detected_by);
            return Err(Error::Excluded {
                rank: me,
                by,
                excluded: initial,
            });
        }
        self.settle_outstanding(mode, deadline)?;
        let n = self.next_child();
        let world = self.world_size() as u32;
        let mut agreement = Agreement::new(
            me as u32,
            world,
            initial.iter().map(|&r| r as u32),
            agree_mode,
        );
        shared.health.set_excluded(agreement.excluded());
        let mut answers = Answers::default();
        loop {
            let outcome = self
                .decide(&mut agreement, &mut answers, deadline)
                .and_then(|members| {
                    self.build(&mut agreement, &mut answers, &members, n, started, deadline)
                });
            match outcome {
                Ok(comm) => return Ok(comm),
                Err(Retry::Again) => continue,
                Err(Retry::Fail(e)) => {
                    shared.health.abandon(e.to_string());
                    return Err(e);
                }
            }
        }
    }

    /// A list of ranks to exclude, checked: in range, not this rank.
    fn check_exclusions(&self, list: &[usize]) -> Result<Vec<usize>> {
        let me = self.rank();
        for &r in list {
            if r >= self.world_size() {
                return Err(Error::InvalidArgument(format!(
                    "shrink: rank {r} to exclude is not in 0..{}",
                    self.world_size()
                )));
            }
            if r == me {
                return Err(Error::InvalidArgument(format!(
                    "shrink: rank {me} lists itself among the ranks to exclude (only survivors call shrink)"
                )));
            }
        }
        let mut list = list.to_vec();
        list.sort_unstable();
        list.dedup();
        Ok(list)
    }

    /// Outstanding device work: an error (default), or revoke and wait for it (abort).
    fn settle_outstanding(&self, mode: ShrinkMode, deadline: Instant) -> Result<()> {
        let shared = &self.shared;
        let outstanding = *shared.queued.lock();
        if outstanding == 0 {
            return Ok(());
        }
        if mode == ShrinkMode::Default {
            return Err(Error::InvalidArgument(format!(
                "shrink: rank {} has {outstanding} operation(s) outstanding; wait for them or \
                 shrink with ShrinkMode::Abort (BCL_SHRINK_ABORT)",
                self.rank()
            )));
        }
        if !shared.health.faulted() {
            self.revoke();
        }
        let mut queued = shared.queued.lock();
        while *queued > 0 && Instant::now() < deadline {
            shared
                .drained
                .wait_for(&mut queued, Duration::from_millis(50));
        }
        Ok(())
    }

    /// Convert an agreement failure into this rank's error.
    fn failure(&self, f: Failure) -> Error {
        let me = self.rank();
        match f {
            Failure::Excluded { by, excluded } => Error::Excluded {
                rank: me,
                by: by as usize,
                excluded: excluded.into_iter().map(|r| r as usize).collect(),
            },
            Failure::Conflict { mine, theirs, from } => Error::InvalidArgument(format!(
                "shrink: rank {me} excludes {mine:?} but rank {from} excludes {theirs:?}; every \
                 survivor must pass the same list"
            )),
            Failure::KeptRankGone { rank } => Error::Bootstrap {
                rank: me,
                reason: format!(
                    "shrink: {} is gone, but the list of ranks to exclude keeps it",
                    label_of(self.peers(), rank as usize)
                ),
            },
        }
    }

    /// What a message to `to` tells: `Ok(true)` when `to` was found gone and the set grew.
    fn delivered(&self, agreement: &mut Agreement, to: u32, sent: Sent) -> Result<bool> {
        match sent {
            Sent::Delivered => Ok(false),
            Sent::ExcludedMe(excluded) => Err(self.failure(Failure::Excluded { by: to, excluded })),
            Sent::Abandoned(why) => {
                // A member that gave up was most often excluded by a survivor passing another
                // list; that survivor's proposal, which names both lists, is usually on its
                // way here: let it explain (bounded), else report the member's reason.
                let until = Instant::now() + ABANDON_GRACE;
                loop {
                    for p in self.shared.health.take_proposals() {
                        agreement.receive(p).map_err(|f| self.failure(f))?;
                    }
                    if Instant::now() >= until {
                        break;
                    }
                    self.shared.health.wait_mail(Duration::from_millis(5));
                }
                Err(Error::Bootstrap {
                    rank: self.rank(),
                    reason: format!(
                        "shrink: {} gave up on it: {why}",
                        label_of(self.peers(), to as usize)
                    ),
                })
            }
            // It answers queries: try it again later.
            Sent::Failed(Liveness::Alive) => Ok(false),
            Sent::Failed(_) => {
                let grew = agreement.found_gone(to).map_err(|f| self.failure(f))?;
                self.shared.health.set_excluded(agreement.excluded());
                Ok(grew)
            }
        }
    }

    /// Take the proposals that arrived: `Ok(true)` when this rank's set grew. A member that
    /// sends one this rank already had is waiting for this rank's proposal (only waiting
    /// ranks send again, and what they send is their own): its delivery may have failed while
    /// the member answered (seen under load in CI, with two deaths at once), so answer it,
    /// at most once per member every `CHECK_AFTER`. In union mode the answer is always news
    /// to the waiter (a set it lacked would have grown its own), so answers do not bounce.
    fn take_proposals(&self, agreement: &mut Agreement, answers: &mut Answers) -> Result<bool> {
        let mut grew = false;
        for p in self.shared.health.take_proposals() {
            let (from, again) = (p.from, agreement.already_had(&p));
            grew |= agreement.receive(p).map_err(|f| self.failure(f))?;
            if again && !grew && agreement.members_but_me().contains(&from) && answers.due(from) {
                let sent = self
                    .shared
                    .health
                    .propose(from as usize, &agreement.proposal());
                grew |= self.delivered(agreement, from, sent)?;
            }
        }
        Ok(grew)
    }

    /// Send this rank's proposal to every member; ranks found gone join the set (and the
    /// proposal is sent again).
    fn propose(&self, agreement: &mut Agreement) -> Result<()> {
        'again: loop {
            self.shared.health.set_excluded(agreement.excluded());
            let proposal = agreement.proposal();
            for to in agreement.members_but_me() {
                let sent = self.shared.health.propose(to as usize, &proposal);
                if self.delivered(agreement, to, sent)? {
                    continue 'again;
                }
            }
            return Ok(());
        }
    }

    /// Run the agreement to its decision: the members (old ranks) of the new communicator.
    fn decide(
        &self,
        agreement: &mut Agreement,
        answers: &mut Answers,
        deadline: Instant,
    ) -> Result<Vec<u32>, Retry> {
        let health = &self.shared.health;
        self.propose(agreement)?;
        let mut last_check = Instant::now();
        loop {
            let grew = self.take_proposals(agreement, answers)?;
            if grew {
                self.propose(agreement)?;
                continue;
            }
            if let Some(excluded) = agreement.decided() {
                health.set_excluded(excluded.clone());
                if excluded.len() + 1 == self.world_size() && !agreement.heard_from_anyone() {
                    // Alone, and no rank ever wrote: they are gone or have left this
                    // communicator (a stopped rank that continues after the others shrank
                    // without it and destroyed the old one). Not a communicator of one.
                    return Err(Retry::Fail(Error::Excluded {
                        rank: self.rank(),
                        by: self.rank(),
                        excluded: excluded.iter().map(|&r| r as usize).collect(),
                    }));
                }
                return Ok((0..self.world_size() as u32)
                    .filter(|r| !excluded.contains(r))
                    .collect());
            }
            let waiting = agreement.waiting_on();
            if Instant::now() >= deadline {
                return Err(Retry::Fail(self.still_waiting(&waiting, "propose")));
            }
            if last_check.elapsed() >= CHECK_AFTER {
                // Send the proposal again to those waited on: the answer says whether they
                // are there, have excluded this rank, or have given up.
                last_check = Instant::now();
                let proposal = agreement.proposal();
                let mut grew = false;
                for r in waiting {
                    let sent = health.propose(r as usize, &proposal);
                    grew |= self.delivered(agreement, r, sent)?;
                }
                if grew {
                    self.propose(agreement)?;
                }
            }
            health.wait_mail(Duration::from_millis(5));
        }
    }

    /// Ask `waiting` whether they are there; the gone and the silent join the set (an error
    /// when a caller's list keeps them). Returns whether it grew.
    fn check_waited(&self, agreement: &mut Agreement, waiting: &[u32]) -> Result<bool> {
        let mut grew = false;
        for &r in waiting {
            match self.shared.health.liveness(r as usize) {
                Liveness::Alive => {}
                Liveness::Gone(_) | Liveness::Silent(_) => {
                    grew |= agreement.found_gone(r).map_err(|f| self.failure(f))?;
                }
            }
        }
        Ok(grew)
    }

    /// The error when the deadline passes while ranks are awaited: who, and what they are.
    fn still_waiting(&self, waiting: &[u32], what: &str) -> Error {
        let names: Vec<String> = waiting
            .iter()
            .map(|&r| {
                let state = match self.shared.health.liveness(r as usize) {
                    Liveness::Alive => "alive, has not called shrink".to_string(),
                    Liveness::Gone(why) => format!("gone: {why}"),
                    Liveness::Silent(why) => format!("silent: {why}"),
                };
                format!("{} ({state})", label_of(self.peers(), r as usize))
            })
            .collect();
        Error::Bootstrap {
            rank: self.rank(),
            reason: format!(
                "shrink timed out after {:.1} s: no {what} from {}",
                self.config().init_timeout.as_secs_f64(),
                names.join(", ")
            ),
        }
    }

    /// Open this rank's endpoint for the communicator of `members`, exchange records with
    /// them, connect, and meet in a barrier.
    fn build(
        &self,
        agreement: &mut Agreement,
        answers: &mut Answers,
        members: &[u32],
        n: u64,
        started: Instant,
        deadline: Instant,
    ) -> Result<Communicator, Retry> {
        let health = &self.shared.health;
        let me = self.rank() as u32;
        let new_rank = members
            .iter()
            .position(|&r| r == me)
            .ok_or_else(|| Error::Internal(format!("rank {me} is not among its own members")))?;
        let secret = self.child_secret(&format!("shrink:{n}"), members);
        let (config, opened, record) = self.open_child(secret, new_rank, members)?;
        for &to in members.iter().filter(|&&r| r != me) {
            let sent = health.send_address(to as usize, members, &record);
            if self.delivered(agreement, to, sent)? {
                return Err(Retry::Again);
            }
        }
        let mut records: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        records.insert(me, record);
        let mut last_check = Instant::now();
        while records.len() < members.len() {
            if self.take_proposals(agreement, answers)? {
                return Err(Retry::Again);
            }
            let missing: Vec<u32> = members
                .iter()
                .copied()
                .filter(|r| !records.contains_key(r))
                .collect();
            for &r in &missing {
                if let Some(bytes) = health.address_from(r, members) {
                    records.insert(r, bytes);
                }
            }
            if missing.iter().any(|&r| agreement.overtaken_by(r)) {
                return Err(Retry::Again);
            }
            if Instant::now() >= deadline {
                return Err(Retry::Fail(self.still_waiting(&missing, "address")));
            }
            if last_check.elapsed() >= CHECK_AFTER {
                last_check = Instant::now();
                for &r in &missing {
                    let sent = health.send_address(r as usize, members, &records[&me]);
                    if self.delivered(agreement, r, sent)? {
                        return Err(Retry::Again);
                    }
                }
            }
            health.wait_mail(Duration::from_millis(2));
        }
        let peers = members
            .iter()
            .enumerate()
            .map(|(new, old)| {
                let bytes = records.get(old).map(Vec::as_slice).unwrap_or_default();
                decode_record(new, bytes, &format!("rank {old}"))
            })
            .collect::<Result<Vec<RankInfo>>>()?;
        // Connecting and the barrier fail if a member died meanwhile: find it and carry on.
        let built = finish(config, opened, secret, peers, started, deadline)
            .and_then(|comm| comm.barrier().map(|()| comm));
        match built {
            Ok(comm) => Ok(comm),
            Err(e) => {
                let others: Vec<u32> = members.iter().copied().filter(|&r| r != me).collect();
                if self.check_waited(agreement, &others)? {
                    Err(Retry::Again)
                } else {
                    Err(Retry::Fail(e))
                }
            }
        }
    }
}
