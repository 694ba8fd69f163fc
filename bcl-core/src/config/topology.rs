//! The topology setting (`BCL_TOPOLOGY`): which ranks share a host, for clusters whose shape
//! the bootstrap cannot see and for tests that make one host look like several.
//!
//! Text forms: `HxL` (H hosts of L consecutive ranks: `2x4` is 0-3 and 4-7), or hosts
//! separated by `;`, each a list of ranks and ranges (`0-2;3`, `0,2;1,3`), or `@PATH`: the
//! same text read from a file (newlines separate hosts too). Every rank must be given the same.

use crate::error::{Error, Result};

/// A topology as set, before it meets the world size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologySpec {
    /// `hosts` hosts of `per_host` consecutive ranks.
    Grid { hosts: usize, per_host: usize },
    /// The ranks of each host.
    Hosts(Vec<Vec<usize>>),
}

/// Ranks beyond this in one topology text are refused (a typo, not a cluster).
const MOST_RANKS: usize = 1 << 20;

impl TopologySpec {
    /// Parse the text of `name` (the variable, for the error).
    pub fn parse(name: &str, text: &str) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("{name}='{text}': {why}"));
        let text_owned;
        let body = match text.trim().strip_prefix('@') {
            Some(path) => {
                text_owned = std::fs::read_to_string(path)
                    .map_err(|e| bad(format!("cannot read the topology file {path}: {e}")))?;
                text_owned.as_str()
            }
            None => text.trim(),
        };
        let number = |s: &str| -> Result<usize> {
            s.trim()
                .parse::<usize>()
                .map_err(|_| bad(format!("'{}' is not a rank number", s.trim())))
        };
        if let Some((h, l)) = body.split_once('x')
            && !body.contains([';', ',', '-', '\n'])
        {
            let (hosts, per_host) = (number(h)?, number(l)?);
            if hosts == 0 || per_host == 0 || hosts.saturating_mul(per_host) > MOST_RANKS {
                return Err(bad(format!(
                    "a grid needs 1 or more hosts of 1 or more ranks, at most {MOST_RANKS} in all"
                )));
            }
            return Ok(TopologySpec::Grid { hosts, per_host });
        }
        let mut hosts = Vec::new();
        let mut total = 0usize;
        for host in body
            .split([';', '\n'])
            .map(str::trim)
            .filter(|h| !h.is_empty())
        {
            let mut ranks = Vec::new();
            for item in host.split(',').map(str::trim) {
                let (lo, hi) = match item.split_once('-') {
                    Some((a, b)) => (number(a)?, number(b)?),
                    None => (number(item)?, number(item)?),
                };
                if hi < lo {
                    return Err(bad(format!("the range {item} runs backwards")));
                }
                total = total.saturating_add(hi - lo + 1);
                if total > MOST_RANKS {
                    return Err(bad(format!("more than {MOST_RANKS} ranks")));
                }
                ranks.extend(lo..=hi);
            }
            hosts.push(ranks);
        }
        if hosts.is_empty() {
            return Err(bad("no host is listed".into()));
        }
        Ok(TopologySpec::Hosts(hosts))
    }

    /// The ranks of each host for a world of `world` ranks; an error unless every rank of
    /// `0..world` is on exactly one host.
    pub fn hosts(&self, world: usize) -> Result<Vec<Vec<usize>>> {
        let hosts = match self {
            TopologySpec::Grid { hosts, per_host } => {
                if hosts * per_host != world {
                    return Err(Error::InvalidArgument(format!(
                        "the topology {hosts}x{per_host} has {} ranks but the world has {world}",
                        hosts * per_host
                    )));
                }
                (0..*hosts)
                    .map(|h| (h * per_host..(h + 1) * per_host).collect())
                    .collect()
            }
            TopologySpec::Hosts(hosts) => hosts.clone(),
        };
        let mut seen = vec![false; world];
        for &r in hosts.iter().flatten() {
            match seen.get_mut(r) {
                Some(s) if !*s => *s = true,
                Some(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "the topology {hosts:?} places rank {r} on two hosts"
                    )));
                }
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "the topology {hosts:?} names rank {r}, outside a world of {world}"
                    )));
                }
            }
        }
        if let Some(r) = seen.iter().position(|s| !s) {
            return Err(Error::InvalidArgument(format!(
                "the topology {hosts:?} places rank {r} on no host"
            )));
        }
        Ok(hosts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_lists_and_ranges() {
        let p = |t| TopologySpec::parse("BCL_TOPOLOGY", t);
        assert_eq!(
            p("2x4").and_then(|s| s.hosts(8)).ok(),
            Some(vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]])
        );
        assert_eq!(
            p(" 0-2 ; 3 ").and_then(|s| s.hosts(4)).ok(),
            Some(vec![vec![0, 1, 2], vec![3]])
        );
        assert_eq!(
            p("0,2;1,3").and_then(|s| s.hosts(4)).ok(),
            Some(vec![vec![0, 2], vec![1, 3]])
        );
    }

    #[test]
    fn every_mistake_is_named() {
        let err = |t: &str, world| match TopologySpec::parse("BCL_TOPOLOGY", t)
            .and_then(|s| s.hosts(world))
        {
            Err(e) => e.to_string(),
            Ok(h) => panic!("{t} was accepted: {h:?}"),
        };
        assert!(err("2x4", 6).contains("has 8 ranks but the world has 6"));
        assert!(err("0x4", 0).contains("a grid needs"));
        assert!(err("0-1;1", 2).contains("rank 1 on two hosts"));
        assert!(err("0;2", 3).contains("rank 1 on no host"));
        assert!(err("0-4", 3).contains("outside a world of 3"));
        assert!(err("3-1", 3).contains("runs backwards"));
        assert!(err("a;b", 2).contains("'a' is not a rank number"));
        assert!(err("0-99999999", 2).contains("more than"));
        assert!(err(" ; ", 2).contains("no host"));
        assert!(err("@/nonexistent/topology", 2).contains("cannot read the topology file"));
    }

    #[test]
    fn a_file_holds_one_host_per_line() {
        let dir = std::env::temp_dir().join(format!("bcl-topology-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("hosts");
        std::fs::write(&file, "0-1\n2\n").expect("write");
        let spec = TopologySpec::parse("BCL_TOPOLOGY", &format!("@{}", file.display()));
        assert_eq!(
            spec.and_then(|s| s.hosts(3)).ok(),
            Some(vec![vec![0, 1], vec![2]])
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
