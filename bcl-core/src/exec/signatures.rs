//! The signature exchange of one operation: before any data, each rank sends every peer it
//! sends to the operation's [`Signature`] and checks the one from every peer it receives from,
//! so that ranks that call different operations (a desync) find out on their first message.
//!
//! The signature travels under a tag that depends only on the sequence number
//! ([`SIGNATURE_TAG`]; plans number their messages from 0 up), so ranks that disagree still
//! meet on it. A first message of at most [`BUNDLE_MAX`] bytes rides inside the signature's
//! frame (signature, its own tag, its data: one frame and no extra syscall on the latency
//! path); a larger one follows in its own frame, which costs less than copying it.

use super::{ExecError, OpContext};
use crate::schedule::{Action, Plan};
use crate::signature::{SIGNATURE_BYTES, Signature};
use bcl_transport::{LoanId, Received, Transport};

/// The plan-local tag of every signature message.
pub(super) const SIGNATURE_TAG: u32 = u32::MAX;
/// The largest first message carried inside the signature message.
const BUNDLE_MAX: usize = 16 << 10;
/// Signature, then the carried message's tag.
const BUNDLE_HEADER: usize = SIGNATURE_BYTES + 4;

/// Per peer: the signature still has to be sent to it / received from it.
const TO_SEND: u8 = 1;
const AWAITED: u8 = 2;

/// Where the exchange stands with every peer; its vectors are reused between operations.
#[derive(Debug, Default)]
pub(super) struct SignatureExchange {
    /// `TO_SEND | AWAITED` bits per peer.
    state: Vec<u8>,
    /// The peers whose signature has not arrived (the operation is not done before they have).
    awaited: Vec<usize>,
    /// A small first message with the signature in front.
    bundle: Vec<u8>,
    /// Messages that arrived inside a signature message, waiting for their receive step:
    /// (peer, tag, message); at most one per peer.
    carried: Vec<(usize, u32, Received)>,
}

impl SignatureExchange {
    /// Start over for `plan`: a signature to every peer it sends to, one awaited from every
    /// peer it receives from.
    pub(super) fn reset(&mut self, plan: &Plan, world: usize) {
        self.state.clear();
        self.state.resize(world, 0);
        self.awaited.clear();
        self.carried.clear();
        for step in &plan.steps {
            let (peer, tag, bit) = match step.action {
                Action::Send { peer, tag, .. } => (peer, tag, TO_SEND),
                Action::Recv { peer, tag, .. } => (peer, tag, AWAITED),
                _ => continue,
            };
            debug_assert_ne!(tag, SIGNATURE_TAG, "a plan used the signature's tag");
            if bit == AWAITED && self.state[peer] & bit == 0 {
                self.awaited.push(peer);
            }
            self.state[peer] |= bit;
        }
    }

    /// Every awaited signature has arrived and matched.
    pub(super) fn complete(&self) -> bool {
        self.awaited.is_empty()
    }

    /// Send one message of the plan to `peer`, the signature in front of the first. Returns
    /// whether the transport took it (`false`: back-pressure, try again later).
    pub(super) fn send(
        &mut self,
        transport: &mut dyn Transport,
        ctx: &OpContext<'_>,
        peer: usize,
        tag: u32,
        bytes: &[u8],
    ) -> Result<bool, ExecError> {
        if self.state[peer] & TO_SEND == 0 {
            return Ok(transport.try_send(peer, ctx.tag(tag), bytes)?);
        }
        if bytes.len() <= BUNDLE_MAX {
            self.bundle.clear();
            self.bundle.extend_from_slice(&ctx.signature.encode());
            self.bundle.extend_from_slice(&tag.to_le_bytes());
            self.bundle.extend_from_slice(bytes);
            let sent = transport.try_send(peer, ctx.tag(SIGNATURE_TAG), &self.bundle)?;
            if sent {
                self.state[peer] &= !TO_SEND;
            }
            return Ok(sent);
        }
        if !self.signature_ahead(transport, ctx, peer)? {
            return Ok(false);
        }
        Ok(transport.try_send(peer, ctx.tag(tag), bytes)?)
    }

    /// Send one message of the plan whose `len` bytes `fill` writes into the transport's own
    /// memory (see `Transport::try_send_filled`). `Ok(None)`: not filled in place (the
    /// transport does not, or the message is small enough to ride with the signature): send
    /// it with [`SignatureExchange::send`].
    pub(super) fn send_filled(
        &mut self,
        transport: &mut dyn Transport,
        ctx: &OpContext<'_>,
        peer: usize,
        tag: u32,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<Option<bool>, ExecError> {
        if self.state[peer] & TO_SEND != 0 && len <= BUNDLE_MAX {
            return Ok(None);
        }
        if !self.signature_ahead(transport, ctx, peer)? {
            return Ok(Some(false));
        }
        Ok(transport.try_send_filled(peer, ctx.tag(tag), len, fill)?)
    }

    /// Send the signature on its own to `peer` if it has not gone yet. Returns whether the
    /// plan's messages may follow (`false`: back-pressure, try again later).
    fn signature_ahead(
        &mut self,
        transport: &mut dyn Transport,
        ctx: &OpContext<'_>,
        peer: usize,
    ) -> Result<bool, ExecError> {
        if self.state[peer] & TO_SEND != 0 {
            if !transport.try_send(peer, ctx.tag(SIGNATURE_TAG), &ctx.signature.encode())? {
                return Ok(false);
            }
            self.state[peer] &= !TO_SEND;
        }
        Ok(true)
    }

    /// Lend one message of the plan to `peer` (see `bcl_transport::Lend`), the signature
    /// sent ahead of the first. `Ok(None)`: not now, try again later.
    pub(super) fn lend(
        &mut self,
        transport: &mut dyn Transport,
        ctx: &OpContext<'_>,
        peer: usize,
        tag: u32,
        bytes: &[u8],
    ) -> Result<Option<LoanId>, ExecError> {
        if !self.signature_ahead(transport, ctx, peer)? {
            return Ok(None);
        }
        let lender = transport.lend().ok_or_else(|| {
            ExecError::Binding("a loan over a transport that does not lend".into())
        })?;
        Ok(lender.offer(peer, ctx.tag(tag), bytes)?)
    }

    /// Take and check the signature messages that have arrived; a mismatch is a desync
    /// naming the peer and what it runs. Returns whether any arrived.
    pub(super) fn receive(
        &mut self,
        transport: &mut dyn Transport,
        ctx: &OpContext<'_>,
    ) -> Result<bool, ExecError> {
        let mut moved = false;
        let mut k = 0;
        while k < self.awaited.len() {
            let peer = self.awaited[k];
            let Some(message) = transport.try_recv(peer, ctx.tag(SIGNATURE_TAG))? else {
                k += 1;
                continue;
            };
            let theirs = message
                .data
                .get(..SIGNATURE_BYTES)
                .and_then(Signature::decode);
            let carried = message
                .data
                .get(SIGNATURE_BYTES..BUNDLE_HEADER)
                .map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]));
            match theirs {
                Some(t) if ctx.signature.matches(ctx.rank, peer, &t) => {}
                theirs => {
                    transport.release(message);
                    return Err(ExecError::Desync { peer, theirs });
                }
            }
            match carried {
                Some(tag) => self.carried.push((peer, tag, message)),
                None => transport.release(message),
            }
            self.state[peer] &= !AWAITED;
            self.awaited.swap_remove(k);
            moved = true;
        }
        Ok(moved)
    }

    /// The message `tag` from `peer`, if it came inside a signature message.
    pub(super) fn take_carried(&mut self, peer: usize, tag: u32) -> Option<Received> {
        let at = self
            .carried
            .iter()
            .position(|(p, t, _)| *p == peer && *t == tag)?;
        Some(self.carried.swap_remove(at).2)
    }

    /// The payload of a carried message (behind the signature and the tag).
    pub(super) fn payload(message: &Received) -> &[u8] {
        message.data.get(BUNDLE_HEADER..).unwrap_or_default()
    }
}
