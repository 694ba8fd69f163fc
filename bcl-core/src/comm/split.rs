//! `split`: ranks with the same color form a new communicator, ordered by key then old rank
//! (MPI_Comm_split, ncclCommSplit). No rendezvous store: the parent carries the exchange
//! (three allgathers of a few bytes per rank), and each child's secret is derived from the
//! parent's, so no new id travels.

use super::Communicator;
use super::child::decode_record;
use super::init::finish;
use crate::error::{Error, Result};
use std::time::Instant;

/// What a rank that could not open its endpoint sends instead of a record length.
const FAILED: u64 = u64::MAX;

impl Communicator {
    /// Split this communicator: every rank calls it (collective on this communicator); ranks
    /// passing the same `color` form a communicator, ranked by `key`, then by rank here; a
    /// rank passing `None` (`BCL_SPLIT_NOCOLOR`) takes part in no new communicator and gets
    /// `None`. The child has its own sequence numbers, health channel and flight recorder,
    /// this communicator's settings and device, and new connections (a child's connection
    /// cannot be confused with this one's). Split of a split works alike.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        let started = Instant::now();
        let deadline = started + self.config().init_timeout;
        let n = self.next_child();
        let me = self.rank();
        let mine = [color.map_or(-1, i64::from), i64::from(key)];
        let mut all = vec![0i64; 2 * self.world_size()];
        self.all_gather(&mine, &mut all)?;
        let mut group: Vec<(i64, usize)> = (0..self.world_size())
            .filter(|&r| color.is_some() && all[2 * r] == mine[0])
            .map(|r| (all[2 * r + 1], r))
            .collect();
        group.sort();
        let members: Vec<u32> = group.iter().map(|&(_, r)| r as u32).collect();
        let new_rank = members.iter().position(|&r| r as usize == me);
        // Open this rank's child endpoint (none without a color); a failure still takes part
        // in the exchange, so every rank hears of it instead of waiting.
        let opened = match (color, new_rank) {
            (Some(c), Some(rank)) => {
                let secret = self.child_secret(&format!("split:{n}:{c}"), &members);
                Some(self.open_child(secret, rank, &members).map(|o| (secret, o)))
            }
            _ => None,
        };
        let len = match &opened {
            Some(Ok((_, (_, _, record)))) => record.len() as u64,
            Some(Err(_)) => FAILED,
            None => 0,
        };
        let mut lens = vec![0u64; self.world_size()];
        self.all_gather(&[len], &mut lens)?;
        if let Some(bad) = members.iter().find(|&&r| lens[r as usize] == FAILED) {
            return Err(match opened {
                Some(Err(e)) => e,
                _ => Error::Bootstrap {
                    rank: me,
                    reason: format!("split: rank {bad} could not open its new endpoint"),
                },
            });
        }
        let slot = lens
            .iter()
            .filter(|&&l| l != FAILED)
            .max()
            .copied()
            .unwrap_or(0) as usize;
        let mut mine_bytes = vec![0u8; slot];
        if let Some(Ok((_, (_, _, record)))) = &opened {
            mine_bytes[..record.len()].copy_from_slice(record);
        }
        let mut records = vec![0u8; slot * self.world_size()];
        if slot > 0 {
            self.all_gather(&mine_bytes, &mut records)?;
        }
        let Some(Ok((secret, (config, opened, _)))) = opened else {
            return Ok(None);
        };
        let peers = members
            .iter()
            .enumerate()
            .map(|(new, &old)| {
                let at = old as usize * slot;
                let bytes = &records[at..at + lens[old as usize] as usize];
                decode_record(new, bytes, &format!("rank {old} of the parent"))
            })
            .collect::<Result<Vec<_>>>()?;
        finish(config, opened, secret, peers, started, deadline).map(Some)
    }
}
