//! Bad input and injected faults: each gives a clear error naming what was wrong, nothing is
//! corrupted, and no call hangs.

use bcl_core::Cause;
use bcl_core::schedule::Algorithm;
use bcl_core::{CommConfig, Communicator, Error, MemFabric, ReduceOp, TransportKind, UniqueId};
use bcl_tests::{Setup, each, test_config};
use bcl_transport::Secret;
use bcl_transport::store::MemoryStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn short(setup: Setup, rank: usize) -> CommConfig {
    CommConfig {
        op_timeout: Duration::from_secs(3),
        ..test_config(setup, rank)
    }
}

#[test]
fn wrong_lengths_and_ranks_are_invalid_arguments_and_change_nothing() {
    let comms = Communicator::init_threads_with(2, |r| short(Setup::TcpCpu, r)).expect("init");
    let c = &comms[0];
    let mut out = vec![0f32; 3];
    let e = c
        .all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum)
        .expect_err("length");
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("12 bytes"),
        "{e}"
    );
    assert_eq!(out, vec![0f32; 3], "a refused call wrote the output");
    let e = c
        .all_gather(&[1u8; 4], &mut [0u8; 7])
        .expect_err("gather length");
    assert!(e.to_string().contains("needs 8 bytes"), "{e}");
    let e = c.broadcast_in_place(&mut [0u8; 4], 2).expect_err("root");
    assert!(e.to_string().contains("rank 2 does not exist"), "{e}");
    let e = c.send(&[1u8], 0).expect_err("self");
    assert!(e.to_string().contains("cannot address itself"), "{e}");
    let e = c.all_gather_in_place(&mut [0u8; 3]).expect_err("split");
    assert!(e.to_string().contains("2 equal blocks"), "{e}");
    assert!(
        c.async_error().is_none(),
        "bad input must not poison the communicator"
    );
    // The communicator still works.
    let results = each(&comms, |r, c| {
        let mut v = vec![r as i32 + 1; 5];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).map(|_| v)
    });
    for r in results {
        assert_eq!(r.expect("allreduce after bad input"), vec![3; 5]);
    }
}

#[test]
fn mismatched_dtypes_between_ranks_fail_naming_both_signatures_then_poison() {
    let comms = Communicator::init_threads_with(2, |r| short(Setup::TcpCpu, r)).expect("init");
    let results = each(&comms, |r, c| {
        if r == 0 {
            c.all_reduce_in_place(&mut [1f32; 64], ReduceOp::Sum)
        } else {
            c.all_reduce_in_place(&mut [1f64; 64], ReduceOp::Sum)
        }
    });
    for (r, res) in results.into_iter().enumerate() {
        let e = res.expect_err("dtype mismatch must fail");
        let other = 1 - r;
        assert!(failed_by(&e, Cause::Desync), "rank {r}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("rank {other} (host")),
            "rank {r}: {e}"
        );
        assert!(
            text.contains("allreduce #1 (64 x float sum")
                && text.contains("allreduce #1 (64 x double sum"),
            "rank {r} does not name both signatures: {e}"
        );
    }
    // Poisoned: later calls fail at once, naming the first fault.
    let start = Instant::now();
    let e = comms[0]
        .all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum)
        .expect_err("poisoned");
    assert!(matches!(e, Error::Poisoned(_)), "{e}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

/// Whether `e` is the verdict of a fault with `cause`: the operation in flight fails with it,
/// and a rank that had not started its call yet when the verdict came is refused at once.
fn failed_by(e: &Error, cause: Cause) -> bool {
    let phrase = match cause {
        Cause::Desync => "desync between",
        Cause::LinkDown => "link between",
        _ => unreachable!("not used here"),
    };
    match e {
        Error::Fault { cause: c, .. } => *c == cause,
        Error::Poisoned(verdict) => verdict.contains(phrase),
        _ => false,
    }
}

/// Drop rank 2 of 4 and run a 4000-byte allreduce with `algorithm`; returns each rank's result.
fn allreduce_without_rank_2(algorithm: Algorithm) -> Vec<Result<(), Error>> {
    let fabric = MemFabric::new(4);
    let faults = fabric.faults();
    let comms = Communicator::init_threads_with(4, |r| CommConfig {
        transport: TransportKind::Mem(fabric.clone()),
        algorithm: Some(algorithm),
        ..short(Setup::MemCpu, r)
    })
    .expect("init");
    faults.drop_peer(2);
    each(&comms, |r, c| {
        if r == 2 {
            Ok(())
        } else {
            c.all_reduce_in_place(&mut [1u32; 1000], ReduceOp::Sum)
        }
    })
}

/// Rank 2's thread still answers on the health channel: the dropped links are link failures
/// between two live ranks, and the verdict reaches every rank in the operation.
fn assert_names_link_to_rank_2(results: &[Result<(), Error>], rank: usize) {
    let e = results[rank].as_ref().expect_err("a rank in the operation");
    assert!(failed_by(e, Cause::LinkDown), "rank {rank}: {e}");
    let text = e.to_string();
    assert!(text.contains("link between rank "), "rank {rank}: {e}");
    assert!(text.contains("rank 2 (host"), "rank {rank}: {e}");
    assert!(
        text.contains("allreduce #1 (1000 x uint32"),
        "rank {rank}: {e}"
    );
}

#[test]
fn a_dropped_peer_fails_every_rank_with_a_link_verdict_naming_it() {
    for algorithm in [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::HalvingDoubling,
    ] {
        let results = allreduce_without_rank_2(algorithm);
        for rank in [0, 1, 3] {
            assert_names_link_to_rank_2(&results, rank);
        }
    }
}

#[test]
fn a_stalled_link_times_out_naming_the_peer_waited_for() {
    let fabric = MemFabric::new(2);
    let faults = fabric.faults();
    let comms = Communicator::init_threads_with(2, |r| CommConfig {
        transport: TransportKind::Mem(fabric.clone()),
        op_timeout: Duration::from_secs(1),
        ..test_config(Setup::MemCpu, r)
    })
    .expect("init");
    faults.stall_link(0, 1);
    let results = each(&comms, |_, c| {
        c.all_reduce_in_place(&mut [1i64; 8], ReduceOp::Sum)
    });
    let e = results[1]
        .as_ref()
        .expect_err("rank 1 never hears from rank 0");
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(
        e.to_string().contains("waiting for data from rank 0 (host"),
        "{e}"
    );
}

#[test]
fn a_rank_that_never_arrives_is_named() {
    let store = Arc::new(MemoryStore::new());
    let secret = Secret([5; 16]);
    let start = Instant::now();
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let store = store.clone();
                s.spawn(move || {
                    let config = CommConfig {
                        init_timeout: Duration::from_millis(500),
                        ..CommConfig::default()
                    };
                    Communicator::init_with_store(r, 3, store, secret, config)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("join")).collect()
    });
    for r in results {
        let e = r.expect_err("rank 2 never comes");
        assert!(
            matches!(&e, Error::BootstrapTimeout { missing, .. } if missing == &[2]),
            "{e}"
        );
    }
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_stranger_on_the_store_port_does_not_stop_init() {
    use std::io::Write;
    let id = UniqueId::new("127.0.0.1".parse().expect("ip")).expect("id");
    let comms: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| s.spawn(move || Communicator::init(r, 3, &id, short(Setup::TcpCpu, r))))
            .collect();
        // Strangers knock while the ranks rendezvous: garbage, and one with the wrong secret.
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            if let Ok(mut s) = std::net::TcpStream::connect(id.addr) {
                let _ = s.write_all(b"\x00\xffGARBAGE GARBAGE\r\n");
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let wrong = bcl_transport::store::TcpStore::connect(
            id.addr,
            &Secret([0; 16]),
            Instant::now() + Duration::from_secs(5),
        );
        assert!(
            wrong.is_err(),
            "a client with the wrong secret was admitted"
        );
        hs.into_iter()
            .map(|h| h.join().expect("join").expect("init despite strangers"))
            .collect()
    });
    let results = each(&comms, |r, c| {
        let mut v = [r as u8; 3];
        c.all_reduce_in_place(&mut v, ReduceOp::Max).map(|_| v)
    });
    for r in results {
        assert_eq!(r.expect("allreduce"), [2u8; 3]);
    }
}

#[test]
fn both_ranks_send_then_receive_without_mismatching() {
    // The exchange pattern: each rank sends to the other first, then receives. Sequence
    // numbers of point-to-point messages count each direction separately.
    let comms = Communicator::init_threads_with(2, |r| short(Setup::TcpCpu, r)).expect("init");
    let results = each(&comms, |r, c| {
        let peer = 1 - r;
        let mut got = vec![0u32; 100];
        for round in 0..3u32 {
            c.send(&vec![r as u32 * 10 + round; 100], peer)?;
            c.recv(&mut got, peer)?;
            assert_eq!(got, vec![peer as u32 * 10 + round; 100]);
        }
        // And the other order on one side only.
        if r == 0 {
            c.recv(&mut got, peer)?;
            c.send(&[7u32; 100], peer)?;
        } else {
            c.send(&[8u32; 100], peer)?;
            c.recv(&mut got, peer)?;
        }
        Ok::<_, Error>(got[0])
    });
    assert_eq!(results[0].as_ref().expect("rank 0"), &8);
    assert_eq!(results[1].as_ref().expect("rank 1"), &7);
}

#[test]
fn strangers_on_the_health_port_are_refused_and_change_nothing() {
    use std::io::{Read, Write};
    let comms = Communicator::init_threads_with(2, |r| short(Setup::TcpCpu, r)).expect("init");
    let health: std::net::SocketAddr = comms[0].peers()[0]
        .health
        .as_deref()
        .expect("health channel on by default")
        .parse()
        .expect("address");
    // Garbage, a wrong-secret client, and a silent connection that is left open.
    let mut garbage = std::net::TcpStream::connect(health).expect("connect");
    garbage.write_all(&[0xff; 4096]).expect("write");
    let mut wrong = std::net::TcpStream::connect(health).expect("connect");
    let refused =
        bcl_transport::auth::exchange::client(&mut wrong, &Secret([9; 16]), b"bcl-health-v1");
    assert!(refused.is_err(), "a client without the secret was accepted");
    let _silent = std::net::TcpStream::connect(health).expect("connect");
    garbage
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut sink = Vec::new();
    let _ = garbage.read_to_end(&mut sink);
    let results = each(&comms, |_, c| {
        let mut v = [2u64; 16];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).map(|_| v)
    });
    for r in results {
        assert_eq!(r.expect("allreduce after strangers"), [4u64; 16]);
    }
    assert!(comms[0].async_error().is_none() && comms[1].async_error().is_none());
}

#[test]
fn a_desync_on_large_messages_is_caught_by_the_separate_signature_frame() {
    // 4 MiB per rank: the signature travels in its own frame ahead of the data.
    let comms = Communicator::init_threads_with(3, |r| short(Setup::TcpCpu, r)).expect("init");
    let results = each(&comms, |r, c| {
        let op = if r == 2 { ReduceOp::Max } else { ReduceOp::Sum };
        c.all_reduce_in_place(&mut vec![1f32; 1 << 20], op)
    });
    for (r, res) in results.into_iter().enumerate() {
        let e = res.expect_err("op mismatch must fail");
        assert!(failed_by(&e, Cause::Desync), "rank {r}: {e}");
        let text = e.to_string();
        assert!(
            text.contains("allreduce #1 (1048576 x float max")
                && text.contains("allreduce #1 (1048576 x float sum"),
            "rank {r}: {e}"
        );
    }
}
