//! `grow`: a communicator takes in new ranks (a spare, or a restarted process), NCCL's
//! `ncclCommGetUniqueId` + `ncclCommGrow` contract: one existing rank (the root) makes an id
//! and hands it to the new processes out of band; the existing ranks call [`Communicator::grow`]
//! (the root with the id) and keep their ranks; the new ranks call
//! [`CommBuilder::join_grown`] with the id and a rank above the old ones. The root serves the
//! rendezvous store for the grown communicator, whose secret is the id's: nothing of the old
//! communicator can reach it.

use super::Communicator;
use super::init::CommBuilder;
use crate::config::TransportKind;
use crate::error::{Error, Result};
use crate::unique_id::UniqueId;
use bcl_backends::ReduceOp;
use bcl_transport::store::Store;
use std::sync::Arc;
use std::time::Instant;

/// The longest id text (`bcl://[v6 address]:port/32 hex`) sent from the root.
const ID_BYTES: usize = 128;

fn world_key(prefix: &str) -> String {
    format!("{prefix}/grow/world")
}

impl Communicator {
    /// A new id for growing this communicator (`bclCommGetUniqueId`): on this rank's bind
    /// address, with a fresh secret. Pass it to [`Communicator::grow`] on this rank (the
    /// root) and to the new processes.
    pub fn grow_unique_id(&self) -> Result<UniqueId> {
        UniqueId::new(self.config().bind_ip)
    }

    /// Grow to `n_ranks` (collective over this communicator's ranks; the new ranks call
    /// [`CommBuilder::join_grown`] meanwhile). Exactly one rank passes the id it made with
    /// [`Communicator::grow_unique_id`]; the others pass `None`. Existing ranks keep their
    /// ranks; the new communicator has this one's settings and devices.
    pub fn grow(&self, n_ranks: usize, id: Option<&UniqueId>) -> Result<Communicator> {
        let me = self.rank();
        let world = self.world_size();
        if n_ranks <= world {
            return Err(Error::InvalidArgument(format!(
                "grow: rank {me} asks for {n_ranks} ranks, but the communicator already has {world}"
            )));
        }
        // Every existing rank must ask for the same size, and exactly one must be the root.
        let n = n_ranks as i64;
        let mut agree = [n, -n, if id.is_some() { me as i64 } else { -1 }];
        self.all_reduce_in_place(&mut agree, ReduceOp::Max)?;
        let mut roots = [i64::from(id.is_some())];
        self.all_reduce_in_place(&mut roots, ReduceOp::Sum)?;
        if agree[0] != -agree[1] {
            return Err(Error::InvalidArgument(format!(
                "grow: the existing ranks ask for different sizes (between {} and {}); rank {me} asked for {n_ranks}",
                -agree[1], agree[0]
            )));
        }
        if roots[0] != 1 {
            return Err(Error::InvalidArgument(format!(
                "grow: {} existing ranks passed an id; exactly one (the root) must",
                roots[0]
            )));
        }
        let root = agree[2] as usize;
        let mut text = [0u8; ID_BYTES];
        if let Some(id) = id {
            let s = id.to_string();
            let len = s.len().min(ID_BYTES); // at most 70 bytes: `bcl://[v6]:port/32 hex`
            text[..len].copy_from_slice(&s.as_bytes()[..len]);
        }
        self.broadcast_in_place(&mut text, root)?;
        let end = text.iter().position(|&b| b == 0).unwrap_or(ID_BYTES);
        let id: UniqueId = String::from_utf8_lossy(&text[..end]).parse()?;
        // New processes cannot join an in-process fabric. A topology set for the old world
        // does not describe the new one: the grown communicator finds its hosts itself.
        let mut builder = self.builder_like_this(|| TransportKind::Auto)?;
        builder.config_mut().topology = None;
        builder.join_grown_as(me, n_ranks, &id, me == root)
    }
}

impl CommBuilder {
    /// Join a growing communicator as new rank `rank` of `n_ranks`, through the id its root
    /// handed out ([`Communicator::grow_unique_id`]).
    pub fn join_grown(self, rank: usize, n_ranks: usize, id: &UniqueId) -> Result<Communicator> {
        self.join_grown_as(rank, n_ranks, id, false)
    }

    fn join_grown_as(
        self,
        rank: usize,
        n_ranks: usize,
        id: &UniqueId,
        root: bool,
    ) -> Result<Communicator> {
        super::checks::check_rank(rank, n_ranks)?;
        let deadline = Instant::now() + self.config().init_timeout;
        let prefix = self.config().store_prefix.clone();
        let (server, store) = self.root_store(rank, id, root, vec![], "the grow's root")?;
        let key = world_key(&prefix);
        if root {
            store
                .set(&key, n_ranks.to_string().as_bytes())
                .map_err(|e| Error::Bootstrap {
                    rank,
                    reason: e.to_string(),
                })?;
        }
        let told = store
            .get(&key, deadline)
            .map_err(|e| Error::BootstrapTimeout {
                rank,
                missing: vec![],
                waited_s: self.config().init_timeout.as_secs_f64(),
                detail: format!("grow: waiting for the root to publish the size: {e}"),
            })?;
        let told = String::from_utf8_lossy(&told).to_string();
        if told != n_ranks.to_string() {
            return Err(Error::InvalidArgument(format!(
                "grow: rank {rank} was told the communicator grows to {n_ranks} ranks, but its \
                 root grows it to {told}"
            )));
        }
        let store: Arc<dyn Store> = Arc::new(store);
        let mut comm = self.join_store(rank, n_ranks, store, id.secret)?;
        comm._store_server = server;
        Ok(comm)
    }
}
