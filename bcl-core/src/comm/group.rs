//! `create_group`: a communicator of some of this one's ranks, made by those ranks alone
//! (MPI_Comm_create_group; ncclCommSplit needs every rank of the parent). torch's new_group
//! calls its backend on the members only, so this is how its subgroups come from the world's
//! communicator without a store rendezvous. The members send their records to the first
//! member over this communicator's point-to-point links, and it sends the table back; the
//! child's secret is derived from this one's, the tag, the membership and how many groups of
//! that membership this rank has made, so no new id travels.

use super::Communicator;
use super::child::decode_record;
use super::init::finish;
use crate::error::{Error, Result};
use std::time::Instant;

/// What a member that could not open its endpoint sends instead of a record length.
const FAILED: u64 = u64::MAX;

impl Communicator {
    /// A communicator of `members` (ranks here; the new rank of each is its index), called by
    /// every member and by no other rank. Members must pass the same list and `tag`, and make
    /// groups of one membership in the same order; no point-to-point call between members may
    /// be outstanding on this communicator meanwhile. The child has this communicator's
    /// settings and device and new connections, as a split's has.
    pub fn create_group(&self, members: &[usize], tag: u32) -> Result<Communicator> {
        let started = Instant::now();
        let deadline = started + self.config().init_timeout;
        let me = self.rank();
        let world = self.world_size();
        let rank = check_members(members, me, world)?;
        let list: Vec<u32> = members.iter().map(|&r| r as u32).collect();
        let made = self.next_group(&list);
        let secret = self.child_secret(&format!("group:{tag}:{made}"), &list);
        // A member that fails to open still takes part, so the others hear of it.
        let opened = self.open_child(secret, rank, &list);
        let mine: &[u8] = match &opened {
            Ok((_, _, record)) => record,
            Err(_) => &[],
        };
        let len = if opened.is_ok() {
            mine.len() as u64
        } else {
            FAILED
        };
        let (lens, records) = self.exchange_records(members, len, mine)?;
        if let Some(bad) = lens.iter().position(|&l| l == FAILED) {
            return Err(match opened {
                Err(e) => e,
                Ok(_) => Error::Bootstrap {
                    rank: me,
                    reason: format!(
                        "create_group: rank {} could not open its new endpoint",
                        members[bad]
                    ),
                },
            });
        }
        let (config, opened, _) = opened?;
        let mut at = 0;
        let peers = lens
            .iter()
            .enumerate()
            .map(|(new, &l)| {
                let bytes = &records[at..at + l as usize];
                at += l as usize;
                decode_record(new, bytes, &format!("rank {} of the parent", members[new]))
            })
            .collect::<Result<Vec<_>>>()?;
        finish(config, opened, secret, peers, started, deadline)
    }

    /// Every member's record length and the records end to end: gathered by the first
    /// member, which sends both to the others (2(k-1) messages of a few hundred bytes).
    fn exchange_records(
        &self,
        members: &[usize],
        len: u64,
        mine: &[u8],
    ) -> Result<(Vec<u64>, Vec<u8>)> {
        let leader = members[0];
        let k = members.len();
        if self.rank() != leader {
            self.send(&[len], leader)?;
            if len != FAILED && len > 0 {
                self.send(mine, leader)?;
            }
            let mut lens = vec![0u64; k];
            self.recv(&mut lens, leader)?;
            let total = total_of(&lens, leader)?;
            let mut records = vec![0u8; total];
            if total > 0 {
                self.recv(&mut records, leader)?;
            }
            return Ok((lens, records));
        }
        let mut lens = vec![len];
        let mut records = if len == FAILED {
            Vec::new()
        } else {
            mine.to_vec()
        };
        for &m in &members[1..] {
            let mut l = [0u64];
            self.recv(&mut l, m)?;
            if l[0] != FAILED && l[0] > 0 {
                let size = usize::try_from(l[0])
                    .ok()
                    .filter(|&s| s <= MAX_RECORD)
                    .ok_or_else(|| Error::Bootstrap {
                        rank: self.rank(),
                        reason: format!(
                            "create_group: rank {m} announced a record of {} bytes",
                            l[0]
                        ),
                    })?;
                let mut rec = vec![0u8; size];
                self.recv(&mut rec, m)?;
                records.extend_from_slice(&rec);
            }
            lens.push(l[0]);
        }
        for &m in &members[1..] {
            self.send(&lens, m)?;
            if !records.is_empty() {
                self.send(&records, m)?;
            }
        }
        Ok((lens, records))
    }

    /// How many groups of `members` this rank had made before (the same on every member, as
    /// they make them in the same order).
    fn next_group(&self, members: &[u32]) -> u64 {
        let mut made = self.shared.lineage.groups.lock();
        let n = made.entry(members.to_vec()).or_insert(0);
        *n += 1;
        *n - 1
    }
}

/// A record is a rank's addresses and device: far below this.
const MAX_RECORD: usize = 1 << 20;

/// The new rank of `me` in `members`, which must be distinct ranks below `world`.
fn check_members(members: &[usize], me: usize, world: usize) -> Result<usize> {
    if members.is_empty() {
        return Err(Error::InvalidArgument(
            "create_group: the member list is empty".into(),
        ));
    }
    let mut seen = vec![false; world];
    for &r in members {
        if r >= world {
            return Err(Error::InvalidArgument(format!(
                "create_group: member {r} is not a rank of this communicator of {world}"
            )));
        }
        if std::mem::replace(&mut seen[r], true) {
            return Err(Error::InvalidArgument(format!(
                "create_group: rank {r} is listed twice"
            )));
        }
    }
    members.iter().position(|&r| r == me).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "create_group: rank {me} called it but is not among the members {members:?}"
        ))
    })
}

/// The records' total size, each length checked (a failed member sent none).
fn total_of(lens: &[u64], leader: usize) -> Result<usize> {
    let mut total = 0usize;
    for &l in lens {
        if l == FAILED {
            continue;
        }
        total = usize::try_from(l)
            .ok()
            .filter(|&l| l <= MAX_RECORD)
            .and_then(|l| total.checked_add(l))
            .ok_or_else(|| Error::Bootstrap {
                rank: leader,
                reason: format!("create_group: rank {leader} sent a record length of {l}"),
            })?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_checked() {
        assert_eq!(check_members(&[3, 1], 1, 4).expect("a member"), 1);
        assert!(matches!(
            check_members(&[], 0, 4),
            Err(Error::InvalidArgument(_))
        ));
        let e = check_members(&[1, 1], 1, 4)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("rank 1 is listed twice"), "{e}");
        let e = check_members(&[1, 9], 1, 4)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("member 9"), "{e}");
        let e = check_members(&[2, 3], 1, 4)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("rank 1 called it but is not among"), "{e}");
    }

    #[test]
    fn record_lengths_are_bounded() {
        assert_eq!(total_of(&[10, FAILED, 20], 0).expect("in bounds"), 30);
        assert!(total_of(&[u64::MAX - 1], 0).is_err());
        assert!(total_of(&[(MAX_RECORD + 1) as u64], 0).is_err());
    }
}
