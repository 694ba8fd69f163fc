//! A deterministic in-process network with virtual time, for the executor's own tests (after
//! quinn's `Pair`): every rank's executor runs in one thread, messages take a delay drawn
//! from the seed (so messages of different tags overtake each other), a link may lose a
//! message or a peer, and a rank may stall. Nothing reads the wall clock or sleeps, so a run
//! replays exactly from its seed.

use crate::exec::Clock;
use bcl_transport::keys::KeyMap;
use bcl_transport::{
    Capabilities, MemoryKind, PeerAddress, Received, Tag, Transport, TransportError,
};
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A small deterministic generator (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// Time that moves only when the test says.
#[derive(Debug)]
pub struct VirtualClock {
    base: Instant,
    nanos: AtomicU64,
}

impl VirtualClock {
    pub fn new() -> Self {
        VirtualClock {
            base: Instant::now(),
            nanos: AtomicU64::new(0),
        }
    }

    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    pub fn advance_to(&self, t: Duration) {
        self.nanos.fetch_max(t.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        self.base + self.elapsed()
    }
}

/// What goes wrong on the network.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// (from, to, n): the n-th message (from 0) on that link never arrives.
    pub lose: Option<(usize, usize, usize)>,
    /// This rank is gone after its peers sent it this many messages in total: sends to it
    /// and receives from it fail with `PeerClosed`.
    pub drop_rank: Option<(usize, usize)>,
}

struct Flight {
    from: usize,
    to: usize,
    tag: Tag,
    data: Vec<u8>,
    arrives: Duration,
    order: u64,
}

/// Flights in arrival order (then send order), earliest first out of a max-heap.
impl Ord for Flight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        Reverse((self.arrives, self.order)).cmp(&Reverse((other.arrives, other.order)))
    }
}

impl PartialOrd for Flight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Flight {
    fn eq(&self, other: &Self) -> bool {
        self.order == other.order
    }
}

impl Eq for Flight {}

/// Arrived messages of one receiver, by (sender, tag), in order (`KeyMap`: the transports' map
/// for such keys; with SipHash the lookups took a fifth of the executor suite's time).
type Inbox = KeyMap<(usize, Tag), VecDeque<Vec<u8>>>;

struct NetState {
    world: usize,
    rng: Rng,
    /// Per-message delay range.
    delay: (Duration, Duration),
    /// Bytes a link may hold in flight before `try_send` answers "not now".
    window: usize,
    in_flight: BinaryHeap<Flight>,
    inbox: Vec<Inbox>,
    /// When the last message of (from, to, tag) arrives: a later one arrives after it.
    last_arrival: KeyMap<(usize, usize, Tag), Duration>,
    queued: KeyMap<(usize, usize), usize>,
    sent: KeyMap<(usize, usize), usize>,
    sent_to: Vec<usize>,
    faults: Faults,
    next_order: u64,
    /// Messages sent through `try_send_filled`.
    filled: usize,
}

/// The network of one test world.
#[derive(Clone)]
pub struct Net {
    state: Arc<Mutex<NetState>>,
    clock: Arc<VirtualClock>,
}

const CAPABILITIES: Capabilities = Capabilities {
    name: "virtual",
    max_message: 1 << 30,
    max_queued_per_peer: 1 << 20,
    memory: &[MemoryKind::Host],
};

impl Net {
    pub fn new(world: usize, seed: u64, faults: Faults, clock: Arc<VirtualClock>) -> Self {
        let mut rng = Rng::new(seed ^ 0x5eed);
        let max_delay = Duration::from_micros(1 + rng.below(200) as u64);
        let window = [256usize, 4 << 10, 1 << 20][rng.below(3)];
        Net {
            state: Arc::new(Mutex::new(NetState {
                world,
                rng,
                delay: (Duration::from_nanos(100), max_delay),
                window,
                in_flight: BinaryHeap::new(),
                inbox: (0..world).map(|_| KeyMap::default()).collect(),
                last_arrival: KeyMap::default(),
                queued: KeyMap::default(),
                sent: KeyMap::default(),
                sent_to: vec![0; world],
                faults,
                next_order: 0,
                filled: 0,
            })),
            clock,
        }
    }

    /// How many messages were filled in place (see `Endpoint::try_send_filled`).
    pub fn filled(&self) -> usize {
        self.state.lock().filled
    }

    pub fn endpoint(&self, rank: usize) -> Endpoint {
        Endpoint {
            net: self.clone(),
            rank,
            address: PeerAddress::new(format!("virtual:{rank}").into_bytes())
                .unwrap_or_else(|_| unreachable!("a short address")),
        }
    }

    /// When the next message in flight arrives.
    pub fn next_arrival(&self) -> Option<Duration> {
        self.state.lock().in_flight.peek().map(|f| f.arrives)
    }

    /// Move the messages that have arrived by now into their receivers' inboxes, in order.
    fn deliver(&self) {
        let now = self.clock.elapsed();
        self.state.lock().deliver(now);
    }

    fn gone(&self, peer: usize) -> bool {
        self.state.lock().gone(peer)
    }
}

impl NetState {
    /// [`Net::deliver`], the state locked (one lock per call: the suite polls every rank's
    /// every step, and the locks were a fifth of its time).
    fn deliver(&mut self, now: Duration) {
        while self.in_flight.peek().is_some_and(|f| f.arrives <= now) {
            let Some(f) = self.in_flight.pop() else { break };
            *self.queued.entry((f.from, f.to)).or_default() -= f.data.len();
            self.inbox[f.to]
                .entry((f.from, f.tag))
                .or_default()
                .push_back(f.data);
        }
    }

    fn gone(&self, peer: usize) -> bool {
        self.faults
            .drop_rank
            .is_some_and(|(r, after)| r == peer && self.sent_to[r] >= after)
    }

    /// Whether `peer` can be reached.
    fn check(&self, peer: usize) -> Result<(), TransportError> {
        if peer >= self.world {
            return Err(TransportError::UnknownPeer { peer });
        }
        if self.gone(peer) {
            return Err(TransportError::PeerClosed {
                peer,
                addr: format!("virtual:{peer}"),
            });
        }
        Ok(())
    }
}

/// One rank's end of the network.
pub struct Endpoint {
    net: Net,
    rank: usize,
    address: PeerAddress,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint(rank {})", self.rank)
    }
}

impl Endpoint {
    fn check(&self, peer: usize) -> Result<(), TransportError> {
        self.net.state.lock().check(peer)
    }
}

impl Transport for Endpoint {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    fn address(&self) -> &PeerAddress {
        &self.address
    }

    fn connect(
        &mut self,
        _: usize,
        _: &[(usize, PeerAddress)],
        _: Instant,
    ) -> Result<(), TransportError> {
        Ok(())
    }

    fn try_send(&mut self, peer: usize, tag: Tag, data: &[u8]) -> Result<bool, TransportError> {
        self.check(peer)?;
        let now = self.net.clock.elapsed();
        let mut s = self.net.state.lock();
        let link = (self.rank, peer);
        let queued = s.queued.get(&link).copied().unwrap_or(0);
        if queued > 0 && queued + data.len() > s.window {
            return Ok(false);
        }
        let n = *s.sent.entry(link).and_modify(|n| *n += 1).or_insert(1) - 1;
        s.sent_to[peer] += 1;
        if s.faults.lose == Some((self.rank, peer, n)) {
            return Ok(true);
        }
        let (lo, hi) = s.delay;
        let spread = (hi - lo).as_nanos() as usize;
        let delay = lo + Duration::from_nanos(s.rng.below(spread + 1) as u64);
        let key = (self.rank, peer, tag);
        let arrives = (now + delay).max(s.last_arrival.get(&key).copied().unwrap_or_default());
        s.last_arrival.insert(key, arrives);
        *s.queued.entry(link).or_default() += data.len();
        let order = s.next_order;
        s.next_order += 1;
        s.in_flight.push(Flight {
            from: self.rank,
            to: peer,
            tag,
            data: data.to_vec(),
            arrives,
            order,
        });
        Ok(true)
    }

    /// Every other message of a link is filled in place, as the shm ring does, so the
    /// executor's sends from device memory run both ways.
    fn try_send_filled(
        &mut self,
        peer: usize,
        tag: Tag,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<Option<bool>, TransportError> {
        self.check(peer)?;
        {
            let s = self.net.state.lock();
            // Not a draw: the seeds' delays stay as they were.
            let sent = s.sent.get(&(self.rank, peer)).copied().unwrap_or(0);
            if sent % 2 == 0 {
                return Ok(None);
            }
            let queued = s.queued.get(&(self.rank, peer)).copied().unwrap_or(0);
            if queued > 0 && queued + len > s.window {
                return Ok(Some(false));
            }
        }
        let mut data = vec![0; len];
        if !fill(&mut data) {
            return Ok(Some(false));
        }
        let sent = self.try_send(peer, tag, &data)?;
        self.net.state.lock().filled += usize::from(sent);
        Ok(Some(sent))
    }

    fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError> {
        let now = self.net.clock.elapsed();
        let mut s = self.net.state.lock();
        s.check(peer)?;
        s.deliver(now);
        let data = s.inbox[self.rank]
            .get_mut(&(peer, tag))
            .and_then(VecDeque::pop_front);
        Ok(data.map(|data| Received {
            peer,
            tag,
            data,
            transfer: None,
        }))
    }

    fn release(&mut self, _: Received) {}

    fn progress(&mut self) -> Result<bool, TransportError> {
        self.net.deliver();
        Ok(false)
    }

    fn wait(&mut self, _: Duration) -> Result<(), TransportError> {
        Ok(())
    }

    fn flushed(&self) -> bool {
        true
    }

    fn peer_lost(&self, peer: usize) -> bool {
        self.net.gone(peer)
    }
}
