//! The conformance suite per transport × backend × world size: every collective, dtype and
//! op, in and out of place, counts {0, 1, 7, 1000} and a 2^20 subset, checked element by
//! element against closed-form values.

use bcl_tests::{Setup, conformance};

macro_rules! suite {
    ($($name:ident: $setup:expr, $world:expr;)*) => {
        $(#[test] fn $name() { conformance($setup, $world); })*
    };
}

suite! {
    mem_cpu_1: Setup::MemCpu, 1;
    mem_cpu_2: Setup::MemCpu, 2;
    mem_cpu_3: Setup::MemCpu, 3;
    mem_cpu_4: Setup::MemCpu, 4;
    mem_cpu_7: Setup::MemCpu, 7;
    mem_cpu_8: Setup::MemCpu, 8;
    tcp_cpu_1: Setup::TcpCpu, 1;
    tcp_cpu_2: Setup::TcpCpu, 2;
    tcp_cpu_3: Setup::TcpCpu, 3;
    tcp_cpu_4: Setup::TcpCpu, 4;
    tcp_cpu_7: Setup::TcpCpu, 7;
    tcp_cpu_8: Setup::TcpCpu, 8;
    tcp_mixed_2: Setup::TcpMixed, 2;
    tcp_mixed_3: Setup::TcpMixed, 3;
    tcp_mixed_4: Setup::TcpMixed, 4;
    tcp_mixed_7: Setup::TcpMixed, 7;
    tcp_mixed_8: Setup::TcpMixed, 8;
    shm_cpu_1: Setup::ShmCpu, 1;
    shm_cpu_2: Setup::ShmCpu, 2;
    shm_cpu_3: Setup::ShmCpu, 3;
    shm_cpu_4: Setup::ShmCpu, 4;
    shm_cpu_7: Setup::ShmCpu, 7;
    shm_cpu_8: Setup::ShmCpu, 8;
    shm_mixed_2: Setup::ShmMixed, 2;
    shm_mixed_3: Setup::ShmMixed, 3;
    shm_mixed_4: Setup::ShmMixed, 4;
    shm_mixed_7: Setup::ShmMixed, 7;
    shm_mixed_8: Setup::ShmMixed, 8;
    shm_mixed_staged_2: Setup::ShmMixedStaged, 2;
    shm_mixed_staged_3: Setup::ShmMixedStaged, 3;
    shm_mixed_staged_4: Setup::ShmMixedStaged, 4;
}

/// Over RDMA verbs: these need a device, so they run inside the Soft-RoCE VM
/// (`scripts/rdma-vm-test.sh`, which `.ci/run` calls) with `--ignored rdma_`.
#[cfg(feature = "rdma")]
mod rdma {
    use bcl_tests::{Setup, conformance};

    macro_rules! rdma_suite {
        ($($name:ident: $setup:expr, $world:expr;)*) => {
            $(
                #[test]
                #[ignore = "needs an RDMA device: scripts/rdma-vm-test.sh runs it in the Soft-RoCE VM"]
                fn $name() { conformance($setup, $world); }
            )*
        };
    }

    rdma_suite! {
        rdma_cpu_2: Setup::RdmaCpu, 2;
        rdma_cpu_4: Setup::RdmaCpu, 4;
        rdma_mixed_2: Setup::RdmaMixed, 2;
        rdma_mixed_4: Setup::RdmaMixed, 4;
        rdma_two_devices_4: Setup::RdmaTwoDevices, 4;
    }
}

/// Halving-doubling forced (the cost model offers it only for large messages on tcp): every
/// allreduce case of the suite, in and out of place, every dtype and op, on world sizes that
/// are and are not powers of two, over tcp with mixed devices and over shared memory.
#[test]
fn allreduce_by_halving_doubling_forced() {
    use bcl_core::{Collective, CommConfig, Communicator, schedule::Algorithm};
    use bcl_tests::{cases, run_cases, test_config};
    for (setup, world) in [
        (Setup::TcpMixed, 3),
        (Setup::TcpMixed, 4),
        (Setup::ShmCpu, 6),
    ] {
        let comms = Communicator::init_threads_with(world, |r| CommConfig {
            algorithm: Some(Algorithm::HalvingDoubling),
            ..test_config(setup, r)
        })
        .unwrap_or_else(|e| panic!("init of {world} ranks for {setup:?} failed: {e}"));
        let allreduce: Vec<_> = cases(world)
            .into_iter()
            .filter(|c| matches!(c.collective, Collective::AllReduce { .. }))
            .collect();
        let failures = run_cases(&comms, &allreduce);
        assert!(
            failures.is_empty(),
            "{setup:?}, {world} ranks, halving-doubling: {} failures:\n{}",
            failures.len(),
            failures[..failures.len().min(20)].join("\n")
        );
    }
}
