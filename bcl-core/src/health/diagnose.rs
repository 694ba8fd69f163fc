//! Telling a dead rank from a hung one from a broken link: ask the suspect directly, and at
//! the same time ask a witness to ask it.

use super::Inner;
use super::verdict::{Cause, Verdict};
use super::wire::{self, Message, Purpose, RankState, Seen};
use crate::signature::Signature;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// What made a peer suspect.
#[derive(Clone, Debug)]
pub(crate) enum Symptom {
    /// Its neighbour connection closed without a goodbye.
    ConnectionLost(String),
    /// No heartbeat for this long.
    Silent(Duration),
    /// The data path's link to it failed.
    DataLink(String),
    /// An operation has waited on it for a hang timeout.
    Stalled,
}

impl Symptom {
    fn describe(&self) -> String {
        match self {
            Symptom::ConnectionLost(why) => format!("its health connection broke: {why}"),
            Symptom::Silent(d) => format!("no heartbeat for {:.1} s", d.as_secs_f64()),
            Symptom::DataLink(why) => format!("data link failed: {why}"),
            Symptom::Stalled => "an operation waited on it".into(),
        }
    }
}

pub(crate) enum Diagnosis {
    /// The peer answered, in this state.
    Alive(RankState),
    Fault(Verdict),
}

/// Ask `target` directly for its state, within the probe timeout.
pub(crate) fn query(inner: &Inner, target: usize) -> Seen {
    let Some(addr) = inner.health_address(target) else {
        return Seen::NoAnswer("no health address".into());
    };
    let answer = wire::dial(
        addr,
        &inner.secret,
        inner.rank,
        Purpose::Query,
        inner.probe_timeout,
    )
    .and_then(|mut s| wire::receive(&mut s));
    match answer {
        Ok(Message::State(state)) => Seen::Alive(state),
        Ok(other) => Seen::NoAnswer(format!("unexpected answer {other:?}")),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::UnexpectedEof
            ) =>
        {
            Seen::Gone(e.to_string())
        }
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Seen::NoAnswer(format!(
                "no answer within {} ms",
                inner.probe_timeout.as_millis()
            ))
        }
        Err(e) => Seen::NoAnswer(e.to_string()),
    }
}

/// Ask `witness` to query `target`; `None` when the witness itself cannot be asked.
fn probe_via(inner: &Inner, witness: usize, target: usize) -> Option<Seen> {
    let addr = inner.health_address(witness)?;
    let mut stream = wire::dial(
        addr,
        &inner.secret,
        inner.rank,
        Purpose::Probe {
            target: target as u32,
        },
        inner.probe_timeout,
    )
    .ok()?;
    stream
        .set_read_timeout(Some(inner.probe_timeout * 3))
        .ok()?;
    match wire::receive(&mut stream).ok()? {
        Message::ProbeResult { seen, .. } => Some(seen),
        _ => None,
    }
}

/// A rank that can check on `suspect` for us, never this rank, the suspect, or a rank that
/// left: one on a third host first (a rank beside the suspect shares its network path, so
/// when the link between our hosts is down we could not ask it either), then one beside the
/// suspect, each time the suspect's ring neighbours first.
fn witness_for(inner: &Inner, suspect: usize) -> Option<usize> {
    let ring = inner.ring.get()?;
    let n = ring.len();
    let at = ring.iter().position(|&r| r == suspect)?;
    let host = |r: usize| inner.peers().get(r).map(|p| p.host_id.as_str());
    let third_host = |r: usize| host(r) != host(suspect) && host(r) != host(inner.rank);
    let candidates = || {
        (1..n)
            .flat_map(|d| [ring[(at + d) % n], ring[(at + n - d) % n]])
            .filter(|&r| r != inner.rank && r != suspect && !inner.is_departed(r))
    };
    candidates()
        .find(|&r| third_host(r))
        .or_else(|| candidates().next())
}

/// Find out what is wrong with `peer`.
pub(crate) fn diagnose(inner: &Arc<Inner>, peer: usize, symptom: Symptom) -> Diagnosis {
    let during = inner.current_op_text();
    let verdict = |cause: Cause, ranks: Vec<usize>, what: String| {
        Diagnosis::Fault(Verdict::new(
            cause,
            ranks,
            inner.rank,
            inner.peers(),
            &what,
            during.as_deref(),
        ))
    };
    let seen = symptom.describe();
    if inner.is_departed(peer) {
        return verdict(
            Cause::Died,
            vec![peer],
            format!("it destroyed its communicator while others still needed it; {seen}"),
        );
    }
    if !inner.config.enabled {
        return verdict(
            Cause::Unreachable,
            vec![peer, inner.rank],
            format!(
                "{seen}; the health channel is off, so a dead rank cannot be told from a broken link"
            ),
        );
    }
    // Ask a witness at the same time as the suspect: a hung suspect costs one probe timeout.
    let (tx, rx) = crossbeam::channel::bounded(1);
    if let Some(witness) = witness_for(inner, peer) {
        let inner2 = inner.clone();
        super::helpers::spawn_helper(inner, "probe", move || {
            let _ = tx.send((witness, probe_via(&inner2, witness, peer)));
        });
    } else {
        drop(tx);
    }
    match query(inner, peer) {
        Seen::Alive(state) => Diagnosis::Alive(state),
        Seen::Gone(why) => verdict(
            Cause::Died,
            vec![peer],
            format!("{seen}; its health port answers: {why}"),
        ),
        Seen::NoAnswer(mine) => match rx.recv_timeout(inner.probe_timeout * 4) {
            Ok((witness, Some(Seen::Alive(_)))) => verdict(
                Cause::LinkDown,
                vec![inner.rank, peer],
                format!(
                    "{seen}; rank {} gets {mine}, while rank {witness} reaches it",
                    inner.rank
                ),
            ),
            Ok((witness, Some(Seen::Gone(why)))) => verdict(
                Cause::Died,
                vec![peer],
                format!("{seen}; its health port answers rank {witness}: {why}"),
            ),
            Ok((witness, Some(Seen::NoAnswer(theirs)))) => verdict(
                Cause::Unresponsive,
                vec![peer],
                format!(
                    "{seen}; it answers neither rank {} ({mine}) nor rank {witness} ({theirs}): stopped or hung",
                    inner.rank
                ),
            ),
            Ok((_, None)) | Err(_) => verdict(
                Cause::Unreachable,
                vec![peer, inner.rank],
                format!("{seen}; {mine}"),
            ),
        },
    }
}

/// "rank 2 (host ...) is alive and has not called allreduce #57; its last completed
/// collective is #56".
pub(crate) fn describe_alive(
    inner: &Inner,
    peer: usize,
    state: &RankState,
    mine: &Signature,
) -> String {
    let label = inner
        .peers()
        .get(peer)
        .map_or_else(|| format!("rank {peer}"), |p| p.label().0);
    let behind =
        !mine.collective.is_point_to_point() && (state.started.wrapping_sub(mine.seq) as i32) < 0;
    if behind {
        return format!(
            "{label} is alive and has not called {} #{}; its last completed collective is #{}",
            mine.collective.name(),
            mine.seq,
            state.completed
        );
    }
    match &state.current {
        Some(op) if state.waiting_on.is_empty() => format!("{label} is alive, inside {op}"),
        Some(op) => format!(
            "{label} is alive, inside {op}, waiting on rank(s) {}",
            super::verdict::rank_list(
                &state
                    .waiting_on
                    .iter()
                    .map(|&r| r as usize)
                    .collect::<Vec<_>>()
            )
        ),
        None => format!(
            "{label} is alive and idle; its last completed collective is #{}",
            state.completed
        ),
    }
}
