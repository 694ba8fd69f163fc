//! The contract every [`Transport`] keeps, as one suite instantiated per transport (as rustls
//! runs one API suite per crypto provider): `mem`, `tcp` and `shm` here, `rdma` in the
//! Soft-RoCE VM (`rdma::tests::contract`). The executor relies on each of these properties:
//! * messages of one tag between two ranks arrive in send order, whole; other tags overtake;
//! * back-pressure: a sender whose peer receives nothing is told "not now" before it has
//!   queued an unbounded amount, and after the peer drains nothing was lost;
//! * `try_recv_with` hands a message over whole; `try_recv_into` fills a destination of the
//!   right length, and answers `WrongLength` (dropping the message, leaving the destination
//!   untouched) for another length;
//! * `flushed` says when every accepted send has left;
//! * a lost peer is reported by `peer_lost` only once what it sent has been read;
//! * `prepare_wait` never lets a rank sleep through a message that has arrived.

use crate::transport::{Landing, Readiness, Tag, Transport};
use std::time::{Duration, Instant};

/// Connected endpoints, ranks 0..n, and how to lose one of them.
pub(crate) struct World {
    pub ends: Vec<Option<Box<dyn Transport>>>,
    /// Make rank r's peers see it gone (its endpoint is dropped too).
    lose: Box<dyn Fn(usize)>,
}

impl World {
    pub fn new(ends: Vec<Box<dyn Transport>>, lose: impl Fn(usize) + 'static) -> Self {
        World {
            ends: ends.into_iter().map(Some).collect(),
            lose: Box::new(lose),
        }
    }

    fn end(&mut self, rank: usize) -> &mut dyn Transport {
        match self.ends[rank].as_mut() {
            Some(t) => t.as_mut(),
            None => panic!("rank {rank} was lost"),
        }
    }

    /// Progress every live endpoint once.
    fn progress(&mut self) {
        for t in self.ends.iter_mut().flatten() {
            t.progress().expect("progress");
        }
    }

    fn lose(&mut self, rank: usize) {
        (self.lose)(rank);
        self.ends[rank] = None;
    }
}

/// A bound on every wait of the suite.
const PATIENCE: Duration = Duration::from_secs(30);

/// Keep progressing `world` until `done` answers true (bounded).
fn until(world: &mut World, what: &str, mut done: impl FnMut(&mut World) -> bool) {
    let end = Instant::now() + PATIENCE;
    while !done(world) {
        assert!(Instant::now() < end, "{what}: not within {PATIENCE:?}");
        world.progress();
        std::thread::yield_now();
    }
}

/// Send `data` from `from` to `to` under `tag`, progressing everyone under back-pressure.
fn send(world: &mut World, from: usize, to: usize, tag: Tag, data: &[u8]) {
    until(world, "a send was accepted", |w| {
        w.end(from).try_send(to, tag, data).expect("send")
    });
}

/// The next message `tag` from `from` at `to` (progressing everyone until it arrives).
fn recv(world: &mut World, to: usize, from: usize, tag: Tag) -> Vec<u8> {
    let mut got = None;
    until(
        world,
        &format!("message {tag} from rank {from} arrived"),
        |w| {
            let t = w.end(to);
            got = t.try_recv(from, tag).expect("recv").map(|m| {
                let data = m.data.clone();
                t.release(m);
                data
            });
            got.is_some()
        },
    );
    got.unwrap_or_default()
}

/// Whether `got` is `want`, as a short message where not (lengths, the first difference).
fn same(got: &[u8], want: &[u8]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{} bytes where {} were sent",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => Err(format!("byte {i} of {} differs", got.len())),
        None => Ok(()),
    }
}

/// Bytes that tell messages apart: message `i` of `len` bytes.
fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b * 31 + i * 7) as u8).collect()
}

/// Message lengths that cross every boundary a transport may have (empty, tiny, frame and
/// slot sizes, several slots).
const LENGTHS: [usize; 9] = [0, 1, 7, 4095, 4096, 4097, 16 << 10, 100_000, 300_000];

pub(crate) fn order_per_tag_and_tags_overtake(mut world: World) {
    let tags: [Tag; 3] = [5, 1 << 40, (1 << 63) | 9];
    let mut sent = Vec::new();
    for i in 0..36 {
        let (tag, len) = (tags[i % 3], LENGTHS[i % LENGTHS.len()]);
        send(&mut world, 0, 1, tag, &payload(i, len));
        sent.push((tag, payload(i, len)));
    }
    // Received tag by tag, in the opposite order of the tags' first sends.
    for &tag in tags.iter().rev() {
        for (t, want) in sent.iter().filter(|(t, _)| *t == tag) {
            let got = recv(&mut world, 1, 0, *t);
            if let Err(e) = same(&got, want) {
                panic!("tag {t}: out of order or torn: {e}");
            }
        }
    }
    until(&mut world, "the sender flushed", |w| w.end(0).flushed());
}

pub(crate) fn back_pressure_loses_nothing(mut world: World) {
    let len = 64 << 10;
    let bound = 512 << 20;
    let mut accepted = 0usize;
    // The receiver takes nothing: the sender must hear "not now" before the bound.
    let refused = loop {
        assert!(
            accepted * len <= bound,
            "no back-pressure after {accepted} messages"
        );
        if !world
            .end(0)
            .try_send(1, 3, &payload(accepted, len))
            .expect("send")
        {
            break true;
        }
        accepted += 1;
        world.end(0).progress().expect("progress");
    };
    assert!(refused && accepted > 0, "accepted {accepted}");
    for i in 0..accepted {
        let got = recv(&mut world, 1, 0, 3);
        if let Err(e) = same(&got, &payload(i, len)) {
            panic!("message {i} of {accepted}: {e}");
        }
    }
    // The refused message was not queued: sent now, it is the next one.
    send(&mut world, 0, 1, 3, &payload(accepted, len));
    assert!(same(&recv(&mut world, 1, 0, 3), &payload(accepted, len)).is_ok());
    until(&mut world, "the sender flushed", |w| w.end(0).flushed());
}

pub(crate) fn receive_in_place_and_into_memory(mut world: World) {
    let big = payload(1, 200_000);
    send(&mut world, 0, 1, 7, b"seen in place");
    send(&mut world, 0, 1, 8, &big);
    send(&mut world, 0, 1, 8, &payload(2, 100));
    send(&mut world, 0, 1, 8, &payload(3, 100));
    // try_recv_with: handed over whole, once.
    let mut seen = Vec::new();
    until(&mut world, "try_recv_with", |w| {
        w.end(1)
            .try_recv_with(0, 7, &mut |data, _| seen.extend_from_slice(data))
            .expect("recv_with")
    });
    assert_eq!(seen, b"seen in place");
    let again = world
        .end(1)
        .try_recv_with(0, 7, &mut |_, _| panic!("twice"));
    assert!(!again.expect("recv_with"), "a message handed over twice");
    // try_recv_into: a long message straight into memory (Pending until it is whole).
    let mut dest = vec![0u8; big.len()];
    until(&mut world, "try_recv_into", |w| {
        match w.end(1).try_recv_into(0, 8, &mut dest).expect("recv_into") {
            Landing::Pending => false,
            Landing::Filled(_) => true,
            Landing::WrongLength(n) => panic!("{n} bytes is not {}", big.len()),
        }
    });
    assert_eq!(same(&dest, &big), Ok(()));
    // Another length: reported, dropped, and the destination untouched.
    let mut short = vec![0xAAu8; 99];
    let mut wrong = None;
    until(&mut world, "a wrong length reported", |w| {
        match w.end(1).try_recv_into(0, 8, &mut short).expect("recv_into") {
            Landing::Pending => false,
            other => {
                wrong = Some(other);
                true
            }
        }
    });
    assert_eq!(wrong, Some(Landing::WrongLength(100)));
    assert!(
        short.iter().all(|b| *b == 0xAA),
        "a wrong-length message was written"
    );
    assert_eq!(
        recv(&mut world, 1, 0, 8),
        payload(3, 100),
        "the next message follows"
    );
}

pub(crate) fn lost_peer_after_its_messages(mut world: World) {
    send(&mut world, 1, 0, 4, &payload(9, 5000));
    until(&mut world, "rank 1 flushed", |w| w.end(1).flushed());
    world.lose(1);
    // What it sent before it went is still there, and only then is it lost.
    assert!(
        !world.end(0).peer_lost(1),
        "lost with a message of it unread"
    );
    assert_eq!(recv(&mut world, 0, 1, 4), payload(9, 5000));
    until(&mut world, "rank 0 sees rank 1 lost", |w| {
        w.end(0).peer_lost(1)
    });
    assert!(!world.end(0).peer_lost(2), "rank 2 is alive");
}

pub(crate) fn flushed_and_idle_endpoints(mut world: World) {
    assert!(world.end(0).flushed(), "an idle endpoint is flushed");
    for i in 0..8 {
        send(&mut world, 0, 1, 2, &payload(i, 300_000));
    }
    until(&mut world, "the sender flushed", |w| {
        let t = w.end(1);
        while let Some(m) = t.try_recv(0, 2).expect("recv") {
            t.release(m);
        }
        w.end(0).flushed()
    });
}

pub(crate) fn prepare_wait_never_sleeps_through_a_message(mut world: World) {
    let mut fds = Vec::new();
    // Idle: nothing is ready (or the transport cannot sleep on descriptors at all).
    let idle = world.end(1).prepare_wait(&mut fds);
    if idle == Readiness::Unsupported {
        // Such a rank sleeps in `wait` instead: once a message is there, `wait` returns and
        // the message is taken.
        send(&mut world, 0, 1, 6, &payload(1, 1000));
        let start = Instant::now();
        let t = world.end(1);
        loop {
            t.wait(Duration::from_millis(100)).expect("wait");
            t.progress().expect("progress");
            if let Some(m) = t.try_recv(0, 6).expect("recv") {
                assert_eq!(same(&m.data, &payload(1, 1000)), Ok(()));
                return;
            }
            assert!(start.elapsed() < PATIENCE, "slept through a message");
        }
    }
    world.end(1).after_wait();
    assert_eq!(idle, Readiness::Sleep, "an idle endpoint is not ready");
    send(&mut world, 0, 1, 6, &payload(1, 1000));
    until(&mut world, "rank 0 flushed", |w| w.end(0).flushed());
    // Rank 1 about to sleep: either it is told the message is there, or its descriptors wake
    // it within the bound.
    let start = Instant::now();
    loop {
        fds.clear();
        let t = world.end(1);
        match t.prepare_wait(&mut fds) {
            Readiness::Ready => {
                t.after_wait();
                break;
            }
            Readiness::Sleep => {
                crate::poll::poll_fds(&fds, Duration::from_millis(100)).expect("poll");
                t.after_wait();
                t.progress().expect("progress");
                if t.try_recv(0, 6).expect("recv").is_some() {
                    return;
                }
            }
            Readiness::Unsupported => panic!("prepare_wait changed its mind"),
        }
        assert!(start.elapsed() < PATIENCE, "slept through a message");
    }
    assert_eq!(recv(&mut world, 1, 0, 6), payload(1, 1000));
}

/// The suite, for a transport: `$make(n)` gives a [`World`] of `n` connected ranks; any
/// attributes given (`#[ignore = "..."]` where hardware is needed) go on every test.
macro_rules! transport_contract {
    ($make:expr $(, #[$attr:meta])*) => {
        #[test]
        $(#[$attr])*
        fn order_per_tag_and_tags_overtake() {
            $crate::contract::order_per_tag_and_tags_overtake($make(2));
        }
        #[test]
        $(#[$attr])*
        fn back_pressure_loses_nothing() {
            $crate::contract::back_pressure_loses_nothing($make(2));
        }
        #[test]
        $(#[$attr])*
        fn receive_in_place_and_into_memory() {
            $crate::contract::receive_in_place_and_into_memory($make(2));
        }
        #[test]
        $(#[$attr])*
        fn lost_peer_after_its_messages() {
            $crate::contract::lost_peer_after_its_messages($make(3));
        }
        #[test]
        $(#[$attr])*
        fn flushed_and_idle_endpoints() {
            $crate::contract::flushed_and_idle_endpoints($make(2));
        }
        #[test]
        $(#[$attr])*
        fn prepare_wait_never_sleeps_through_a_message() {
            $crate::contract::prepare_wait_never_sleeps_through_a_message($make(2));
        }
    };
}
pub(crate) use transport_contract;

/// `n` endpoints made by `bind`, connected (each `connect` on its own thread, as ranks do).
pub(crate) fn connected<T: Transport + 'static>(
    n: usize,
    bind: impl Fn() -> T,
) -> Vec<Box<dyn Transport>> {
    let mut ends: Vec<T> = (0..n).map(|_| bind()).collect();
    let addresses: Vec<_> = ends.iter().map(|t| t.address().clone()).collect();
    let deadline = Instant::now() + PATIENCE;
    std::thread::scope(|s| {
        for (rank, t) in ends.iter_mut().enumerate() {
            let peers: Vec<_> = (0..n)
                .filter(|p| *p != rank)
                .map(|p| (p, addresses[p].clone()))
                .collect();
            s.spawn(move || t.connect(rank, &peers, deadline).expect("connect"));
        }
    });
    ends.into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

mod mem {
    use super::World;
    use crate::mem::MemFabric;

    fn world(n: usize) -> World {
        let fabric = MemFabric::new(n);
        let faults = fabric.faults();
        let ends = (0..n)
            .map(|r| Box::new(fabric.endpoint(r)) as Box<dyn crate::Transport>)
            .collect();
        World::new(ends, move |r| faults.drop_peer(r))
    }

    super::transport_contract!(world);
}

mod tcp {
    use super::{World, connected};
    use crate::Secret;
    use crate::tcp::{TcpConfig, TcpTransport};

    fn world(n: usize) -> World {
        let bind = || {
            let mut c = TcpConfig::new(Secret::derive("contract"));
            c.sockets_per_peer = 2;
            TcpTransport::bind(c).expect("bind tcp")
        };
        World::new(connected(n, bind), |_| {})
    }

    super::transport_contract!(world);
}

mod shm {
    use super::{World, connected};
    use crate::Secret;
    use crate::shm::{ShmConfig, ShmTransport};

    fn world(n: usize) -> World {
        let bind = || {
            let mut c = ShmConfig::new(Secret::derive("contract"));
            // Small rings, so that messages larger than a ring are in the suite.
            c.ring_bytes = 64 << 10;
            ShmTransport::bind(c).expect("bind shm")
        };
        World::new(connected(n, bind), |_| {})
    }

    super::transport_contract!(world);
}
