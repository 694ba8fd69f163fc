//! The errors of one operation, each naming the ranks, hosts, devices and links involved:
//! a timeout names whom it waited for and what the health layer learned of them; a transport
//! or desync error becomes a verdict every rank shares.

use super::Shared;
use crate::error::Error;
use crate::exec::ExecError;
use crate::health::{Cause, Verdict};
use crate::peers::{PeerLabel, label_of};
use crate::signature::Signature;
use bcl_backends::DeviceError;
use std::time::Instant;

/// This rank's device refused something.
pub(super) fn device_error(shared: &Shared, source: DeviceError) -> Error {
    Error::Device {
        rank: shared.rank,
        device: shared.accelerator.info().to_string(),
        source,
    }
}

/// The error of an operation that ran out of time: whom it waited for (data from, room to send
/// to), and what the health layer found out about them.
pub(super) fn timeout_error(
    shared: &Shared,
    (receives, sends): (Vec<usize>, Vec<usize>),
    op: Signature,
    started: Instant,
) -> Error {
    let label = |rs: &[usize]| {
        rs.iter()
            .map(|r| label_of(&shared.peers, *r).0)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut waiting = Vec::new();
    if !receives.is_empty() {
        waiting.push(format!("data from {}", label(&receives)));
    }
    if !sends.is_empty() {
        waiting.push(format!("room to send to {}", label(&sends)));
    }
    waiting.extend(shared.health.notes());
    Error::Timeout {
        rank: shared.rank,
        local: label_of(&shared.peers, shared.rank),
        op: op.to_string(),
        waited_s: started.elapsed().as_secs_f64(),
        waiting_on: waiting.join("; "),
    }
}

/// The error of an operation failed by a verdict.
pub(super) fn fault_error(shared: &Shared, verdict: Option<Verdict>, op: Signature) -> Error {
    match verdict {
        Some(v) => Error::Fault {
            rank: shared.rank,
            op: op.to_string(),
            cause: v.cause,
            verdict: v.line,
        },
        None => Error::Internal("a fault was flagged without a verdict".into()),
    }
}

/// Turn an executor error into the operation's error; faults that concern other ranks are
/// diagnosed and become a verdict every rank shares.
pub(super) fn exec_error(shared: &Shared, e: ExecError, op: Signature) -> Error {
    let rank = shared.rank;
    let health = &shared.health;
    // A desync's description names both operations already.
    let verdict = |cause: Cause, ranks: Vec<usize>, what: String| {
        let during = (cause != Cause::Desync).then(|| op.to_string());
        health.report(Verdict::new(
            cause,
            ranks,
            rank,
            &shared.peers,
            &what,
            during.as_deref(),
        ))
    };
    match e {
        ExecError::Transport(t) => match t.peer() {
            Some(peer) => fault_error(shared, Some(health.link_failed(peer, &t.to_string())), op),
            None => Error::Link {
                rank,
                local: label_of(&shared.peers, rank),
                peer: PeerLabel("a peer".into()),
                op: op.to_string(),
                reason: t.to_string(),
            },
        },
        ExecError::Device(source) => {
            let error = device_error(shared, source);
            verdict(Cause::Aborted, vec![rank], error.to_string());
            error
        }
        ExecError::Desync { peer, theirs } => {
            let theirs = theirs.map_or_else(
                || "something that is not a signature".into(),
                |s| s.to_string(),
            );
            let v = verdict(
                Cause::Desync,
                vec![rank, peer],
                format!("rank {rank} called {op}, rank {peer} called {theirs}"),
            );
            fault_error(shared, Some(v), op)
        }
        ExecError::Mismatch {
            peer,
            got,
            expected,
        } => {
            verdict(
                Cause::Desync,
                vec![rank, peer],
                format!(
                    "rank {peer} sent {got} bytes where rank {rank} expected {expected} in {op}"
                ),
            );
            Error::Mismatch {
                rank,
                peer: label_of(&shared.peers, peer),
                op: op.to_string(),
                got,
                expected,
            }
        }
        ExecError::Binding(why) => Error::Internal(format!("{op}: {why}")),
    }
}

/// Poison the communicator with an operation's error, if it is one that does.
pub(super) fn poison_if_fatal(shared: &Shared, outcome: &Result<(), Error>) {
    if let Err(e) = outcome
        && e.poisons()
    {
        let mut p = shared.poison.lock();
        if p.is_none() {
            *p = Some(e.to_string());
        }
        // A verdict is logged once, by the health layer, when it is reached.
        if !matches!(e, Error::Fault { .. }) {
            tracing::error!(rank = shared.rank, error = %e, "collective failed; communicator poisoned");
        }
    }
}
