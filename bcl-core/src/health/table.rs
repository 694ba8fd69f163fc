//! The rendezvous table handed down the gathering tree through the health port: a rank that
//! has the table serves it to its children ([`serve`]), and fetches it from its parent
//! ([`Health`]'s [`TableRelay`]). Rank 0's store then sends no table at all: with every rank
//! reading it there, rank 0 sent N² records (17.7 GB at 10k ranks, docs/scale.md).

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

/// Serve the table to `peer`, a child of this rank in the gathering tree, once this rank has
/// it (waiting up to `wait_ms`); anything else is refused by name.
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
    let table = {
        let mut table = inner.table.lock();
        while table.is_none() && !inner.table_ready.wait_until(&mut table, end).timed_out() {}
        table.clone()
    };
    let Some(table) = table else {
        let why = format!("rank {} had no table after {wait_ms} ms", inner.rank);
        return wire::send(stream, &Message::Abandoned(why));
    };
    let parts = table.chunks(TABLE_PART).count().max(1);
    for i in 0..parts {
        let bytes = table
            .get(i * TABLE_PART..((i + 1) * TABLE_PART).min(table.len()))
            .unwrap_or_default()
            .to_vec();
        wire::send(
            stream,
            &Message::TablePart {
                bytes,
                last: i + 1 == parts,
            },
        )?;
    }
    Ok(())
}

impl TableRelay for Health {
    fn offer(&self, table: Arc<Vec<u8>>) {
        *self.inner.table.lock() = Some(table);
        self.inner.table_ready.notify_all();
    }

    fn fetch(&self, parent: &RankInfo, world: usize, deadline: Instant) -> Result<Vec<u8>, String> {
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
