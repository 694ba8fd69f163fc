//! The rdma transport through the communicator. Outside the Soft-RoCE VM there is no device:
//! asking for rdma is a clear error naming the rank and the reason. Inside it
//! (`scripts/rdma-vm-test.sh`, `BCL_RDMA_VM=1`) the same test demands rdma links, and the
//! ignored tests check a collective and a failing device choice. Auto's fallback to tcp when a
//! rank's rdma setup fails is checked with separate processes by the VM script (threads of one
//! process use the in-process transport under auto).
#![cfg(feature = "rdma")]

use bcl_core::LinkKind;
use bcl_core::{CommConfig, Communicator, ReduceOp};
use bcl_tests::{Setup, test_config};

fn in_vm() -> bool {
    std::env::var_os("BCL_RDMA_VM").is_some()
}

fn rdma_config(rank: usize) -> CommConfig {
    test_config(Setup::RdmaCpu, rank)
}

#[test]
fn rdma_links_where_a_device_exists_and_a_clear_error_where_not() {
    let result = Communicator::init_threads_with(2, rdma_config);
    if in_vm() {
        let comms = result.expect("inside the VM, --transport rdma must connect over rxe0");
        for c in &comms {
            let peer = 1 - c.rank();
            assert_eq!(c.link(peer), Some(LinkKind::Rdma), "rank {}", c.rank());
        }
        return;
    }
    let e = result
        .expect_err("no RDMA device on this machine")
        .to_string();
    assert!(
        e.contains("rank ")
            && e.contains("transport rdma was requested but is unavailable")
            && (e.contains("no RDMA devices") || e.contains("libibverbs not available")),
        "{e}"
    );
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm-test.sh runs it in the Soft-RoCE VM"]
fn rdma_allreduce_of_a_large_buffer_over_two_ranks_is_exact() {
    let comms = Communicator::init_threads_with(2, rdma_config).expect("init over rdma");
    let count = 3 << 18; // 3 MiB of f32: many slices, many chunks, the credits cycle.
    let results: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank() as f32;
                    let send: Vec<f32> = (0..count).map(|i| (i % 1000) as f32 + r).collect();
                    let mut recv = vec![0f32; count];
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum)
                        .expect("allreduce");
                    recv
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    for recv in results {
        for (i, v) in recv.iter().enumerate() {
            assert_eq!(*v, 2.0 * (i % 1000) as f32 + 1.0, "element {i}");
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm-test.sh runs it in the Soft-RoCE VM"]
fn rdma_with_a_missing_device_named_is_an_error_naming_the_devices_there_are() {
    let e = Communicator::init_threads_with(2, |rank| CommConfig {
        rdma_device: Some("nosuchdev0".into()),
        ..rdma_config(rank)
    })
    .expect_err("no such device")
    .to_string();
    assert!(
        e.contains("RDMA device nosuchdev0 not found") && e.contains("rxe0"),
        "{e}"
    );
    assert!(e.contains("rank "), "{e}");
}
