//! The conformance suite through the sample device plugin (`examples/device-plugin`, C):
//! rings that mix ranks on plugin devices with cpu ranks, over shared memory, TCP and the
//! in-process transport, chosen with the spec strings a user writes (`plugin:N` and
//! `BCL_DEVICE_PLUGIN`); and a broken plugin fails init naming the rank, the file and the entry.

#[path = "../../bcl-backends/tests/support/mod.rs"]
mod plugin_build;

use bcl_core::{CommConfig, Communicator, DeviceSpec, Error, TransportKind};
use bcl_tests::{Setup, suite, test_config};
use std::path::Path;

/// Odd ranks on the plugin's two devices in turn, even ranks on the cpu.
fn mixed(setup: Setup, rank: usize, plugin: &Path) -> CommConfig {
    let mut c = test_config(setup, rank);
    if rank % 2 == 1 {
        c.device = format!("plugin:{}", (rank / 2) % 2)
            .parse::<DeviceSpec>()
            .expect("spec");
        c.device_plugin = Some(plugin.to_path_buf());
    }
    c
}

fn run(setup: Setup, world: usize) {
    let plugin = plugin_build::sample_plugin(&[]);
    let comms = Communicator::init_threads_with(world, |r| mixed(setup, r, &plugin))
        .unwrap_or_else(|e| panic!("init of {world} ranks for {setup:?} + plugin failed: {e}"));
    assert_eq!(comms[1].accelerator().info().to_string(), "arena:0");
    suite(&format!("{setup:?} with plugin ranks"), &comms, false);
}

#[test]
fn conformance_shm_with_plugin_ranks_4() {
    run(Setup::ShmCpu, 4);
}

#[test]
fn conformance_tcp_with_plugin_ranks_3() {
    run(Setup::TcpCpu, 3);
}

#[test]
fn conformance_mem_with_plugin_ranks_2() {
    run(Setup::MemCpu, 2);
}

#[test]
fn a_broken_plugin_fails_init_naming_the_rank_the_file_and_the_entry() {
    let plugin = plugin_build::sample_plugin(&["-DARENA_BROKEN_NULL_ENTRY"]);
    let config = CommConfig {
        device: DeviceSpec::Plugin(0),
        device_plugin: Some(plugin.clone()),
        transport: TransportKind::Auto,
        ..test_config(Setup::MemCpu, 0)
    };
    let e = Communicator::init_threads(1, config).expect_err("the plugin is broken");
    let text = e.to_string();
    assert!(matches!(e, Error::Device { rank: 0, .. }), "{text}");
    assert!(text.contains(&plugin.display().to_string()), "{text}");
    assert!(text.contains("entry divide is NULL"), "{text}");
}
