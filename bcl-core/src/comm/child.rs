//! What every way of making a communicator from another one shares (split, shrink, grow):
//! the child's settings and providers taken from the parent, its secret derived from the
//! parent's and the child's membership, and the record a rank sends of itself.

use super::Communicator;
use super::init::{CommBuilder, Opened, open};
use crate::config::{TopologySpec, TransportKind};
use crate::error::{Error, Result};
use crate::peers::RankInfo;
use bcl_transport::Secret;
use bcl_transport::mem::MemFabric;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// The in-process fabrics of children being built, by the child's secret: the ranks of a
/// communicator of threads share one fabric, and each takes it from here (the last removes it).
static MEM_FABRICS: Mutex<BTreeMap<[u8; 16], (MemFabric, usize)>> = Mutex::new(BTreeMap::new());

fn mem_fabric(secret: &Secret, world: usize) -> MemFabric {
    let mut map = MEM_FABRICS.lock();
    let entry = map
        .entry(secret.0)
        .or_insert_with(|| (MemFabric::new(world), 0));
    entry.1 += 1;
    let fabric = entry.0.clone();
    if entry.1 >= world {
        map.remove(&secret.0);
    }
    fabric
}

impl Communicator {
    /// The next child's number: the same on every rank, as children are made collectively.
    pub(super) fn next_child(&self) -> u64 {
        self.shared.lineage.children.fetch_add(1, Ordering::AcqRel)
    }

    /// A child's secret: derived from this communicator's, what made it, and its members
    /// (old ranks), so that ranks that disagree on the membership cannot connect.
    pub(super) fn child_secret(&self, what: &str, members: &[u32]) -> Secret {
        let list: Vec<String> = members.iter().map(u32::to_string).collect();
        Secret::derive(&format!(
            "{}:{what}:{}",
            self.shared.lineage.secret.to_hex(),
            list.join(",")
        ))
    }

    /// A builder with this communicator's settings and device, and `in_process()` in place of
    /// an in-process transport (the others are opened anew from the settings); refused where
    /// the transport was passed in, as BCL cannot open another endpoint of it.
    pub(super) fn builder_like_this(
        &self,
        in_process: impl FnOnce() -> TransportKind,
    ) -> Result<CommBuilder> {
        if self.shared.lineage.custom_transport {
            return Err(Error::Unavailable(format!(
                "rank {}: this communicator's transport was passed in, and BCL cannot open \
                 another endpoint of it for a new communicator",
                self.rank()
            )));
        }
        let mut config = self.shared.config.clone();
        if let TransportKind::Mem(_) = config.transport {
            config.transport = in_process();
        }
        Ok(CommBuilder::new(config).accelerator(self.shared.accelerator.clone()))
    }

    /// A builder for a child of `world` ranks of this communicator's ranks: its settings and
    /// device; ranks that are threads of one process share the child's in-process fabric.
    pub(super) fn child_builder(&self, secret: &Secret, world: usize) -> Result<CommBuilder> {
        self.builder_like_this(|| TransportKind::Mem(mem_fabric(secret, world)))
    }

    /// Open the child's endpoint as `rank` of the child of `members` (this communicator's
    /// ranks, in the child's rank order): returns what to finish it with and the record to
    /// send the other members. A topology set on this communicator (`BCL_TOPOLOGY`) carries
    /// over as the members' hosts, in the child's ranks.
    pub(super) fn open_child(
        &self,
        secret: Secret,
        rank: usize,
        members: &[u32],
    ) -> Result<(crate::config::CommConfig, Opened, Vec<u8>)> {
        let builder = self.child_builder(&secret, members.len())?;
        let (mut config, opened) = open(rank, secret, builder)?;
        if config.topology.is_some() {
            config.topology = Some(TopologySpec::Hosts(member_hosts(self.hosts(), members)));
        }
        let record = postcard::to_stdvec(&opened.record(rank))
            .map_err(|e| Error::Internal(format!("encoding rank {rank}'s record: {e}")))?;
        Ok((config, opened, record))
    }
}

/// The hosts of a child of `members`: each host's members, by their rank in the child.
fn member_hosts(hosts: &[Vec<usize>], members: &[u32]) -> Vec<Vec<usize>> {
    (hosts.iter())
        .map(|ranks| {
            (members.iter().enumerate())
                .filter(|(_, m)| ranks.contains(&(**m as usize)))
                .map(|(child, _)| child)
                .collect::<Vec<usize>>()
        })
        .filter(|h| !h.is_empty())
        .collect()
}

/// Decode the record of the child's `rank`.
pub(super) fn decode_record(rank: usize, bytes: &[u8], from: &str) -> Result<RankInfo> {
    let info: RankInfo = postcard::from_bytes(bytes).map_err(|e| Error::Bootstrap {
        rank,
        reason: format!("{from} sent a record that is not valid: {e}"),
    })?;
    if info.rank != rank {
        return Err(Error::Bootstrap {
            rank,
            reason: format!(
                "{from} sent the record of rank {} as rank {rank}'s",
                info.rank
            ),
        });
    }
    Ok(info)
}
