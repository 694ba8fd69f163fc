//! Collectives with uneven counts on real transports and devices: all-to-all with a count per
//! pair (`Communicator::all_to_all_v`, `bclAllToAllv`, torch's uneven `all_to_all_single`),
//! all-gather and reduce-scatter with a count per rank (`all_gather_v`, `reduce_scatter_v`):
//! every element checked against the closed form, on the blocking path and queued
//! (`submit_host_v`), including empty blocks; counts that disagree between two ranks are a
//! size mismatch, not a hang; bad counts are refused before anything is sent.

use bcl_core::{AllToAllCounts, Collective, Communicator, DataType, Error, ReduceOp};
use bcl_tests::{Setup, test_config};

/// Elements rank `i` sends to rank `j` (some blocks empty, sizes uneven).
fn count(i: usize, j: usize) -> usize {
    (i * 7 + j * 3) % 5
}

/// Element `k` of the block rank `i` sends to rank `j`.
fn value(i: usize, j: usize, k: usize) -> i64 {
    (i * 1_000_000 + j * 1000 + k) as i64
}

fn run(comm: &Communicator, queued: bool) -> Result<(), String> {
    let (me, n) = (comm.rank(), comm.world_size());
    let send_counts: Vec<usize> = (0..n).map(|j| count(me, j)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|i| count(i, me)).collect();
    let send: Vec<i64> = (0..n)
        .flat_map(|j| (0..count(me, j)).map(move |k| value(me, j, k)))
        .collect();
    let mut recv = vec![-1i64; recv_counts.iter().sum()];
    if queued {
        let counts = AllToAllCounts {
            send: send_counts,
            recv: recv_counts,
        };
        recv = owned_v(comm, counts, send, recv).map_err(|e| e.to_string())?;
    } else {
        comm.all_to_all_v(&send, &send_counts, &mut recv, &recv_counts)
            .map_err(|e| e.to_string())?;
    }
    let want: Vec<i64> = (0..n)
        .flat_map(|i| (0..count(i, me)).map(move |k| value(i, me, k)))
        .collect();
    if recv != want {
        return Err(format!("rank {me}: got {recv:?}, want {want:?}"));
    }
    Ok(())
}

/// The queued form, on owned vectors (what the C ABI's host streams use, with raw memory).
fn owned_v(
    comm: &Communicator,
    counts: AllToAllCounts,
    send: Vec<i64>,
    recv: Vec<i64>,
) -> bcl_core::Result<Vec<i64>> {
    #[derive(Debug)]
    struct Buffers(Vec<i64>, Vec<i64>, std::sync::mpsc::Sender<Vec<i64>>);
    impl bcl_core::backends::HostStaged for Buffers {
        fn ready(&self) -> bool {
            true
        }
        fn buffers(&mut self) -> (Option<&[u8]>, Option<&mut [u8]>) {
            (
                Some(bcl_core::backends::bytemuck::cast_slice(&self.0)),
                Some(bcl_core::backends::bytemuck::cast_slice_mut(&mut self.1)),
            )
        }
        fn finish(self: Box<Self>) {
            let _ = self.2.send(self.1);
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let work = comm.submit_host_v(
        Collective::AllToAllV,
        counts,
        DataType::Int64,
        Box::new(Buffers(send, recv, tx)),
    )?;
    work.wait()?;
    rx.recv()
        .map_err(|_| Error::Internal("the queued buffers never came back".into()))
}

/// All-gather and reduce-scatter with rank r's block of `(r * 3) % 4` elements (rank 0 and
/// every fourth: none).
fn per_rank(comm: &Communicator) -> Result<(), String> {
    let (me, n) = (comm.rank(), comm.world_size());
    let block = |r: usize| (r * 3) % 4;
    let counts: Vec<usize> = (0..n).map(block).collect();
    let mine: Vec<i64> = (0..block(me)).map(|k| value(me, 0, k)).collect();
    let mut all = vec![-1i64; counts.iter().sum()];
    comm.all_gather_v(&mine, &mut all, &counts)
        .map_err(|e| e.to_string())?;
    let want: Vec<i64> = (0..n)
        .flat_map(|r| (0..block(r)).map(move |k| value(r, 0, k)))
        .collect();
    if all != want {
        return Err(format!("allgatherv rank {me}: {all:?}, want {want:?}"));
    }
    // Reduce-scatter: rank q's element k of the block for rank r is q + r + k.
    let send: Vec<i64> = (0..n)
        .flat_map(|r| (0..block(r)).map(move |k| (me + r + k) as i64))
        .collect();
    for (op, fold) in [
        (ReduceOp::Sum, (|a, b| a + b) as fn(i64, i64) -> i64),
        (ReduceOp::Max, |a: i64, b: i64| a.max(b)),
    ] {
        let mut got = vec![-1i64; block(me)];
        comm.reduce_scatter_v(&send, &mut got, &counts, op)
            .map_err(|e| e.to_string())?;
        let want: Vec<i64> = (0..block(me))
            .map(|k| {
                (0..n)
                    .map(|q| (q + me + k) as i64)
                    .reduce(fold)
                    .unwrap_or_default()
            })
            .collect();
        if got != want {
            return Err(format!(
                "reducescatterv {op:?} rank {me}: {got:?}, want {want:?}"
            ));
        }
    }
    Ok(())
}

fn on(setup: Setup, world: usize) {
    let comms = Communicator::init_threads_with(world, |r| test_config(setup, r)).expect("init");
    let failures: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut out = Vec::new();
                    for queued in [false, true, false] {
                        if let Err(e) = run(c, queued) {
                            out.push(format!("queued {queued}: {e}"));
                        }
                    }
                    if let Err(e) = per_rank(c) {
                        out.push(e);
                    }
                    out
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("rank thread"))
            .collect()
    });
    assert!(failures.is_empty(), "{setup:?} x {world}: {failures:#?}");
}

#[test]
fn uneven_blocks_arrive_exactly_in_process() {
    for world in [1, 2, 3, 5] {
        on(Setup::MemCpu, world);
    }
}

#[test]
fn uneven_blocks_arrive_exactly_over_shm_and_tcp_with_device_ranks() {
    on(Setup::ShmMixed, 4);
    on(Setup::TcpMixed, 3);
}

#[test]
fn counts_that_disagree_between_two_ranks_are_a_mismatch_and_bad_counts_are_refused() {
    let comms = Communicator::init_threads(2, bcl_core::CommConfig::default()).expect("init");
    // Refused before anything is sent: wrong length, own block different both ways.
    let e = comms[0]
        .all_to_all_v(&[0u8; 2], &[1, 1, 0], &mut [0u8; 2], &[1, 1])
        .expect_err("3 send counts for 2 ranks");
    assert!(e.to_string().contains("3 send counts"), "{e}");
    let e = comms[0]
        .all_to_all_v(&[0u8; 3], &[2, 1], &mut [0u8; 2], &[1, 1])
        .expect_err("own block 2 out, 1 in");
    assert!(e.to_string().contains("sends itself 2 elements"), "{e}");
    // Rank 0 sends 3 to rank 1, which expects 2: rank 1 fails naming rank 0 (rank 0's own
    // side may finish or fail; neither hangs).
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let (send, recv) = if c.rank() == 0 {
                        (vec![1i32, 2, 2, 2], vec![1usize, 1])
                    } else {
                        (vec![5i32, 6], vec![2usize, 1])
                    };
                    let send_counts = if c.rank() == 0 { [1, 3] } else { [1, 1] };
                    let mut out = vec![0i32; recv.iter().sum()];
                    c.all_to_all_v(&send, &send_counts, &mut out, &recv)
                        .map(|()| String::new())
                        .unwrap_or_else(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    assert!(
        errors[1].contains("rank 0") && !errors[1].is_empty(),
        "rank 1 should report the size rank 0 sent: {errors:?}"
    );
}
