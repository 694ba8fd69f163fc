//! Tests of the rdma transport.
//!
//! Outside the Soft-RoCE VM, `unavailable_where_there_is_no_device` checks the "rdma
//! unavailable" path. The tests marked `#[ignore = "needs an RDMA device: …"]` need a verbs
//! device; `scripts/rdma-vm.sh` runs them inside the VM (`-- --ignored rdma::`), and there
//! `BCL_RDMA_VM=1` makes the availability test demand a device instead.

use super::*;
use std::net::{SocketAddr, TcpStream};
use std::thread;

const IN_VM: &str = "BCL_RDMA_VM";

fn config() -> RdmaConfig {
    let mut c = RdmaConfig::new(Secret::random().expect("secret"));
    // Small slots, so that messages of a few KiB already span several chunks and a few sends
    // exhaust the credits.
    c.slots = 4;
    c.slot_payload = 4096;
    c.max_queued_per_peer = 64 << 10;
    c
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// `n` transports, connected to each other.
fn connected(n: usize, config: RdmaConfig) -> Vec<RdmaTransport> {
    let ts: Vec<RdmaTransport> = (0..n)
        .map(|_| RdmaTransport::bind(config.clone()).expect("bind rdma (is this the VM?)"))
        .collect();
    connect_all(ts)
}

/// Connect bound transports to each other, rank `i` being `ts[i]`, each on a thread of its own.
fn connect_all<T: Transport>(mut ts: Vec<T>) -> Vec<T> {
    let addresses: Vec<PeerAddress> = ts.iter().map(|t| t.address().clone()).collect();
    thread::scope(|s| {
        for (rank, t) in ts.iter_mut().enumerate() {
            let peers: Vec<(usize, PeerAddress)> = addresses
                .iter()
                .enumerate()
                .filter(|(p, _)| *p != rank)
                .map(|(p, a)| (p, a.clone()))
                .collect();
            s.spawn(move || t.connect(rank, &peers, deadline()).expect("connect"));
        }
    });
    ts
}

/// Progress every transport until `done` or a bounded time passes.
fn drive<T: Transport>(ts: &mut [T], mut done: impl FnMut(&mut [T]) -> bool) {
    let until = Instant::now() + Duration::from_secs(60);
    while !done(ts) {
        assert!(Instant::now() < until, "no progress within 60 s");
        for t in ts.iter_mut() {
            t.progress().expect("progress");
        }
    }
}

#[test]
fn unavailable_where_there_is_no_device() {
    let result = RdmaTransport::bind(config());
    if std::env::var_os(IN_VM).is_some() {
        let t = result.expect("inside the VM the rdma transport must open rxe0");
        assert!(t.device_label().contains("port 1"), "{}", t.device_label());
        let devices = probe().expect("probe");
        assert!(
            devices.iter().any(|d| d.ports.iter().any(|p| p.active)),
            "{devices:?}"
        );
        return;
    }
    let e = result.expect_err("no RDMA device on this machine");
    let text = e.to_string();
    assert!(
        matches!(
            e,
            TransportError::Unavailable {
                transport: "rdma",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        text.starts_with("rdma unavailable: ")
            && (text.contains("no RDMA devices") || text.contains("libibverbs not available")),
        "{text}"
    );
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_messages_of_every_size_arrive_whole_and_in_order() {
    let mut ts = connected(2, config());
    let payload = ts[0].config.slot_payload;
    let sizes = [
        0,
        1,
        7,
        payload - 1,
        payload,
        payload + 1,
        3 * payload + 5,
        40_000,
    ];
    let message =
        |size: usize, i: usize| -> Vec<u8> { (0..size).map(|b| (b * 31 + i * 7) as u8).collect() };
    // Two tags interleaved, both directions at once: ordering holds per (peer, tag).
    let mut pending: Vec<(usize, usize, Tag, Vec<u8>)> = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        for from in 0..2 {
            pending.push((from, 1 - from, 10 + (i % 2) as Tag, message(size, i + from)));
        }
    }
    let mut expected: Vec<VecDeque<Vec<u8>>> = vec![VecDeque::new(); 4];
    let mut queue: VecDeque<_> = pending.into();
    drive(&mut ts, |ts| {
        while let Some((from, to, tag, data)) = queue.pop_front() {
            if ts[from].try_send(to, tag, &data).expect("send") {
                expected[to * 2 + (tag - 10) as usize].push_back(data);
            } else {
                queue.push_front((from, to, tag, data));
                break;
            }
        }
        for to in 0..2 {
            // Tag 10 by value (copied out), tag 11 where it lies (try_recv_with).
            while let Some(m) = ts[to].try_recv(1 - to, 10).expect("recv") {
                let want = expected[to * 2]
                    .pop_front()
                    .expect("a message that was not sent");
                assert!(m.data == want, "message of {} bytes corrupted", want.len());
                ts[to].release(m);
            }
            loop {
                let queue = &mut expected[to * 2 + 1];
                let mut check = |bytes: &[u8], _: Option<Duration>| {
                    let want = queue.pop_front().expect("a message that was not sent");
                    assert!(bytes == want, "message of {} bytes corrupted", want.len());
                };
                if !ts[to].try_recv_with(1 - to, 11, &mut check).expect("recv") {
                    break;
                }
            }
        }
        queue.is_empty() && expected.iter().all(|q| q.is_empty())
    });
    drive(&mut ts, |ts| ts.iter().all(|t| t.flushed()));
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_back_pressure_then_drain_with_four_ranks() {
    let mut ts = connected(4, config());
    let big = vec![0xabu8; 30_000];
    // Rank 0 sends to everyone until the transport says "not now"; nothing is received yet.
    let mut accepted = [0usize; 4];
    for (to, count) in accepted.iter_mut().enumerate().skip(1) {
        while ts[0].try_send(to, 5, &big).expect("send") {
            *count += 1;
            assert!(*count < 100, "no back-pressure after {count} messages");
        }
    }
    assert!(accepted[1..].iter().all(|&c| c >= 2), "{accepted:?}");
    let mut got = [0usize; 4];
    drive(&mut ts, |ts| {
        for to in 1..4 {
            while let Some(m) = ts[to].try_recv(0, 5).expect("recv") {
                assert!(m.data == big);
                got[to] += 1;
                ts[to].release(m);
            }
        }
        got[1..] == accepted[1..]
    });
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_wait_sleeps_on_the_channel_and_wakes_for_a_message() {
    let mut ts = connected(2, config());
    let mut b = ts.pop().expect("b");
    let mut a = ts.pop().expect("a");
    let sender = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        assert!(a.try_send(1, 3, b"wake up").expect("send"));
        let until = Instant::now() + Duration::from_secs(30);
        while !a.flushed() {
            assert!(Instant::now() < until);
            a.progress().expect("progress");
            a.wait(Duration::from_millis(50)).expect("wait");
        }
        a
    });
    let started = Instant::now();
    let mut woke = 0;
    let message = loop {
        b.progress().expect("progress");
        if let Some(m) = b.try_recv(0, 3).expect("recv") {
            break m;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "never arrived");
        b.wait(Duration::from_secs(10)).expect("wait");
        woke += 1;
    };
    assert_eq!(message.data, b"wake up");
    // Slept on the channel rather than spinning: a handful of wake-ups, not thousands.
    assert!(woke < 50, "woke {woke} times");
    drop(sender.join().expect("sender"));
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_a_bad_remote_key_is_a_link_failure_naming_ranks_and_device_without_failover() {
    let mut c = config();
    c.tcp_failover = false;
    let mut ts = connected(2, c);
    // Corrupt rank 0's copy of rank 1's ring key: its next write is refused by the remote NIC.
    ts[0].peers.get_mut(&1).expect("peer").remote.ring_rkey ^= 0x5a5a;
    assert!(ts[0].try_send(1, 9, b"doomed").expect("posting succeeds"));
    let until = Instant::now() + Duration::from_secs(30);
    let e = loop {
        match ts[0].progress() {
            Err(e) => break e,
            Ok(_) => assert!(Instant::now() < until, "no error completion"),
        }
        let _ = ts[1].progress();
    };
    let text = e.to_string();
    assert!(
        matches!(
            e,
            TransportError::LinkFailed {
                local: 0,
                peer: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        text.contains("rank 0 -> rank 1") && text.contains("port 1"),
        "{text}"
    );
    assert!(text.to_lowercase().contains("error"), "{text}");
    assert_eq!(e.peer(), Some(1));
}

/// Message `i` of `from`: its length (1 byte to several chunks, some empty) and bytes.
fn numbered(from: usize, i: usize) -> Vec<u8> {
    let len = [0, 1, 100, 4096, 4097, 9000, 20_000][i % 7] + i % 13;
    (0..len).map(|j| (from * 31 + i * 7 + j) as u8).collect()
}

/// Ranks 0 and 1 send each other `count` numbered messages under two tags while `fault` acts
/// once `at` of them have been sent; every message must arrive once, whole and in order per
/// tag (checked against `numbered`), and both ends must end flushed.
fn exchange_through_a_fault<T: Transport>(
    ts: &mut [T],
    count: usize,
    at: usize,
    fault: impl FnOnce(&mut [T]),
) {
    let mut fault = Some(fault);
    let mut sent = [0usize; 2];
    let mut got = [[0usize; 2]; 2];
    let until = Instant::now() + Duration::from_secs(120);
    while got[0].iter().sum::<usize>() < count || got[1].iter().sum::<usize>() < count {
        assert!(
            Instant::now() < until,
            "stuck: sent {sent:?}, received {got:?}"
        );
        if sent[0].min(sent[1]) >= at
            && let Some(f) = fault.take()
        {
            f(ts);
        }
        for rank in 0..2 {
            let peer = 1 - rank;
            while sent[rank] < count {
                let i = sent[rank];
                let tag = (i % 2) as Tag;
                if !ts[rank]
                    .try_send(peer, tag, &numbered(rank, i))
                    .expect("send")
                {
                    break;
                }
                sent[rank] += 1;
            }
            ts[rank].progress().expect("progress");
            for (tag, got) in got[rank].iter_mut().enumerate() {
                while let Some(m) = ts[rank].try_recv(peer, tag as Tag).expect("receive") {
                    let i = 2 * *got + tag;
                    assert_eq!(
                        m.data,
                        numbered(peer, i),
                        "rank {rank}: message {i} of rank {peer}"
                    );
                    *got += 1;
                    ts[rank].release(m);
                }
            }
        }
    }
    drive(ts, |ts| ts.iter().all(|t| t.flushed()));
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_a_bad_remote_key_moves_the_link_to_tcp_and_nothing_is_lost_or_doubled() {
    let mut ts = connected(2, config());
    // From 3 chunks after each side's 10th message on, rank 0 writes rank 1's ring with a
    // wrong key: an error completion with chunks of several messages in flight, some half
    // sent.
    exchange_through_a_fault(&mut ts, 300, 10, |ts| {
        let p = ts[0].peers.get_mut(&1).expect("peer");
        p.bad_rkey_at = Some(p.posted + 3);
    });
    let moved = ts[0].path_changes();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!((moved[0].peer, moved[0].to.as_str()), (1, "tcp"));
    assert!(
        moved[0].from.starts_with("rdma ") && moved[0].from.contains("port 1"),
        "{moved:?}"
    );
    assert!(
        moved[0].reason.contains("completed with error"),
        "{moved:?}"
    );
    let other = ts[1].path_changes();
    assert_eq!(other.len(), 1, "{other:?}");
    assert_eq!((other[0].peer, other[0].to.as_str()), (0, "tcp"));
    // Both links carry on over the socket: the fallback framed every chunk after the fault.
    assert!(
        ts.iter()
            .all(|t| t.peers.values().all(|p| p.fallback.is_some()))
    );
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_a_link_that_fails_at_once_moves_to_tcp_before_any_chunk_was_taken() {
    let mut ts = connected(2, config());
    exchange_through_a_fault(&mut ts, 40, 0, |ts| {
        ts[1].peers.get_mut(&0).expect("peer").bad_rkey_at = Some(0);
    });
    assert_eq!(ts[1].path_changes().len(), 1);
    assert_eq!(ts[0].path_changes().len(), 1);
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_a_fallen_back_link_whose_socket_closes_is_a_link_failure_naming_both() {
    let mut ts = connected(2, config());
    ts[0].peers.get_mut(&1).expect("peer").bad_rkey_at = Some(0);
    assert!(ts[0].try_send(1, 3, b"over tcp").expect("send"));
    drive(&mut ts, |ts| {
        ts[1].peers[&0].fallback.is_some() && ts[0].peers[&1].fallback.is_some()
    });
    let gone = ts.pop().expect("rank 1");
    drop(gone);
    let until = Instant::now() + Duration::from_secs(10);
    let e = loop {
        assert!(Instant::now() < until, "no error in 10 s");
        let _ = ts[0].progress();
        match ts[0].try_recv(1, 3) {
            Err(e) => break e,
            Ok(_) => ts[0].wait(Duration::from_millis(10)).expect("wait"),
        }
    };
    let text = e.to_string();
    assert!(
        matches!(
            e,
            TransportError::LinkFailed {
                local: 0,
                peer: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        text.contains("moved to tcp") && text.contains("tcp path closed"),
        "{text}"
    );
}

/// `n` ranks of two lanes each, on rxe0 and rxe1 (the VM has both).
fn connected_lanes(n: usize) -> Vec<lanes::RdmaLanes> {
    let devices = [Some("rxe0".to_string()), Some("rxe1".to_string())];
    let config = config();
    let ts: Vec<lanes::RdmaLanes> = (0..n)
        .map(|_| {
            let bound = lanes::RdmaLanes::bind(config.clone(), &devices, 2);
            bound.expect("bind two lanes (the VM?)")
        })
        .collect();
    connect_all(ts)
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_two_lanes_a_failing_lane_moves_to_the_other_lane_then_both_to_tcp() {
    let mut ts = connected_lanes(2);
    assert_eq!(ts[0].device_label(), "rxe0 port 1, rxe1 port 1");
    // Tag 1 rides lane 1 (rxe1): its QP to rank 1 fails with messages of both tags in flight;
    // what lane 1 held goes over its tcp path, the later tag-1 messages over lane 0 (rxe0).
    exchange_through_a_fault(&mut ts, 200, 10, |ts| {
        let lane = ts[0].lane(1);
        let p = lane.peers.get_mut(&1).expect("peer");
        p.bad_rkey_at = Some(p.posted + 1);
    });
    for (rank, t) in ts.iter().enumerate() {
        let moved = t.path_changes();
        assert_eq!(moved.len(), 1, "rank {rank}: {moved:?}");
        assert_eq!(
            (moved[0].from.as_str(), moved[0].to.as_str()),
            ("rdma rxe1 port 1", "rdma rxe0 port 1"),
            "rank {rank}"
        );
        let peer = 1 - rank;
        assert!(t.lanes[0].on_rdma(peer), "rank {rank}: lane 0 left rdma");
        assert_eq!(t.lanes[1].moved_to(peer), Some(0), "rank {rank}");
    }
    // From here on lane 1 carries nothing: every message of a second exchange takes lane 0,
    // whose QP then fails too, and with no lane left on RDMA both move to tcp.
    let lane_1_sent: Vec<u64> = (0..2)
        .map(|r| ts[r].lanes[1].peers[&(1 - r)].posted)
        .collect();
    exchange_through_a_fault(&mut ts, 200, 10, |ts| {
        let p = ts[0].lanes[0].peers.get_mut(&1).expect("peer");
        p.bad_rkey_at = Some(p.posted + 1);
    });
    for (rank, t) in ts.iter().enumerate() {
        let peer = 1 - rank;
        assert_eq!(
            t.lanes[1].peers[&peer].posted, lane_1_sent[rank],
            "rank {rank}"
        );
        let moved = t.path_changes();
        assert_eq!(moved.len(), 2, "rank {rank}: {moved:?}");
        assert_eq!(
            (moved[1].from.as_str(), moved[1].to.as_str()),
            ("rdma rxe0 port 1", "tcp"),
            "rank {rank}"
        );
        assert!(!t.lanes[0].on_rdma(peer) && t.lanes[0].moved_to(peer).is_none());
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_a_peer_that_moves_a_lane_to_one_this_host_does_not_run_is_named() {
    let mut ts = connected_lanes(2);
    // Rank 0's lane 1 fails (driven alone, so the lanes do not seal it themselves), then is
    // sealed towards a lane 9 that neither host runs.
    {
        let lane = &mut ts[0].lanes[1];
        let p = lane.peers.get_mut(&1).expect("peer");
        p.bad_rkey_at = Some(p.posted);
        assert!(lane.try_send(1, 1, b"before the move").expect("send"));
    }
    let until = Instant::now() + Duration::from_secs(20);
    while ts[0].lanes[1].path_change_count() == 0 {
        assert!(Instant::now() < until, "lane 1 never failed over");
        ts[0].lanes[1].progress().expect("progress");
        ts[1].progress().expect("progress");
    }
    ts[0].lanes[1].seal(1, 9, "nowhere");
    // The message sent before the move arrives; the one after cannot be looked for.
    let mut got = None;
    let e = loop {
        assert!(Instant::now() < until, "no error in 20 s (got {got:?})");
        ts[0].lanes[1].progress().expect("progress");
        ts[1].progress().expect("progress");
        match ts[1].try_recv(0, 1) {
            Ok(Some(m)) => got = Some(m.data),
            Ok(None) => {}
            Err(e) => break e,
        }
    };
    assert_eq!(got.as_deref(), Some(&b"before the move"[..]));
    assert!(
        matches!(e, TransportError::Protocol { peer: 0, .. })
            && e.to_string().contains("rank 0 moved lane 1 to lane 9 of 2"),
        "{e}"
    );
}

#[test]
fn lanes_outside_one_to_eight_are_refused() {
    for n in [0, lanes::MAX_LANES + 1] {
        let e = lanes::RdmaLanes::bind(config(), &[], n).expect_err("out of range");
        assert!(
            e.to_string().contains(&format!("{n} queue pairs per peer")),
            "{e}"
        );
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_a_peer_that_goes_away_is_reported_lost() {
    let mut ts = connected(2, config());
    let gone = ts.pop().expect("rank 1");
    drop(gone);
    let until = Instant::now() + Duration::from_secs(10);
    while !ts[0].peer_lost(1) {
        assert!(
            Instant::now() < until,
            "rank 1's departure not noticed in 10 s"
        );
        ts[0].progress().expect("progress");
        ts[0].wait(Duration::from_millis(20)).expect("wait");
    }
    let e = ts[0].try_recv(1, 1).expect_err("peer closed");
    assert!(
        matches!(e, TransportError::PeerClosed { peer: 1, .. }),
        "{e:?}"
    );
    let e = ts[0].try_send(1, 1, b"x").expect_err("peer closed");
    assert!(e.to_string().contains("rank 1"), "{e}");
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_a_stranger_on_the_setup_port_is_refused_and_setup_completes() {
    let config = config();
    let mut ts: Vec<RdmaTransport> = (0..2)
        .map(|_| RdmaTransport::bind(config.clone()).expect("bind"))
        .collect();
    let target: SocketAddr = std::str::from_utf8(ts[1].address().as_bytes())
        .expect("text")
        .parse()
        .expect("socket address");
    // A stranger sends garbage to rank 1's setup port before the real peer dials.
    let mut stranger = TcpStream::connect(target).expect("connect");
    std::io::Write::write_all(&mut stranger, &[0xff; 64]).expect("garbage");
    let addresses: Vec<PeerAddress> = ts.iter().map(|t| t.address().clone()).collect();
    thread::scope(|s| {
        for (rank, t) in ts.iter_mut().enumerate() {
            let peer = (1 - rank, addresses[1 - rank].clone());
            s.spawn(move || t.connect(rank, &[peer], deadline()).expect("connect"));
        }
    });
    assert!(ts[0].try_send(1, 2, b"after the stranger").expect("send"));
    drive(&mut ts, |ts| {
        ts[1]
            .try_recv(0, 2)
            .expect("recv")
            .is_some_and(|m| m.data == b"after the stranger")
    });
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm.sh runs it in the Soft-RoCE VM"]
fn rdma_messages_left_waiting_in_the_ring_do_not_block_later_ones() {
    // A ring of 4 slots: 6 one-chunk messages under tag 1 that nobody consumes yet, then one
    // under tag 2. Tag 2 can only arrive if the waiting ones are copied out of the ring.
    let mut ts = connected(2, config());
    let mut queue: VecDeque<(Tag, Vec<u8>)> = (0..6u8)
        .map(|i| (1, vec![i; 100 + i as usize]))
        .chain([(2, b"the later one".to_vec())])
        .collect();
    let mut later = None;
    drive(&mut ts, |ts| {
        while let Some((tag, data)) = queue.pop_front() {
            if !ts[0].try_send(1, tag, &data).expect("send") {
                queue.push_front((tag, data));
                break;
            }
        }
        if later.is_none() {
            later = ts[1].try_recv(0, 2).expect("recv").map(|m| m.data);
        }
        later.is_some()
    });
    assert_eq!(later.as_deref(), Some(&b"the later one"[..]));
    for i in 0..6u8 {
        let mut got = Vec::new();
        let mut take = |bytes: &[u8], _: Option<Duration>| got = bytes.to_vec();
        assert!(
            ts[1].try_recv_with(0, 1, &mut take).expect("recv"),
            "message {i}"
        );
        assert_eq!(got, vec![i; 100 + i as usize]);
    }
}

/// The Transport contract suite (`crate::contract`) over rdma: real verbs, so in the
/// Soft-RoCE VM only.
mod contract {
    use super::{config, connected};
    use crate::contract::World;

    fn world(n: usize) -> World {
        let ends = connected(n, config())
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn crate::Transport>)
            .collect();
        World::new(ends, |_| {})
    }

    crate::contract::transport_contract!(
        world,
        #[ignore = "needs an RDMA device: scripts/rdma-vm-test.sh runs it in the Soft-RoCE VM"]
    );

    /// The same contract over two lanes per peer, on rxe0 and rxe1.
    mod two_lanes {
        use super::super::connected_lanes;
        use crate::contract::World;

        fn world(n: usize) -> World {
            let ends = connected_lanes(n)
                .into_iter()
                .map(|t| Box::new(t) as Box<dyn crate::Transport>)
                .collect();
            World::new(ends, |_| {})
        }

        crate::contract::transport_contract!(
            world,
            #[ignore = "needs an RDMA device: scripts/rdma-vm-test.sh runs it in the Soft-RoCE VM"]
        );
    }
}
