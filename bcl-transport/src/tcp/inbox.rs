//! Whole frames waiting for their receiver, by peer and tag, in arrival order.

use crate::keys::KeyMap;
use crate::transport::Tag;
use std::collections::VecDeque;
use std::time::Duration;

/// A received payload and how long it took from its first byte to its last.
pub(super) type Arrived = (Vec<u8>, Duration);

/// Emptied queues kept for later keys.
const SPARE_QUEUES: usize = 64;

/// The arrived frames nobody has taken yet.
#[derive(Default)]
pub(super) struct Inbox {
    queues: KeyMap<(usize, Tag), VecDeque<Arrived>>,
    /// Queues whose key was emptied: every operation brings new tags, and a queue allocated
    /// for each would be an allocation per message in steady state.
    spare: Vec<VecDeque<Arrived>>,
}

impl Inbox {
    pub(super) fn push(&mut self, peer: usize, tag: Tag, arrived: Arrived) {
        let spare = &mut self.spare;
        self.queues
            .entry((peer, tag))
            .or_insert_with(|| spare.pop().unwrap_or_default())
            .push_back(arrived);
    }

    /// The oldest frame from `peer` under `tag`.
    pub(super) fn pop(&mut self, peer: usize, tag: Tag) -> Option<Arrived> {
        let queue = self.queues.get_mut(&(peer, tag))?;
        let arrived = queue.pop_front();
        if queue.is_empty()
            && let Some(emptied) = self.queues.remove(&(peer, tag))
            && self.spare.len() < SPARE_QUEUES
        {
            self.spare.push(emptied);
        }
        arrived
    }

    /// Whether a frame from `peer` waits here.
    pub(super) fn holds_from(&self, peer: usize) -> bool {
        self.queues.keys().any(|(from, _)| *from == peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_out_by_key_in_arrival_order_and_queues_are_reused() {
        let mut inbox = Inbox::default();
        let at = Duration::from_micros(1);
        inbox.push(1, 7, (vec![1], at));
        inbox.push(2, 7, (vec![2], at));
        inbox.push(1, 7, (vec![3], at));
        assert!(inbox.pop(1, 8).is_none());
        assert_eq!(inbox.pop(1, 7).map(|a| a.0), Some(vec![1]));
        assert_eq!(inbox.pop(1, 7).map(|a| a.0), Some(vec![3]));
        assert!(inbox.pop(1, 7).is_none());
        assert!(!inbox.holds_from(1) && inbox.holds_from(2));
        assert_eq!(inbox.spare.len(), 1, "the emptied queue is kept");
        let kept = inbox.spare[0].capacity();
        inbox.push(1, 9, (vec![4], at));
        assert!(inbox.spare.is_empty(), "a new key takes the kept queue");
        assert_eq!(inbox.queues[&(1, 9)].capacity(), kept);
    }
}
