//! A verdict: the cross-rank explanation of a fault, in one line a person can act on. The
//! rank that diagnoses a fault writes it; every other rank receives the same text over the
//! health channel and fails its operations with it.

pub use crate::error::Cause;
use crate::peers::RankInfo;
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub cause: Cause,
    /// The ranks the verdict is about: the culprit, or both ends of a link, or both sides of
    /// a desync.
    pub ranks: Vec<usize>,
    pub detected_by: usize,
    /// The whole verdict as a person reads it.
    pub line: String,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)
    }
}

fn label(peers: &[RankInfo], rank: usize) -> String {
    peers
        .get(rank)
        .map_or_else(|| format!("rank {rank}"), |p| p.label().0)
}

/// "0-2,5": ranks as a compact list.
pub fn rank_list(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        let mut end = start;
        while i + 1 < ranks.len() && ranks[i + 1] == end + 1 {
            i += 1;
            end = ranks[i];
        }
        parts.push(if end > start + 1 {
            format!("{start}-{end}")
        } else if end == start + 1 {
            format!("{start},{end}")
        } else {
            format!("{start}")
        });
        i += 1;
    }
    parts.join(",")
}

impl Verdict {
    /// A verdict about `ranks` for `cause`; `what` says what was seen (for a desync, both
    /// signatures), `during` the operation in progress at the detector.
    pub fn new(
        cause: Cause,
        ranks: Vec<usize>,
        detected_by: usize,
        peers: &[RankInfo],
        what: &str,
        during: Option<&str>,
    ) -> Verdict {
        let first = ranks.first().copied().unwrap_or(detected_by);
        let second = ranks.get(1).copied().unwrap_or(detected_by);
        let mut line = match cause {
            Cause::Died => format!("{} died", label(peers, first)),
            Cause::Unresponsive => format!("{} is unresponsive", label(peers, first)),
            Cause::Aborted => format!("{} aborted the communicator", label(peers, first)),
            Cause::Revoked => format!("{} revoked the communicator", label(peers, first)),
            Cause::Unreachable => format!(
                "{} cannot reach {} and no other rank could check on it",
                label(peers, second),
                label(peers, first)
            ),
            Cause::LinkDown => format!(
                "link between {} and {} is down (both ranks alive)",
                label(peers, first),
                label(peers, second)
            ),
            Cause::Desync => format!(
                "desync between {} and {}",
                label(peers, first),
                label(peers, second)
            ),
        };
        if !what.is_empty() {
            line += &format!(" ({what})");
        }
        if let Some(op) = during {
            line += &format!(" during {op}");
        }
        let world = peers.len();
        let aborting: Vec<usize> = (0..world)
            .filter(|r| !(cause.names_the_culprits() && ranks.contains(r)))
            .collect();
        if aborting.len() == world && world > 0 {
            line += "; all ranks aborted";
        } else if !aborting.is_empty() {
            let noun = if aborting.len() == 1 { "rank" } else { "ranks" };
            line += &format!("; {noun} {} aborted", rank_list(&aborting));
        }
        line += &format!(" [detected by rank {detected_by}]");
        Verdict {
            cause,
            ranks,
            detected_by,
            line,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists_are_compact() {
        assert_eq!(rank_list(&[0, 1, 3]), "0,1,3");
        assert_eq!(rank_list(&[0, 1, 2, 3, 7, 9, 10, 11]), "0-3,7,9-11");
        assert_eq!(rank_list(&[]), "");
    }

    #[test]
    fn a_death_names_the_culprit_the_operation_and_the_survivors() {
        let v = Verdict::new(
            Cause::Died,
            vec![2],
            1,
            &[],
            "connection lost, port closed",
            Some("allreduce #57 (4 MiB)"),
        );
        assert_eq!(
            v.line,
            "rank 2 died (connection lost, port closed) during allreduce #57 (4 MiB) [detected by rank 1]"
        );
    }
}
