//! The health channel's part in changing membership: the mailbox where another rank's
//! shrink proposals and new-communicator addresses land (served by the health thread, so they
//! arrive whether or not this rank has called shrink yet), and the calls that send them.
//! The agreement itself is [`crate::agreement`]; `comm/shrink.rs` drives it.

use super::Inner;
use super::diagnose;
use super::wire::{self, Message, Purpose, Seen};
use crate::agreement::Proposal;
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::time::Duration;

/// What other ranks have sent this rank about a shrink.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    /// Each rank's latest proposal not yet taken (a waiting rank sends it again every
    /// 100 ms: only the newest counts, and the box stays one per rank).
    pub(crate) proposals: BTreeMap<u32, Proposal>,
    /// Each rank's latest address record, with the membership it is for.
    pub(crate) infos: BTreeMap<u32, (Vec<u32>, Vec<u8>)>,
    /// The excluded set of this rank's agreement in progress, or of the last one it decided:
    /// a rank in it that writes is told it was excluded.
    pub(crate) excluded: Option<Vec<u32>>,
    /// Why this rank's shrink failed, told to ranks that write afterwards.
    pub(crate) abandoned: Option<String>,
    /// Proposals of ranks this rank's agreement had excluded (zombies, late ranks): counted.
    pub(crate) refused: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Post {
    pub(crate) mailbox: Mutex<Mailbox>,
    pub(crate) arrived: Condvar,
}

/// What a direct query found about a rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Liveness {
    Alive,
    /// Its port refuses: the process is gone (or has destroyed this communicator).
    Gone(String),
    /// No answer within the probe timeout: stopped or hung.
    Silent(String),
}

impl From<Seen> for Liveness {
    fn from(seen: Seen) -> Self {
        match seen {
            Seen::Alive(_) => Liveness::Alive,
            Seen::Gone(why) => Liveness::Gone(why),
            Seen::NoAnswer(why) => Liveness::Silent(why),
        }
    }
}

/// What became of a message to another rank.
#[derive(Debug)]
pub(crate) enum Sent {
    Delivered,
    /// The receiver's agreement excludes this rank.
    ExcludedMe(Vec<u32>),
    /// The receiver's shrink failed, for this reason.
    Abandoned(String),
    /// Not delivered; what a query of the receiver found then.
    Failed(Liveness),
}

impl Post {
    /// Wait until something arrives or `timeout` passes.
    pub(crate) fn wait(&self, timeout: Duration) {
        let mut mb = self.mailbox.lock();
        let _ = self.arrived.wait_for(&mut mb, timeout);
    }
}

/// Serve one `Purpose::Agree` message from `peer` (on the health thread's helper).
pub(super) fn serve(inner: &Inner, peer: usize, message: Message) -> Message {
    let mut mb = inner.post.mailbox.lock();
    if let Some(ex) = mb.excluded.clone()
        && ex.contains(&(peer as u32))
    {
        mb.refused += 1;
        return Message::ExcludedYou(ex);
    }
    if let Some(why) = mb.abandoned.clone() {
        return Message::Abandoned(why);
    }
    match message {
        Message::Propose(p) if p.from as usize == peer => {
            if mb.proposals.get(&p.from).is_none_or(|old| old.seq < p.seq) {
                mb.proposals.insert(p.from, p);
            }
        }
        Message::Address { members, info } => {
            mb.infos.insert(peer as u32, (members, info));
        }
        other => {
            tracing::debug!(
                rank = inner.rank,
                peer,
                "unexpected agreement message {other:?}"
            );
            return Message::Goodbye;
        }
    }
    drop(mb);
    inner.post.arrived.notify_all();
    Message::Accepted
}

/// Send `message` to `to`'s health channel and read its answer, within the probe timeout.
pub(super) fn send(inner: &Inner, to: usize, message: &Message) -> Sent {
    let Some(addr) = inner.health_address(to) else {
        return Sent::Failed(Liveness::Silent("no health address".into()));
    };
    let answer = wire::dial(
        addr,
        &inner.secret,
        inner.rank,
        Purpose::Agree,
        inner.probe_timeout,
    )
    .and_then(|mut s| {
        wire::send(&mut s, message)?;
        wire::receive(&mut s)
    });
    match answer {
        Ok(Message::Accepted) => Sent::Delivered,
        Ok(Message::ExcludedYou(ex)) => Sent::ExcludedMe(ex),
        Ok(Message::Abandoned(why)) => Sent::Abandoned(why),
        Ok(other) => Sent::Failed(Liveness::Silent(format!("unexpected answer {other:?}"))),
        Err(_) => Sent::Failed(diagnose::query(inner, to).into()),
    }
}

impl super::Health {
    /// Whether the health channel runs (membership changes need it).
    pub(crate) fn enabled(&self) -> bool {
        self.address.is_some()
    }

    pub(crate) fn propose(&self, to: usize, proposal: &Proposal) -> Sent {
        send(&self.inner, to, &Message::Propose(proposal.clone()))
    }

    /// Send this rank's record in the communicator of `members` to `to`.
    pub(crate) fn send_address(&self, to: usize, members: &[u32], info: &[u8]) -> Sent {
        let message = Message::Address {
            members: members.to_vec(),
            info: info.to_vec(),
        };
        send(&self.inner, to, &message)
    }

    /// The proposals received since the last call.
    pub(crate) fn take_proposals(&self) -> Vec<Proposal> {
        let taken = std::mem::take(&mut self.inner.post.mailbox.lock().proposals);
        taken.into_values().collect()
    }

    /// `from`'s record for the communicator of `members`, if it has arrived.
    pub(crate) fn address_from(&self, from: u32, members: &[u32]) -> Option<Vec<u8>> {
        let mb = self.inner.post.mailbox.lock();
        mb.infos
            .get(&from)
            .filter(|(m, _)| m == members)
            .map(|(_, info)| info.clone())
    }

    /// The excluded set of this rank's agreement (ranks in it that write are told so).
    pub(crate) fn set_excluded(&self, excluded: Vec<u32>) {
        self.inner.post.mailbox.lock().excluded = Some(excluded);
    }

    /// This rank's shrink failed: ranks that write are told why.
    pub(crate) fn abandon(&self, why: String) {
        self.inner.post.mailbox.lock().abandoned = Some(why);
    }

    /// Ask `rank` directly whether it is there.
    pub(crate) fn liveness(&self, rank: usize) -> Liveness {
        diagnose::query(&self.inner, rank).into()
    }

    /// Wait until a membership message arrives, at most `timeout`.
    pub(crate) fn wait_mail(&self, timeout: Duration) {
        self.inner.post.wait(timeout);
    }

    /// The ranks the verdict in force names as dead or unresponsive.
    pub(crate) fn failed_ranks(&self) -> Vec<usize> {
        match self.verdict() {
            Some(v) if matches!(v.cause, super::Cause::Died | super::Cause::Unresponsive) => {
                v.ranks
            }
            _ => Vec::new(),
        }
    }
}
