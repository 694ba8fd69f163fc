//! Messages between their last byte leaving and their delivery, handed out in the order they
//! arrive: by time, and in the order they were sent where times are equal.
//!
//! A message arrives α after it was sent, and α takes a few values only (one per kind of link:
//! inside a host, between hosts, per vendor), so messages with the same α arrive in the order
//! they were sent (virtual time never goes back). One queue per α, and the next arrival is the
//! earliest of the queues' heads: the order a heap of (time, sequence) gives, at O(kinds of
//! link) a message instead of O(log n) swaps over the hundreds of thousands in flight at 100k
//! ranks.

use std::collections::VecDeque;

/// One message in flight: when it arrives, its place in send order, what it is.
type Flight<T> = (f64, u64, T);

#[derive(Debug)]
pub struct Deliveries<T> {
    /// Per α (as bits): the messages sent with it, in send order.
    queues: Vec<(u64, VecDeque<Flight<T>>)>,
    seq: u64,
}

impl<T> Default for Deliveries<T> {
    fn default() -> Self {
        Deliveries {
            queues: Vec::new(),
            seq: 0,
        }
    }
}

impl<T: Copy> Deliveries<T> {
    /// `item`, sent at `now`, arrives `alpha` seconds later. `now` must not be earlier than
    /// that of any message pushed before (virtual time).
    pub fn push(&mut self, now: f64, alpha: f64, item: T) {
        self.seq += 1;
        let flight = (now + alpha, self.seq, item);
        let key = alpha.to_bits();
        match self.queues.iter_mut().find(|(a, _)| *a == key) {
            Some((_, q)) => {
                debug_assert!(q.back().is_none_or(|b| b.0 <= flight.0), "time went back");
                q.push_back(flight);
            }
            None => self.queues.push((key, VecDeque::from([flight]))),
        }
    }

    /// The queue whose head arrives first (ties: the one sent first).
    fn first(&self) -> Option<usize> {
        (self.queues.iter().enumerate())
            .filter_map(|(i, (_, q))| q.front().map(|&(t, s, _)| (t, s, i)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, _, i)| i)
    }

    /// When the next message arrives.
    pub fn next_time(&self) -> Option<f64> {
        self.first()
            .and_then(|i| self.queues[i].1.front().map(|f| f.0))
    }

    /// The next message to arrive, if it arrives by `now`.
    pub fn pop_due(&mut self, now: f64) -> Option<T> {
        let first = self.first()?;
        let q = &mut self.queues[first].1;
        match q.front() {
            Some(&(t, _, item)) if t <= now => {
                q.pop_front();
                Some(item)
            }
            _ => None,
        }
    }

    pub fn len(&self) -> usize {
        self.queues.iter().map(|(_, q)| q.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.iter().all(|(_, q)| q.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    /// Against a heap of (time, sequence), the order it replaces: random α from a few values,
    /// equal times included, time moving on by random steps (zero among them).
    #[test]
    fn arrivals_come_out_as_a_heap_of_time_then_send_order_gives_them() {
        let mut next = crate::xorshift::below(0x9e37_79b9_7f4a_7c15);
        let alphas = [3e-6, 8e-6, 3e-6 + 5e-6, 0.0];
        let mut d = Deliveries::default();
        let mut heap = BinaryHeap::new();
        let (mut now, mut seq) = (0.0f64, 0u64);
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for i in 0..20_000u32 {
            if next(3) == 0 {
                now += [0.0, 1e-6, 5e-6, 2.5e-6][next(4) as usize];
                while let Some(item) = d.pop_due(now) {
                    got.push(item);
                }
                while let Some(&Reverse((t, _, item))) = heap.peek() {
                    if f64::from_bits(t) > now {
                        break;
                    }
                    heap.pop();
                    want.push(item);
                }
                assert_eq!(
                    d.next_time().map(f64::to_bits),
                    heap.peek().map(|Reverse((t, ..))| *t)
                );
            }
            let alpha = alphas[next(alphas.len() as u64) as usize];
            d.push(now, alpha, i);
            seq += 1;
            heap.push(Reverse(((now + alpha).to_bits(), seq, i)));
            assert_eq!(d.len(), heap.len());
        }
        while let Some(t) = d.next_time() {
            got.push(d.pop_due(t).expect("due at its own time"));
        }
        while let Some(Reverse((_, _, item))) = heap.pop() {
            want.push(item);
        }
        assert_eq!(got.len(), 20_000);
        assert_eq!(got, want);
        assert!(d.is_empty());
    }
}
