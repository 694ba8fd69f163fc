//! Connection setup for the rdma transport: one authenticated socket per pair of ranks (the
//! lower rank dials), over which the two swap their [`ConnectionRecord`]s, bring their queue
//! pairs to RTS, post their receive tokens and then say "ready", so no write can arrive before
//! its receiver is prepared.
//!
//! A rank that cannot make or bring up its end says so instead (memory it may not pin, say):
//! both ranks then refuse rdma for that pair alike, and `Routes` carries it over tcp.
//!
//! Every socket is written before any is read, in each phase: no two ranks can wait on each
//! other in a cycle, whatever order their peers are listed in.

use super::verbs::{QueuePair, Region};
use super::wire::{ConnectionRecord, RECORD_LEN};
use super::{RdmaTransport, WR_RECV, wr_id};
use crate::error::TransportError;
use crate::tcp::connect::{accept_all, dial, parse_addr};
use crate::transport::PeerAddress;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const AUTH_CONTEXT: &[u8] = b"bcl-rdma-setup-v1";
const READY: &[u8; 2] = b"RD";
const NOT_READY: &[u8; 2] = b"NO";
const MADE: u8 = b'R';
const REFUSED: u8 = b'X';

/// One peer's connected link.
pub(super) struct Link {
    pub qp: QueuePair,
    pub send_slots: Region,
    pub ring: Region,
    pub remote: ConnectionRecord,
    pub socket: TcpStream,
    pub addr: String,
}

/// The links made, and the peers with which the pair agreed to refuse rdma (and why).
pub(super) type Connected = (Vec<(usize, Link)>, Vec<(usize, String)>);

pub(super) fn connect_all(
    t: &RdmaTransport,
    local_rank: usize,
    peers: &[(usize, PeerAddress)],
    deadline: Instant,
) -> Result<Connected, TransportError> {
    let mut inbound = HashSet::new();
    let mut outbound = Vec::new();
    let mut addrs = Vec::new();
    for (peer, addr) in peers {
        let sa = parse_addr(*peer, addr, "an rdma setup address (ip:port)")?;
        addrs.push((*peer, sa));
        if *peer < local_rank {
            inbound.insert((*peer, 0));
        } else if *peer > local_rank {
            outbound.push((*peer, sa));
        }
    }
    let listener = t
        .listener
        .try_clone()
        .map_err(|source| TransportError::Setup {
            what: "cloning the rdma setup listener".into(),
            source,
        })?;
    let secret = t.config.secret;
    let acceptor = std::thread::spawn(move || {
        accept_all(
            &listener,
            secret,
            local_rank,
            inbound,
            deadline,
            AUTH_CONTEXT,
        )
    });
    let mut sockets = Vec::new();
    let mut dial_error = None;
    for (peer, sa) in outbound {
        match dial(
            sa,
            &secret,
            local_rank,
            peer,
            0,
            deadline,
            AUTH_CONTEXT,
            crate::tcp::connect::Congestion::System,
        ) {
            Ok(s) => sockets.push((peer, s)),
            Err(e) => {
                dial_error = Some(e);
                break;
            }
        }
    }
    let accepted = acceptor.join().map_err(|_| TransportError::Setup {
        what: "the rdma setup accept thread panicked".into(),
        source: std::io::Error::other("panic"),
    })?;
    if let Some(e) = dial_error {
        return Err(e);
    }
    sockets.extend(accepted?.into_iter().map(|(peer, _, s)| (peer, s)));
    sockets.sort_by_key(|(peer, _)| *peer);

    let slots = t.config.slots;
    let slot_bytes = t.config.slot_bytes();
    // Phase 1: resources and records out. A rank that cannot make its end (memory it may not
    // pin, no QP left) says so instead of a record: the pair then agrees to refuse the link.
    let mut half = Vec::new();
    for (peer, mut socket) in sockets {
        let addr = addrs
            .iter()
            .find(|(p, _)| *p == peer)
            .map(|(_, a)| a.to_string())
            .unwrap_or_default();
        let io = |op, source| TransportError::Io {
            op,
            peer,
            addr: addr.clone(),
            source,
        };
        let limit = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        socket
            .set_read_timeout(Some(limit))
            .and_then(|_| socket.set_write_timeout(Some(limit)))
            .map_err(|e| io("configure the setup socket", e))?;
        let made = make_end(t, slots, slot_bytes);
        let mut message = [0u8; 1 + RECORD_LEN];
        if let Ok((qp, ring, _)) = &made {
            message[0] = MADE;
            message[1..].copy_from_slice(
                &ConnectionRecord {
                    endpoint: t.device.endpoint(qp),
                    ring_addr: ring.addr(),
                    ring_rkey: ring.rkey(),
                    slots,
                    slot_bytes: slot_bytes as u32,
                }
                .encode(),
            );
        } else {
            message[0] = REFUSED;
        }
        socket
            .write_all(&message)
            .map_err(|e| io("send the rdma connection record", e))?;
        half.push((peer, socket, addr, made));
    }
    // Phase 2: records in, QPs to RTS, receive tokens posted, "ready" (or "refused") out.
    let mut ready = Vec::new();
    let mut refused = Vec::new();
    for (peer, mut socket, addr, made) in half {
        let io = |op, source| TransportError::Io {
            op,
            peer,
            addr: addr.clone(),
            source,
        };
        let mut message = [0u8; 1 + RECORD_LEN];
        socket
            .read_exact(&mut message)
            .map_err(|e| io("receive the rdma connection record", e))?;
        let remote = match message[0] {
            MADE => {
                let mut bytes = [0u8; RECORD_LEN];
                bytes.copy_from_slice(&message[1..]);
                Some(ConnectionRecord::decode(&bytes).map_err(|reason| {
                    TransportError::Protocol {
                        peer,
                        addr: addr.clone(),
                        reason: format!("bad rdma connection record: {reason}"),
                    }
                })?)
            }
            REFUSED => None,
            other => {
                return Err(TransportError::Protocol {
                    peer,
                    addr: addr.clone(),
                    reason: format!("rdma connection record of kind {other:#04x}"),
                });
            }
        };
        if let Some(remote) = &remote
            && (remote.slots != slots || remote.slot_bytes as usize != slot_bytes)
        {
            return Err(TransportError::Protocol {
                peer,
                addr: addr.clone(),
                reason: format!(
                    "its ring is {} slots of {} bytes, this rank's {slots} of {slot_bytes}: both must use the same rdma settings",
                    remote.slots, remote.slot_bytes
                ),
            });
        }
        let outcome = match (made, remote) {
            (Err(reason), _) => Err(reason),
            (Ok(_), None) => Err(format!(
                "rank {peer} could not set up its end of the link (its log says why)"
            )),
            (Ok((qp, ring, send_slots)), Some(remote)) => {
                bring_up(t, peer, &qp, &remote, slots).map(|()| (qp, ring, send_slots, remote))
            }
        };
        socket
            .write_all(if outcome.is_ok() { READY } else { NOT_READY })
            .map_err(|e| io("send rdma ready", e))?;
        match outcome {
            Ok(end) => ready.push((peer, socket, addr, end)),
            Err(reason) => refused.push((peer, reason)),
        }
    }
    // Phase 3: every peer ready, or it refused at the last step.
    let mut links = Vec::new();
    for (peer, mut socket, addr, (qp, ring, send_slots, remote)) in ready {
        let io = |op, source| TransportError::Io {
            op,
            peer,
            addr: addr.clone(),
            source,
        };
        let mut answer = [0u8; 2];
        socket
            .read_exact(&mut answer)
            .map_err(|e| io("receive rdma ready", e))?;
        if &answer == NOT_READY {
            refused.push((
                peer,
                format!("rank {peer} could not bring its end of the link up (its log says why)"),
            ));
            continue;
        }
        if &answer != READY {
            return Err(TransportError::Protocol {
                peer,
                addr: addr.clone(),
                reason: format!("expected rdma ready, got {answer:02x?}"),
            });
        }
        socket
            .set_nonblocking(true)
            .map_err(|e| io("configure the setup socket", e))?;
        links.push((
            peer,
            Link {
                qp,
                send_slots,
                ring,
                remote,
                socket,
                addr,
            },
        ));
    }
    Ok((links, refused))
}

/// This rank's end of one link: a QP, the ring the peer writes, the send slots.
fn make_end(
    t: &RdmaTransport,
    slots: u32,
    slot_bytes: usize,
) -> Result<(QueuePair, Region, Region), String> {
    let qp = t.device.create_qp(2 * slots, 2 * slots).map_err(|e| e.0)?;
    let ring_len = slots as usize * slot_bytes;
    let ring = t.device.register(ring_len, true).map_err(|e| e.0)?;
    let send_slots = t.device.register(ring_len, false).map_err(|e| e.0)?;
    Ok((qp, ring, send_slots))
}

/// INIT -> RTS towards `remote`, and the receive tokens posted.
fn bring_up(
    t: &RdmaTransport,
    peer: usize,
    qp: &QueuePair,
    remote: &ConnectionRecord,
    slots: u32,
) -> Result<(), String> {
    qp.connect(&remote.endpoint, t.config.ack_timeout, t.config.retries)
        .map_err(|e| e.0)?;
    for _ in 0..2 * slots {
        qp.post_recv(wr_id(peer, WR_RECV)).map_err(|e| e.0)?;
    }
    Ok(())
}
