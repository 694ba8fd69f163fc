//! Setting up the rings with each peer (see the module comment of [`super`]), sizing them to
//! the room in `/dev/shm`, and removing the names that dead processes left behind.

use super::ring::{self, Consumer, Identity, Producer};
use super::sys::{self, Segment};
use super::{Peer, ShmTransport, doorbell_name, ring_name};
use crate::error::TransportError;
use crate::transport::PeerAddress;
use std::collections::HashMap;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::time::{Duration, Instant};

const CREATOR_ROLE: &[u8] = b"bcl-shm-creator";
const PRODUCER_ROLE: &[u8] = b"bcl-shm-producer";
const NO_NONCE: [u8; 16] = [0; 16];
/// The data bytes of the rings one rank creates (one per same-host peer) together, at most.
/// Up to 16 ranks on a host keep the configured 4 MiB each; 64 ranks get 1 MiB. Without it the
/// rings of 64 ranks grew to half of a 24 GiB `/dev/shm`: 8 GiB of shared memory, 258 MiB
/// resident per rank, populated at init (28 s of it on this 2-core VM; `docs/scale.md`).
pub(super) const RINGS_PER_RANK: usize = 64 << 20;

/// The data bytes of each ring a rank with `peers` same-host peers creates: `wanted`, unless
/// the rank's rings would take more than [`RINGS_PER_RANK`] together, or every rank of the host
/// making as many rings would take more than half of the `free` bytes of `/dev/shm` (a
/// container's is often 64 MiB); then the largest power of two that fits both, down to 64 KiB
/// (below that the ring's creation fails with a clear error).
pub(super) fn ring_capacity(wanted: usize, peers: usize, free: Option<u64>) -> usize {
    const SMALLEST: usize = 64 << 10;
    let wanted = wanted.max(SMALLEST).next_power_of_two();
    let floor = |fits: u64| 1usize << (63 - fits.max(1).leading_zeros());
    let per_rank = floor((RINGS_PER_RANK / peers.max(1)) as u64);
    let on_host = free.map_or(usize::MAX, |free| {
        let rings_on_host = (peers * (peers + 1)).max(1) as u64;
        floor((free / 2 / rings_on_host).saturating_sub(ring::DATA as u64))
    });
    per_rank.min(on_host).clamp(SMALLEST, wanted)
}

/// Check a peer's address ("PID.NONCE", the nonce 16 hex digits) and return its pid.
fn parse_id(peer: usize, addr: &PeerAddress) -> Result<(String, u32), TransportError> {
    let bad = || TransportError::BadAddress {
        peer,
        reason: format!("{addr:?} is not a shm endpoint (pid.nonce)"),
    };
    let text = std::str::from_utf8(addr.as_bytes()).map_err(|_| bad())?;
    let (pid, nonce) = text.split_once('.').ok_or_else(bad)?;
    let pid: u32 = pid.parse().map_err(|_| bad())?;
    if nonce.len() != 16 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    Ok((text.to_string(), pid))
}

/// Whether this process can read `expected` at `addr` in process `pid`: refused (EPERM: another
/// user, or ptrace rules such as Yama's `ptrace_scope` 1), gone (ESRCH), unmapped (EFAULT) and
/// other bytes all say no.
pub(super) fn may_read(pid: u32, addr: u64, expected: &[u8; 32]) -> bool {
    let mut seen = [0u8; 32];
    sys::read_process(pid, addr, &mut seen).is_ok() && &seen == expected
}

/// Remove the ring names left in `/dev/shm` by endpoints whose process no longer exists (killed
/// during setup) and that belong to this user. Returns the names removed.
pub fn reclaim_stale() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    let uid = sys::effective_uid();
    let mut removed = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("bcl.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let mine = {
            use std::os::unix::fs::MetadataExt;
            entry.metadata().is_ok_and(|m| m.uid() == uid)
        };
        if mine && !sys::process_exists(pid) && sys::unlink(&format!("/{name}")).is_ok() {
            removed.push(name);
        }
    }
    if !removed.is_empty() {
        tracing::info!(
            ?removed,
            "removed shared-memory rings left by dead processes"
        );
    }
    removed
}

impl ShmTransport {
    /// Set up this rank's rings with every listed peer (see the module comment).
    pub(super) fn connect_rings(
        &mut self,
        local_rank: usize,
        peers: &[(usize, PeerAddress)],
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let secret = self.config.secret;
        let free = sys::free_bytes("/dev/shm");
        let capacity = ring_capacity(self.config.ring_bytes, peers.len(), free);
        let pid = std::process::id();
        let mut inbound = HashMap::new();
        let mut wanted = Vec::new();
        for (peer, addr) in peers {
            let (peer_id, peer_pid) = parse_id(*peer, addr)?;
            let name = ring_name(&self.id, *peer, local_rank);
            let seg = Segment::create(&name, ring::DATA + capacity).map_err(|source| {
                TransportError::Setup {
                    what: format!(
                        "creating shared-memory ring {name} ({} KiB) for rank {peer} ({} free \
                         in /dev/shm)",
                        (ring::DATA + capacity) >> 10,
                        free.map_or("unknown".into(), |f| format!("{} KiB", f >> 10))
                    ),
                    source,
                }
            })?;
            self.created.push(name.clone());
            let identity = Identity {
                producer_rank: *peer,
                consumer_rank: local_rank,
                consumer_pid: pid,
                proof: secret.prove(CREATOR_ROLE, &NO_NONCE, &NO_NONCE, name.as_bytes()),
            };
            ring::initialize(&seg, capacity, &identity);
            inbound.insert(*peer, (name, Consumer::new(seg, capacity)));
            wanted.push((*peer, peer_id, peer_pid));
        }
        let mut outbound: HashMap<usize, (Producer, Box<[u8; 32]>)> = HashMap::new();
        loop {
            for (peer, peer_id, _) in &wanted {
                if outbound.contains_key(peer) {
                    continue;
                }
                let name = ring_name(peer_id, local_rank, *peer);
                let io_error = |source| TransportError::Io {
                    op: "open shared-memory ring",
                    peer: *peer,
                    addr: name.clone(),
                    source,
                };
                let Some(seg) = Segment::open(&name).map_err(io_error)? else {
                    continue;
                };
                let handshake = |reason: String| TransportError::Handshake {
                    addr: format!("rank {peer}'s ring {name}"),
                    reason,
                };
                let Some((cap, id)) = ring::inspect(&seg).map_err(handshake)? else {
                    continue;
                };
                if id.producer_rank != local_rank
                    || id.consumer_rank != *peer
                    || !secret.verify(
                        &id.proof,
                        CREATOR_ROLE,
                        &NO_NONCE,
                        &NO_NONCE,
                        name.as_bytes(),
                    )
                {
                    return Err(handshake(format!(
                        "the ring (for rank {} -> rank {}) was not made by rank {peer} of this \
                         communicator",
                        id.producer_rank, id.consumer_rank
                    )));
                }
                // The proof also stays in this process's memory, where the consumer reads it
                // to find out whether it can copy straight from here (single copy).
                let proof =
                    Box::new(secret.prove(PRODUCER_ROLE, &NO_NONCE, &NO_NONCE, name.as_bytes()));
                let probe_addr = proof.as_ptr() as u64;
                let producer = Producer::attach(seg, cap, pid, &proof, probe_addr);
                outbound.insert(*peer, (producer, proof));
                // Both sides have it mapped once we are attached: the name may go.
                let _ = sys::unlink(&name);
            }
            let attached: Vec<usize> = inbound
                .iter()
                .filter(|(_, (_, c))| c.producer().is_some())
                .map(|(p, _)| *p)
                .collect();
            let missing: Vec<usize> = wanted
                .iter()
                .map(|(p, _, _)| *p)
                .filter(|p| !outbound.contains_key(p) || !attached.contains(p))
                .collect();
            if missing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                self.unlink_created();
                return Err(TransportError::ConnectTimeout {
                    rank: local_rank,
                    missing,
                });
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        for (peer, peer_id, peer_pid) in wanted {
            let (name, inp) = inbound
                .remove(&peer)
                .unwrap_or_else(|| unreachable!("every wanted peer has an inbound ring"));
            let (producer_pid, proof) = inp.producer().unwrap_or_default();
            if producer_pid != peer_pid
                || !secret.verify(&proof, PRODUCER_ROLE, &NO_NONCE, &NO_NONCE, name.as_bytes())
            {
                self.unlink_created();
                return Err(TransportError::Handshake {
                    addr: format!("ring {name}"),
                    reason: format!(
                        "its producer (pid {producer_pid}) is not rank {peer} (pid {peer_pid}) of \
                         this communicator"
                    ),
                });
            }
            let (out, probe) = outbound
                .remove(&peer)
                .unwrap_or_else(|| unreachable!("every wanted peer has an outbound ring"));
            // Can this rank read the peer's memory (same user, and ptrace rules that allow
            // it)? The peer lends to it (single copy) only if so.
            let borrows = may_read(peer_pid, inp.probe_addr(), &proof);
            inp.set_borrows(borrows);
            tracing::debug!(peer, borrows, "single copy from the peer's memory");
            let doorbell = SocketAddr::from_abstract_name(doorbell_name(&peer_id).as_bytes())
                .map_err(|source| TransportError::Setup {
                    what: format!("naming rank {peer}'s doorbell"),
                    source,
                })?;
            let pidfd = sys::pidfd_open(peer_pid).ok();
            if self.peers.len() <= peer {
                self.peers.resize_with(peer + 1, || None);
            }
            self.peers[peer] = Some(Peer {
                label: format!("shm endpoint {peer_id}"),
                pid: peer_pid,
                pidfd,
                doorbell,
                out,
                inp,
                pending: None,
                partial: Vec::new(),
                partial_tag: None,
                _probe: probe,
                next_loan: 1,
                lent: Vec::new(),
            });
        }
        self.unlink_created();
        Ok(())
    }
}
