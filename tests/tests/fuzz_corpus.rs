//! The fuzz targets' committed corpus (`fuzz/corpus/TARGET/`: seeds, and every input that
//! once crashed a target, kept as its regression test) replayed through the same harnesses
//! under `cargo test`, on stable and without sanitizers. `scripts/fuzz.sh` searches for new
//! inputs; this makes sure the old ones stay fixed.

use std::path::PathBuf;

fn replay(target: &str, harness: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus of {target} ({}): {e}", dir.display()));
    let mut n = 0;
    for entry in entries {
        let path = entry.expect("a corpus entry").path();
        let data = std::fs::read(&path).expect("a corpus file");
        let name = path.display().to_string();
        if let Err(e) = std::panic::catch_unwind(|| harness(&data)) {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{target}: {name} fails: {why}");
        }
        n += 1;
    }
    assert!(n > 0, "the corpus of {target} is empty");
}

#[test]
fn tcp_frames() {
    replay("tcp_frames", bcl_transport::fuzzing::tcp_frames);
}

#[test]
fn handshake_server() {
    replay("handshake_server", bcl_transport::fuzzing::handshake_server);
}

#[test]
fn handshake_client() {
    replay("handshake_client", bcl_transport::fuzzing::handshake_client);
}

#[test]
fn store_requests() {
    replay("store_requests", bcl_transport::fuzzing::store_requests);
}

#[test]
fn shm_ring() {
    replay("shm_ring", bcl_transport::fuzzing::shm_ring);
}

/// Run with the rdma feature (scripts/rdma-vm-test.sh runs this suite so).
#[cfg(feature = "rdma")]
#[test]
fn rdma_wire() {
    replay("rdma_wire", bcl_transport::fuzzing::rdma_wire);
}

#[test]
fn health_messages() {
    replay("health_messages", bcl_core::fuzzing::health_messages);
}

#[test]
fn unique_id() {
    replay("unique_id", bcl_core::fuzzing::unique_id);
}

#[test]
fn settings() {
    replay("settings", bcl_core::fuzzing::settings);
}

#[test]
fn launcher() {
    replay("launcher", bcl_core::fuzzing::launcher);
}

#[test]
fn bench_args() {
    replay("bench_args", bcl_bench::fuzzing::bench_args);
}
