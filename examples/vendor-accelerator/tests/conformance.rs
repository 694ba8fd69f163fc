//! The conformance suite on ranks whose device is the paged accelerator of this crate, passed
//! in through the public API (`CommBuilder::accelerator`), in rings mixed with cpu ranks and
//! alone, over shared memory, TCP and the in-process transport.

use bcl_core::{CommBuilder, Communicator, Vendor};
use bcl_example_vendor::PagedDevice;
use bcl_tests::{Setup, suite, test_config};
use std::sync::Arc;

/// `world` ranks over `setup`'s transport; the ranks `paged` picks compute on a PagedDevice.
fn comms(setup: Setup, world: usize, paged: impl Fn(usize) -> bool) -> Vec<Communicator> {
    Communicator::init_threads_built(world, |rank| {
        let builder = CommBuilder::new(test_config(setup, rank));
        if !paged(rank) {
            return builder;
        }
        match PagedDevice::new(rank as u32) {
            Ok(device) => builder.accelerator(Arc::new(device)),
            Err(e) => panic!("paged device {rank}: {e}"),
        }
    })
    .unwrap_or_else(|e| panic!("init of {world} ranks over {setup:?}: {e}"))
}

#[test]
fn paged_ranks_beside_cpu_ranks_over_shared_memory() {
    let comms = comms(Setup::ShmCpu, 3, |r| r != 1);
    assert_eq!(
        comms[0].accelerator().info().vendor,
        Vendor::Other("paged".into())
    );
    assert_eq!(comms[1].accelerator().info().vendor, Vendor::Cpu);
    suite("shm, paged + cpu", &comms, false);
}

#[test]
fn paged_ranks_beside_cpu_ranks_over_tcp() {
    suite(
        "tcp, paged + cpu",
        &comms(Setup::TcpCpu, 2, |r| r == 0),
        false,
    );
}

#[test]
fn every_rank_paged_in_process() {
    suite("mem, all paged", &comms(Setup::MemCpu, 4, |_| true), false);
}

/// A transport passed in (`CommBuilder::transport`): each rank's endpoint of an in-process
/// fabric, handed over as a `Box<dyn Transport>` as a vendor's network would be; the links
/// report it by the name it declares, and the suite passes over it with paged ranks.
#[test]
fn a_transport_passed_in_carries_the_suite() {
    use bcl_core::transport::mem::MemFabric;
    use bcl_core::{LinkKind, TransportKind};
    let world = 3;
    let fabric = MemFabric::new(world);
    let comms = Communicator::init_threads_built(world, |rank| {
        let mut config = test_config(Setup::MemCpu, rank);
        config.transport = TransportKind::Tcp; // what the builder's transport replaces
        let builder = CommBuilder::new(config).transport(Box::new(fabric.endpoint(rank)));
        match (rank, PagedDevice::new(rank as u32)) {
            (1, Ok(device)) => builder.accelerator(Arc::new(device)),
            (1, Err(e)) => panic!("paged device: {e}"),
            _ => builder,
        }
    })
    .unwrap_or_else(|e| panic!("init with a transport passed in: {e}"));
    assert_eq!(comms[0].link(1), Some(LinkKind::Custom("mem")));
    assert_eq!(comms[2].link(0), Some(LinkKind::Custom("mem")));
    suite("a transport passed in, paged + cpu", &comms, false);
}
