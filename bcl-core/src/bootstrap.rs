//! Rendezvous: every rank publishes its [`RankInfo`] in the store and learns everyone else's,
//! within the init deadline; a rank that never arrives is named.
//!
//! The store is served by one process (rank 0's for the tcp store), so what matters at scale
//! is what it answers. Reading every rank's key from every rank ([`Exchange::Star`], the first
//! design) costs it `N + N²` requests: 10⁸ at 10k ranks. [`Exchange::Tree`] gathers the
//! records up a `FANOUT`-ary tree of ranks (each rank reads its children's subtree keys and
//! publishes its own subtree's records) and rank 0 publishes the whole table once, in chunks,
//! for every other rank to read: about `4N` requests, but still `N²` records sent (each rank
//! needs every record: it connects to every peer). [`Exchange::Relay`], what a communicator
//! uses, hands the table back down the tree instead, each rank to its children through a
//! [`TableRelay`] (the health port), so that rank 0 sends it to `FANOUT` ranks
//! (docs/scale.md, `bcl-sim control`).

use crate::error::{Error, Result};
use crate::peers::RankInfo;
use bcl_transport::store::{Store, StoreError};
use std::time::Instant;

pub use crate::tree::FANOUT;
/// Records per table key: a chunk stays far below the tcp store's 16 MiB message limit
/// (a record is about 200 bytes).
pub const TABLE_CHUNK: usize = 4096;

/// How the ranks learn each other's records through the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exchange {
    /// Every rank reads every rank's key: `N + N²` requests to the store.
    Star,
    /// Gathered up a tree, the table published once by rank 0: about `4N` requests.
    Tree,
    /// Gathered up the tree, the table handed down it (each rank passes it to its children
    /// through a [`TableRelay`]): `4N` small requests, and rank 0's store sends no table.
    Relay,
}

/// How a rank hands the table to its children and gets it from its parent, outside the store
/// (the health port, for real; see `Health::offer_table`).
pub trait TableRelay: Sync {
    /// Hold `table` (the encoded records) for this rank's children to fetch.
    fn offer(&self, table: std::sync::Arc<Vec<u8>>);
    /// The table `parent` offers, waiting for it until `deadline`; the error says why not.
    fn fetch(
        &self,
        parent: &RankInfo,
        world: usize,
        deadline: Instant,
    ) -> std::result::Result<Vec<u8>, String>;
}

fn key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/rank/{rank}")
}

fn subtree_key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/tree/{rank}")
}

fn table_key(prefix: &str, chunk: usize) -> String {
    format!("{prefix}/table/{chunk}")
}

/// The children of `rank` in the gathering tree of `world` ranks (rank 0 at the root).
pub fn children(rank: usize, world: usize) -> impl Iterator<Item = usize> {
    crate::tree::children(rank, world, FANOUT)
}

/// Requests the store answers for one rendezvous of `world` ranks with `exchange`, when every
/// rank arrives: (sets, gets). The simulator's control-plane model uses these counts; a test
/// holds them to a store that counts what it is asked.
pub fn requests(exchange: Exchange, world: usize) -> (u64, u64) {
    requests_in(exchange, world, TABLE_CHUNK)
}

fn requests_in(exchange: Exchange, world: usize, chunk: usize) -> (u64, u64) {
    let n = world as u64;
    match exchange {
        Exchange::Star => (n, n * n),
        Exchange::Tree => {
            let chunks = world.div_ceil(chunk) as u64;
            // Own key per rank, a subtree key per rank but rank 0, the table's chunks once;
            // each subtree key read once by its parent, the table by every rank but rank 0.
            (2 * n - 1 + chunks, (n - 1) + (n - 1) * chunks)
        }
        // Each rank but rank 0 also reads its parent's own key (for its health port).
        Exchange::Relay => (2 * n - 1, 2 * (n - 1)),
    }
}

/// The bytes of `info` as the store holds it (0 where it cannot be encoded).
pub fn encoded_len(info: &RankInfo) -> usize {
    postcard::to_stdvec(info).map_or(0, |b| b.len())
}

/// Publish `me` and collect the infos of all `world` ranks, in rank order.
///
/// With a `relay` (every rank that runs a health port), the table goes down the tree through
/// it ([`Exchange::Relay`]); without, through the store ([`Exchange::Tree`]).
pub fn exchange(
    store: &dyn Store,
    relay: Option<&dyn TableRelay>,
    prefix: &str,
    me: &RankInfo,
    world: usize,
    started: Instant,
    deadline: Instant,
) -> Result<Vec<RankInfo>> {
    let how = if relay.is_some() {
        Exchange::Relay
    } else {
        Exchange::Tree
    };
    exchange_with(how, store, relay, prefix, me, world, started, deadline)
}

/// [`exchange`] with a chosen [`Exchange`] (the star stays for comparison: `bcl-bench
/// rendezvous`).
#[allow(clippy::too_many_arguments)]
pub fn exchange_with(
    how: Exchange,
    store: &dyn Store,
    relay: Option<&dyn TableRelay>,
    prefix: &str,
    me: &RankInfo,
    world: usize,
    started: Instant,
    deadline: Instant,
) -> Result<Vec<RankInfo>> {
    let step = Step {
        store,
        relay,
        prefix,
        rank: me.rank,
        world,
        chunk: TABLE_CHUNK,
        started,
        deadline,
    };
    step.exchange(how, me)
}

impl Step<'_> {
    fn exchange(&self, how: Exchange, me: &RankInfo) -> Result<Vec<RankInfo>> {
        let (step, store, prefix, world) = (self, self.store, self.prefix, self.world);
        // Every rank's own key, first: it is what names a rank that never arrives.
        let bytes =
            postcard::to_stdvec(me).map_err(|e| step.failed(format!("encoding rank info: {e}")))?;
        store
            .set(&key(prefix, me.rank), &bytes)
            .map_err(|e| step.failed(e.to_string()))?;
        let infos = match how {
            Exchange::Star => {
                let mut infos = Vec::with_capacity(world);
                for rank in 0..world {
                    let raw = step.get(&key(prefix, rank))?;
                    infos.push(step.decode::<RankInfo>(&raw, &format!("rank {rank}'s info"))?);
                }
                infos
            }
            Exchange::Tree => step.tree(me, false)?,
            Exchange::Relay => step.tree(me, true)?,
        };
        for (rank, info) in infos.iter().enumerate() {
            if info.rank != rank {
                return Err(step.failed(format!(
                    "the record at place {rank} of the rendezvous is rank {}'s",
                    info.rank
                )));
            }
        }
        if infos.len() != world {
            return Err(step.failed(format!(
                "the rendezvous gave {} records for {world} ranks",
                infos.len()
            )));
        }
        Ok(infos)
    }
}

/// One rank's rendezvous: what its requests share.
struct Step<'a> {
    store: &'a dyn Store,
    relay: Option<&'a dyn TableRelay>,
    prefix: &'a str,
    rank: usize,
    world: usize,
    /// Records per table key ([`TABLE_CHUNK`]; smaller in tests).
    chunk: usize,
    started: Instant,
    deadline: Instant,
}

impl Step<'_> {
    fn failed(&self, reason: String) -> Error {
        Error::Bootstrap {
            rank: self.rank,
            reason,
        }
    }

    fn decode<T: for<'de> serde::Deserialize<'de>>(&self, raw: &[u8], what: &str) -> Result<T> {
        postcard::from_bytes(raw).map_err(|e| self.failed(format!("{what} is not valid: {e}")))
    }

    /// The ranks whose own key is not in the store (yet).
    fn missing(&self) -> Vec<usize> {
        (0..self.world)
            .filter(|&r| !matches!(self.store.try_get(&key(self.prefix, r)), Ok(Some(_))))
            .collect()
    }

    /// The value of `key`, waiting until the deadline; past it, an error naming every rank
    /// whose own key is still missing (whichever key this rank was waiting for).
    fn get(&self, key_: &str) -> Result<Vec<u8>> {
        match self.store.get(key_, self.deadline) {
            Ok(raw) => Ok(raw),
            Err(StoreError::Timeout { store: name, .. }) => {
                let missing = self.missing();
                Err(Error::BootstrapTimeout {
                    rank: self.rank,
                    missing,
                    waited_s: self.started.elapsed().as_secs_f64(),
                    detail: format!("rendezvous through the {name} store (waiting for '{key_}')"),
                })
            }
            Err(e) => Err(self.failed(e.to_string())),
        }
    }

    /// Gather this rank's subtree, publish it; rank 0 publishes the table, the others read
    /// it. When `down`, a rank with a relay takes the table from its parent's and offers it
    /// to its children; rank 0 publishes it in the store too only if some rank runs no
    /// health port (`BCL_HEALTH=off` there), and such a rank, or a rank whose parent is one,
    /// reads the store's table.
    fn tree(&self, me: &RankInfo, down: bool) -> Result<Vec<RankInfo>> {
        let relay = if down { self.relay } else { None };
        let mut subtree = vec![me.clone()];
        for child in children(self.rank, self.world) {
            let raw = self.get(&subtree_key(self.prefix, child))?;
            let records: Vec<RankInfo> =
                self.decode(&raw, &format!("rank {child}'s subtree record"))?;
            subtree.extend(records);
        }
        if self.rank != 0 {
            let bytes = postcard::to_stdvec(&subtree)
                .map_err(|e| self.failed(format!("encoding the subtree record: {e}")))?;
            self.store
                .set(&subtree_key(self.prefix, self.rank), &bytes)
                .map_err(|e| self.failed(e.to_string()))?;
            if let Some(relay) = relay
                && let Some(table) = self.table_from_parent(relay)?
            {
                return Ok(table);
            }
            let table = self.store_table()?;
            if let Some(relay) = relay {
                let bytes = postcard::to_stdvec(&table)
                    .map_err(|e| self.failed(format!("encoding the table: {e}")))?;
                relay.offer(std::sync::Arc::new(bytes));
            }
            return Ok(table);
        }
        // The root: every record once, in rank order.
        let mut table: Vec<Option<RankInfo>> = vec![None; self.world];
        for info in subtree {
            let r = info.rank;
            match table.get_mut(r) {
                Some(slot @ None) => *slot = Some(info),
                Some(Some(_)) => {
                    return Err(self.failed(format!("rank {r}'s record came twice up the tree")));
                }
                None => {
                    return Err(self.failed(format!(
                        "a record names rank {r}, beyond the world of {}",
                        self.world
                    )));
                }
            }
        }
        let table: Vec<RankInfo> = table
            .into_iter()
            .enumerate()
            .map(|(r, info)| {
                info.ok_or_else(|| self.failed(format!("rank {r}'s record never came up the tree")))
            })
            .collect::<Result<_>>()?;
        if let Some(relay) = relay {
            let bytes = postcard::to_stdvec(&table)
                .map_err(|e| self.failed(format!("encoding the table: {e}")))?;
            relay.offer(std::sync::Arc::new(bytes));
            if table.iter().all(|r| r.health.is_some()) {
                return Ok(table);
            }
        }
        for (chunk, records) in table.chunks(self.chunk).enumerate() {
            let bytes = postcard::to_stdvec(records)
                .map_err(|e| self.failed(format!("encoding the table: {e}")))?;
            self.store
                .set(&table_key(self.prefix, chunk), &bytes)
                .map_err(|e| self.failed(e.to_string()))?;
        }
        Ok(table)
    }

    /// The table rank 0 published in the store.
    fn store_table(&self) -> Result<Vec<RankInfo>> {
        let mut table = Vec::with_capacity(self.world);
        for chunk in 0..self.world.div_ceil(self.chunk) {
            let raw = self.get(&table_key(self.prefix, chunk))?;
            let records: Vec<RankInfo> =
                self.decode(&raw, &format!("chunk {chunk} of rank 0's table"))?;
            table.extend(records);
        }
        Ok(table)
    }
}

impl Step<'_> {
    /// The table from this rank's parent (found through its own key), passed on to this
    /// rank's children; `None` when the parent runs no health port (the store's table then).
    /// Past the deadline, the ranks still missing are named as by [`Self::get`].
    fn table_from_parent(&self, relay: &dyn TableRelay) -> Result<Option<Vec<RankInfo>>> {
        let Some(parent) = crate::tree::parent(self.rank, FANOUT) else {
            return Err(self.failed("rank 0 has no parent to take the table from".into()));
        };
        let raw = self.get(&key(self.prefix, parent))?;
        let info: RankInfo = self.decode(&raw, &format!("rank {parent}'s info"))?;
        if info.health.is_none() {
            return Ok(None);
        }
        let bytes = match relay.fetch(&info, self.world, self.deadline) {
            Ok(bytes) => bytes,
            Err(why) => {
                let missing = self.missing();
                if !missing.is_empty() {
                    return Err(Error::BootstrapTimeout {
                        rank: self.rank,
                        missing,
                        waited_s: self.started.elapsed().as_secs_f64(),
                        detail: format!(
                            "rendezvous: the table from {} never came: {why}",
                            info.label()
                        ),
                    });
                }
                return Err(self.failed(format!(
                    "{} did not hand over the table: {why}",
                    info.label()
                )));
            }
        };
        let table: Vec<RankInfo> =
            self.decode(&bytes, &format!("the table {} handed over", info.label()))?;
        relay.offer(std::sync::Arc::new(bytes));
        Ok(Some(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcl_backends::{DeviceCapabilities, DeviceInfo, Vendor};
    use bcl_transport::store::MemoryStore;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// A memory store that counts what it is asked.
    #[derive(Debug, Default)]
    struct Counting {
        inner: MemoryStore,
        sets: AtomicU64,
        gets: AtomicU64,
    }

    impl Store for Counting {
        fn set(&self, key: &str, value: &[u8]) -> std::result::Result<(), StoreError> {
            self.sets.fetch_add(1, Ordering::Relaxed);
            self.inner.set(key, value)
        }
        fn get(&self, key: &str, deadline: Instant) -> std::result::Result<Vec<u8>, StoreError> {
            self.gets.fetch_add(1, Ordering::Relaxed);
            self.inner.get(key, deadline)
        }
        fn try_get(&self, key: &str) -> std::result::Result<Option<Vec<u8>>, StoreError> {
            self.gets.fetch_add(1, Ordering::Relaxed);
            self.inner.try_get(key)
        }
    }

    fn info(rank: usize) -> RankInfo {
        RankInfo {
            rank,
            hostname: format!("host{}", rank / 8),
            host_id: format!("id{}", rank / 8),
            pid: 1000 + rank as u32,
            nic: None,
            device: DeviceInfo {
                vendor: Vendor::Cpu,
                model: format!("model of {rank}"),
                index: (rank % 8) as u32,
                host_id: format!("id{}", rank / 8),
                capabilities: DeviceCapabilities {
                    host_addressable: true,
                    external_memory: false,
                    copy_gbps: None,
                    reduce_gbps: None,
                },
            },
            address: bcl_transport::PeerAddress::new(rank.to_le_bytes().to_vec()).expect("address"),
            health: Some(format!("10.0.0.{}:{}", rank % 250, 4000 + rank)),
        }
    }

    /// The tables the ranks of one test offer, by rank: a relay in memory.
    #[derive(Default)]
    struct Tables {
        offered: parking_lot::Mutex<std::collections::HashMap<usize, Arc<Vec<u8>>>>,
        changed: parking_lot::Condvar,
        fetches: AtomicU64,
    }

    struct MemoryRelay<'a> {
        me: usize,
        tables: &'a Tables,
    }

    impl TableRelay for MemoryRelay<'_> {
        fn offer(&self, table: Arc<Vec<u8>>) {
            self.tables.offered.lock().insert(self.me, table);
            self.tables.changed.notify_all();
        }
        fn fetch(
            &self,
            parent: &RankInfo,
            _world: usize,
            deadline: Instant,
        ) -> std::result::Result<Vec<u8>, String> {
            assert_eq!(
                crate::tree::parent(self.me, FANOUT),
                Some(parent.rank),
                "rank {} fetched from a rank not its parent",
                self.me
            );
            self.tables.fetches.fetch_add(1, Ordering::Relaxed);
            let mut offered = self.tables.offered.lock();
            loop {
                if let Some(t) = offered.get(&parent.rank) {
                    return Ok(t.as_ref().clone());
                }
                if self
                    .tables
                    .changed
                    .wait_until(&mut offered, deadline)
                    .timed_out()
                {
                    return Err(format!("rank {} offered nothing", parent.rank));
                }
            }
        }
    }

    /// Every rank of `ranks` runs the rendezvous of `world` on its own thread.
    fn run(
        how: Exchange,
        chunk: usize,
        store: &(dyn Store + Sync),
        world: usize,
        ranks: impl Iterator<Item = usize>,
        wait: Duration,
    ) -> Vec<(usize, Result<Vec<RankInfo>>)> {
        run_relayed(how, chunk, store, &Tables::default(), world, ranks, wait)
    }

    fn run_relayed(
        how: Exchange,
        chunk: usize,
        store: &(dyn Store + Sync),
        tables: &Tables,
        world: usize,
        ranks: impl Iterator<Item = usize>,
        wait: Duration,
    ) -> Vec<(usize, Result<Vec<RankInfo>>)> {
        let started = Instant::now();
        std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .map(|r| {
                    s.spawn(move || {
                        let relay = MemoryRelay { me: r, tables };
                        let step = Step {
                            store,
                            relay: Some(&relay),
                            prefix: "t",
                            rank: r,
                            world,
                            chunk,
                            started,
                            deadline: started + wait,
                        };
                        (r, step.exchange(how, &info(r)))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank thread"))
                .collect()
        })
    }

    #[test]
    fn both_exchanges_give_every_rank_every_record_in_order_and_ask_what_they_say() {
        // Tables of 64 records a chunk: 290 ranks take theirs in five.
        for world in [1, 2, 3, 17, 64, 65, 290] {
            for how in [Exchange::Star, Exchange::Tree, Exchange::Relay] {
                if how == Exchange::Star && world > 20 {
                    continue; // N² gets on a condvar: its count is held at the smaller sizes
                }
                let store = Counting::default();
                let tables = Tables::default();
                let wait = Duration::from_secs(60);
                for (r, got) in run_relayed(how, 64, &store, &tables, world, 0..world, wait) {
                    let got = got.unwrap_or_else(|e| panic!("{how:?} {world}: rank {r}: {e}"));
                    assert_eq!(got.len(), world, "{how:?} {world}: rank {r}");
                    for (i, g) in got.iter().enumerate() {
                        assert_eq!(g, &info(i), "{how:?} {world}: rank {r}, record {i}");
                    }
                }
                // The relay: every rank but rank 0 took the table from its parent.
                let fetched = tables.fetches.load(Ordering::Relaxed);
                let expected = if how == Exchange::Relay { world - 1 } else { 0 };
                assert_eq!(fetched, expected as u64, "{how:?} {world}: fetches");
                let asked = (store.sets.into_inner(), store.gets.into_inner());
                assert_eq!(
                    asked,
                    requests_in(how, world, 64),
                    "{how:?} {world}: (sets, gets)"
                );
            }
        }
    }

    #[test]
    fn ranks_without_a_health_port_take_the_store_s_table_beside_relayed_ones() {
        // Ranks 3, 10, 17, ... (rank 1's child 17 among them), then rank 0 too, run no
        // health port: no relay, and a record that says so.
        let world = 40;
        let offs: [&(dyn Fn(usize) -> bool + Sync); 2] = [&|r| r % 7 == 3, &|r| r % 7 == 0];
        for off in offs {
            let record = |r: usize| {
                let mut i = info(r);
                if off(r) {
                    i.health = None;
                }
                i
            };
            let (store, tables) = (MemoryStore::new(), Tables::default());
            let started = Instant::now();
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..world)
                    .map(|r| {
                        let (store, tables, record) = (&store, &tables, &record);
                        s.spawn(move || {
                            let relay = MemoryRelay { me: r, tables };
                            let relay: Option<&dyn TableRelay> =
                                if off(r) { None } else { Some(&relay) };
                            let step = Step {
                                store,
                                relay,
                                prefix: "t",
                                rank: r,
                                world,
                                chunk: 16,
                                started,
                                deadline: started + Duration::from_secs(30),
                            };
                            (r, step.exchange(Exchange::Relay, &record(r)))
                        })
                    })
                    .collect();
                for h in handles {
                    let (r, got) = h.join().expect("rank thread");
                    let got = got.unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    assert_eq!(got, (0..world).map(record).collect::<Vec<_>>(), "rank {r}");
                }
            });
        }
    }

    #[test]
    fn a_rank_that_never_comes_is_named_by_every_other_whether_leaf_or_inner() {
        // World 40: rank 1 is inner (children 17..=32), rank 35 a leaf under rank 2.
        for (missing, how) in [1, 35]
            .into_iter()
            .flat_map(|m| [(m, Exchange::Tree), (m, Exchange::Relay)])
        {
            let store = MemoryStore::new();
            let world = 40;
            let results = run(
                how,
                TABLE_CHUNK,
                &store,
                world,
                (0..world).filter(|&r| r != missing),
                Duration::from_millis(300),
            );
            for (r, got) in results {
                match got {
                    Err(Error::BootstrapTimeout {
                        rank, missing: m, ..
                    }) => {
                        assert_eq!((rank, m), (r, vec![missing]), "rank {r}");
                    }
                    other => panic!("rank {r}: expected a timeout naming {missing}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_garbled_subtree_record_is_named_by_the_parent() {
        // Rank 1's subtree key holds garbage, or a record of rank 0's, before rank 1 could
        // write it; rank 0 reads it.
        let twice = postcard::to_stdvec(&vec![info(1), info(0)]).expect("encode");
        for (value, named) in [
            (
                b"\xff\xff\xff".to_vec(),
                "rank 1's subtree record is not valid",
            ),
            (twice, "rank 0's record came twice"),
        ] {
            let store = MemoryStore::new();
            store.set("t/tree/1", &value).expect("set");
            let wait = Duration::from_secs(5);
            let results = run(
                Exchange::Tree,
                TABLE_CHUNK,
                &store,
                2,
                [0].into_iter(),
                wait,
            );
            match &results[0].1 {
                Err(Error::Bootstrap { rank: 0, reason }) => {
                    assert!(reason.contains(named), "{reason}");
                }
                other => panic!("expected rank 0 to say '{named}': {other:?}"),
            }
        }
    }
}
