//! The rendezvous table handed down the gathering tree through the health port: a rank that
//! has the table serves it to its children ([`serve`]), and fetches it from its parent
//! ([`Health`]'s [`TableRelay`]). Rank 0's store then sends no table at all: with every rank
//! reading it there, rank 0 sent N² records (17.7 GB at 10k ranks, docs/scale.md).
//!
//! A rank passes each part on as it comes, before the rest has: the levels of the tree
//! overlap, so the table reaches the leaves in about the time of one level, not one per
//! level (a 100k-rank table, 20 MB, crosses 5 levels of 16).

use super::Health;
use super::state::Inner;
use super::wire::{self, Message, Purpose, TABLE_PART};
use crate::bootstrap::{FANOUT, TableRelay};
use crate::peers::RankInfo;
use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a rank waits, serving a child, for its own table to come.
const LONGEST_WAIT: Duration = Duration::from_secs(3600);
/// Bytes a table may take per rank (a record is about 200).
const BYTES_PER_RANK: usize = 16 << 10;

/// How much of the table this rank has to hand on.
#[derive(Debug)]
pub(crate) enum Relayed {
    Nothing,
    /// The first bytes, from its parent; more to come.
    Arriving(Vec<u8>),
    /// All of it.
    Whole(Arc<Vec<u8>>),
    /// Its own fetch failed: why, for its children.
    Failed(String),
}

impl Relayed {
    /// The bytes from `from` on that may be sent now, and whether they end the table:
    /// whole parts while it arrives, the rest once it is whole; `None`: wait.
    fn ready(&self, from: usize) -> Option<(Vec<u8>, bool)> {
        let (bytes, whole) = match self {
            Relayed::Arriving(b) => (b.as_slice(), false),
            Relayed::Whole(b) => (b.as_slice(), true),
            Relayed::Nothing | Relayed::Failed(_) => return None,
        };
        let rest = bytes.get(from..).unwrap_or_default();
        let take = if whole || rest.len() >= TABLE_PART {
            rest.len().min(TABLE_PART)
        } else {
            return None;
        };
        Some((rest[..take].to_vec(), whole && take == rest.len()))
    }
}

/// Serve the table to `peer`, a child of this rank in the gathering tree, part by part as
/// this rank gets it (waiting up to `wait_ms` in all); anything else is refused by name.
pub(super) fn serve(
    inner: &Arc<Inner>,
    stream: &mut TcpStream,
    peer: usize,
    wait_ms: u64,
) -> io::Result<()> {
    if crate::tree::parent(peer, FANOUT) != Some(inner.rank) {
        let why = format!(
            "rank {peer} asked rank {} for the table, which is not its parent",
            inner.rank
        );
        wire::send(stream, &Message::Abandoned(why.clone()))?;
        return Err(io::Error::new(io::ErrorKind::InvalidData, why));
    }
    let end = Instant::now() + Duration::from_millis(wait_ms).min(LONGEST_WAIT);
    let mut sent = 0;
    loop {
        let next = {
            let mut table = inner.table.lock();
            loop {
                if let Relayed::Failed(why) = &*table {
                    break Err(format!(
                        "rank {} could not get the table itself: {why}",
                        inner.rank
                    ));
                }
                if let Some(part) = table.ready(sent) {
                    break Ok(part);
                }
                if inner.table_ready.wait_until(&mut table, end).timed_out() {
                    break Err(match &*table {
                        Relayed::Nothing => {
                            format!("rank {} had no table after {wait_ms} ms", inner.rank)
                        }
                        _ => format!(
                            "rank {} had {sent} bytes of the table after {wait_ms} ms",
                            inner.rank
                        ),
                    });
                }
            }
        };
        let (bytes, last) = match next {
            Ok(part) => part,
            Err(why) => return wire::send(stream, &Message::Abandoned(why)),
        };
        sent += bytes.len();
        wire::send(stream, &Message::TablePart { bytes, last })?;
        if last {
            return Ok(());
        }
    }
}

impl Health {
    /// Set what this rank hands on, and wake the children waiting for it.
    fn relay(&self, state: Relayed) {
        *self.inner.table.lock() = state;
        self.inner.table_ready.notify_all();
    }
}

impl TableRelay for Health {
    fn offer(&self, table: Arc<Vec<u8>>) {
        self.relay(Relayed::Whole(table));
    }

    fn fetch(&self, parent: &RankInfo, world: usize, deadline: Instant) -> Result<Vec<u8>, String> {
        let fetched = self.fetch_passing_on(parent, world, deadline);
        match &fetched {
            Ok(table) => self.relay(Relayed::Whole(Arc::new(table.clone()))),
            Err(why) => self.relay(Relayed::Failed(format!("from {}: {why}", parent.label()))),
        }
        fetched
    }
}

impl Health {
    /// [`TableRelay::fetch`], each part handed on to this rank's children as it comes.
    fn fetch_passing_on(
        &self,
        parent: &RankInfo,
        world: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, String> {
        let inner = &self.inner;
        let addr = parent
            .health
            .as_deref()
            .ok_or("it runs no health port (BCL_HEALTH=off there, on here?)")?
            .parse()
            .map_err(|e| format!("its health address is not valid: {e}"))?;
        // Dialled again until the deadline: on a crowded host a handshake can outlast one
        // probe's time.
        let (mut s, wait) = loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            let purpose = Purpose::Table {
                wait_ms: wait.as_millis() as u64,
            };
            match wire::dial(
                addr,
                &inner.secret,
                inner.rank,
                purpose,
                inner.probe_timeout,
            ) {
                Ok(s) => break (s, wait),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("cannot reach its health port at {addr}: {e}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        s.set_read_timeout(Some(wait + inner.probe_timeout * 2))
            .map_err(|e| e.to_string())?;
        let bound = world.saturating_mul(BYTES_PER_RANK);
        let mut table = Vec::new();
        loop {
            match wire::receive(&mut s).map_err(|e| format!("reading the table: {e}"))? {
                Message::TablePart { bytes, last } => {
                    if table.len() + bytes.len() > bound {
                        return Err(format!("its table exceeds {bound} bytes for {world} ranks"));
                    }
                    table.extend_from_slice(&bytes);
                    if last {
                        return Ok(table);
                    }
                    {
                        let mut passed = inner.table.lock();
                        match &mut *passed {
                            Relayed::Arriving(b) => b.extend_from_slice(&bytes),
                            other => *other = Relayed::Arriving(table.clone()),
                        }
                    }
                    inner.table_ready.notify_all();
                }
                Message::Abandoned(why) => return Err(why),
                other => return Err(format!("it answered {other:?} instead of the table")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HealthConfig;
    use bcl_transport::Secret;

    fn start(rank: usize) -> Health {
        Health::start(
            rank,
            Secret([3; 16]),
            "127.0.0.1".parse().expect("ip"),
            HealthConfig::default(),
        )
        .expect("start")
    }

    fn record(h: &Health) -> RankInfo {
        RankInfo::for_tests(h.rank(), h.address().map(|a| a.to_string()))
    }

    #[test]
    fn a_child_gets_its_parent_s_table_in_parts_once_offered() {
        let (parent, child) = (start(0), start(1));
        // 150 KB: four parts.
        let table: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        let got = std::thread::scope(|s| {
            let fetching = s.spawn(|| child.fetch(&record(&parent), 64, deadline));
            std::thread::sleep(Duration::from_millis(200));
            parent.offer(Arc::new(table.clone()));
            fetching.join().expect("fetch thread")
        });
        assert_eq!(got.expect("the table"), table);
    }

    #[test]
    fn each_part_goes_on_down_the_tree_before_the_rest_has_come() {
        // Rank 0 -> its child 1 -> rank 1's child (the first rank below it in the tree).
        let grandchild_rank = crate::tree::children(1, usize::MAX, FANOUT)
            .next()
            .expect("rank 1 has children");
        let (root, child, grandchild) = (start(0), start(1), start(grandchild_rank));
        let table: Vec<u8> = (0..5 * TABLE_PART as u32)
            .map(|i| (i % 253) as u8)
            .collect();
        let head = &table[..2 * TABLE_PART + 100];
        root.relay(Relayed::Arriving(head.to_vec()));
        let deadline = Instant::now() + Duration::from_secs(20);
        let has = |h: &Health| match &*h.inner.table.lock() {
            Relayed::Arriving(b) => b.len(),
            _ => 0,
        };
        std::thread::scope(|s| {
            let fetching = [
                s.spawn(|| child.fetch(&record(&root), 64, deadline)),
                s.spawn(|| grandchild.fetch(&record(&child), 64, deadline)),
            ];
            // The two whole parts rank 0 has reach the grandchild while rank 0 still waits
            // for the rest (the 100 bytes after them wait for a whole part or the end).
            let until = Instant::now() + Duration::from_secs(10);
            while has(&grandchild) < 2 * TABLE_PART && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(has(&grandchild), 2 * TABLE_PART);
            assert_eq!(has(&child), 2 * TABLE_PART);
            root.offer(Arc::new(table.clone()));
            for f in fetching {
                assert_eq!(f.join().expect("fetch thread").expect("the table"), table);
            }
        });
        assert!(matches!(&*grandchild.inner.table.lock(), Relayed::Whole(t) if **t == table));
    }

    #[test]
    fn a_parent_whose_own_fetch_fails_tells_its_children_why() {
        let grandchild_rank = crate::tree::children(1, usize::MAX, FANOUT)
            .next()
            .expect("rank 1 has children");
        let (root, child, grandchild) = (start(0), start(1), start(grandchild_rank));
        root.relay(Relayed::Arriving(vec![7; TABLE_PART + 1]));
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mine, theirs) = std::thread::scope(|s| {
            let fetching = [
                s.spawn(|| child.fetch(&record(&root), 64, deadline)),
                s.spawn(|| grandchild.fetch(&record(&child), 64, deadline)),
            ];
            std::thread::sleep(Duration::from_millis(300));
            root.relay(Relayed::Failed("the store went away".into()));
            let [a, b] = fetching.map(|f| f.join().expect("fetch thread"));
            (a.expect_err("rank 0 failed"), b.expect_err("rank 1 failed"))
        });
        let cause = "rank 0 could not get the table itself: the store went away";
        assert!(mine.contains(cause), "{mine}");
        assert!(
            theirs.contains("rank 1 could not get the table itself"),
            "{theirs}"
        );
        assert!(theirs.contains(cause), "{theirs}");
    }

    #[test]
    fn a_rank_that_is_not_a_child_or_comes_too_early_is_told_why() {
        let (parent, stranger, child) = (start(0), start(17), start(2));
        parent.offer(Arc::new(vec![1, 2, 3]));
        let soon = Instant::now() + Duration::from_secs(5);
        let err = stranger
            .fetch(&record(&parent), 64, soon)
            .expect_err("not a child");
        assert!(
            err.contains("rank 17 asked rank 0 for the table, which is not its parent"),
            "{err}"
        );
        // Rank 2's parent, rank 0 of another job here, has nothing yet: the wait ends.
        let empty = start(0);
        let err = child
            .fetch(
                &record(&empty),
                64,
                Instant::now() + Duration::from_millis(300),
            )
            .expect_err("no table");
        assert!(err.contains("rank 0 had no table after"), "{err}");
        // A table larger than the world can have is refused.
        let big = start(0);
        big.offer(Arc::new(vec![0; 3 * BYTES_PER_RANK]));
        let err = child.fetch(&record(&big), 2, soon).expect_err("too big");
        assert!(err.contains("exceeds"), "{err}");
        // A parent that runs no health port.
        let mut off = record(&parent);
        off.health = None;
        let err = child.fetch(&off, 64, soon).expect_err("no port");
        assert!(err.contains("runs no health port"), "{err}");
    }
}
