//! Entry points of the fuzz targets (`fuzz/`, run by `scripts/fuzz.sh`) and of the replay of
//! their corpus in `cargo test`: arbitrary bytes fed to the parsers of what reaches a rank
//! from outside (health messages from peers, the unique id's text, `BCL_*` settings, the
//! launchers' variables), checking what must hold whatever they say. Not an API.

use crate::config::CommConfig;
use crate::health::wire::FrameReader;
use crate::launch::{Launch, first_host};
use crate::unique_id::UniqueId;
use std::collections::HashMap;

/// Health-channel bytes from a peer, in pieces (each first byte is a piece's length): every
/// message decodes or the connection is refused, and what waits for the rest of a message
/// stays within one message's limit.
pub fn health_messages(data: &[u8]) {
    let mut reader = FrameReader::default();
    let mut rest = data;
    while let Some((&n, after)) = rest.split_first() {
        let n = usize::from(n).min(after.len());
        reader.push(&after[..n]);
        rest = &after[n..];
        loop {
            match reader.next_message() {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(_) => return, // the connection is dropped
            }
        }
        assert!(
            reader.pending() <= crate::health::wire::MAX_MESSAGE + 4 + 256,
            "the reader holds more than one message and a piece"
        );
    }
}

/// A unique id's text (BCL_UNIQUE_ID, bclGetUniqueId's bytes): parsed or refused; what parses
/// prints back to text that parses to the same id.
pub fn unique_id(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(id) = text.parse::<UniqueId>() {
        let again: UniqueId = id.to_string().parse().expect("an id's own text parses");
        assert_eq!(again, id, "an id changed through its text");
    }
}

/// `NAME=VALUE` lines; NAME by index into the settings and launcher variables BCL reads.
fn variables(data: &[u8], names: &[&'static str]) -> HashMap<&'static str, String> {
    let mut vars = HashMap::new();
    for line in data.split(|&b| b == b'\n') {
        let Some((&which, value)) = line.split_first() else {
            continue;
        };
        let name = names[usize::from(which) % names.len()];
        vars.insert(name, String::from_utf8_lossy(value).into_owned());
    }
    vars
}

const SETTINGS: &[&str] = &[
    "BCL_DEVICE",
    "BCL_TRANSPORT",
    "BCL_SOCKETS_PER_PEER",
    "BCL_SOCKET_BUFFER",
    "BCL_SOCKETS_PER_OP",
    "BCL_RDMA_DEVICE",
    "BCL_RDMA_TCP_FAILOVER",
    "BCL_RDMA_QPS",
    "BCL_BIND_IP",
    "BCL_INIT_TIMEOUT_S",
    "BCL_TIMEOUT_S",
    "BCL_SLICE_BYTES",
    "BCL_ALGO",
    "BCL_HEALTH",
    "BCL_HEARTBEAT_MS",
    "BCL_HANG_TIMEOUT_MS",
    "BCL_DUMP_DIR",
    "BCL_FLIGHT_RECORDER_OPS",
    "BCL_SLOW_WINDOW_MS",
    "BCL_SPIN_US",
];

/// `BCL_*` settings with any values: each is taken or refused with an error naming it, and
/// settings that are taken make a config that validates.
pub fn settings(data: &[u8]) {
    let vars = variables(data, SETTINGS);
    let get = |name: &str| vars.get(name).cloned();
    match CommConfig::default().with_env(&get) {
        Ok(config) => {
            if let Err(e) = config.validate() {
                panic!("settings {vars:?} were taken but do not validate: {e}");
            }
        }
        Err(e) => {
            let text = e.to_string();
            assert!(
                vars.keys().any(|name| text.contains(name)),
                "the error '{text}' names none of {:?}",
                vars.keys().collect::<Vec<_>>()
            );
        }
    }
}

const LAUNCHER: &[&str] = &[
    "BCL_RANK",
    "BCL_WORLD_SIZE",
    "BCL_LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "BCL_UNIQUE_ID",
    "BCL_ROOT",
    "MASTER_ADDR",
    "MASTER_PORT",
    "BCL_PORT",
    "BCL_SECRET",
    "TORCHELASTIC_RUN_ID",
    "PMIX_NAMESPACE",
    "MPI_LOCALNRANKS",
];

/// The launchers' variables with any values: a launch or an error, never a panic; Slurm's
/// node list gives a first host or nothing. Host names that are not IP addresses become
/// 127.0.0.1, so no name lookup leaves the process (reading the variables creates nothing).
pub fn launcher(data: &[u8]) {
    let mut vars = variables(data, LAUNCHER);
    for nodes in ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"] {
        if let Some(list) = vars.get(nodes)
            && let Some(host) = first_host(list)
        {
            assert!(
                !host.is_empty() && !host.contains(','),
                "first host '{host}'"
            );
            if host.parse::<std::net::IpAddr>().is_err() {
                vars.insert(nodes, "127.0.0.1".into());
            }
        }
    }
    if vars
        .get("MASTER_ADDR")
        .is_some_and(|a| a.parse::<std::net::IpAddr>().is_err())
    {
        vars.insert("MASTER_ADDR", "127.0.0.1".into());
    }
    if let Some(root) = vars.get("BCL_ROOT") {
        let port = root.rsplit_once(':').map_or("0", |(_, p)| p).to_string();
        let host = root.rsplit_once(':').map_or("", |(h, _)| h);
        if host.parse::<std::net::IpAddr>().is_err() {
            vars.insert("BCL_ROOT", format!("127.0.0.1:{port}"));
        }
    }
    let get = |name: &str| vars.get(name).cloned();
    if let Ok(launch) = Launch::from_env(&get) {
        assert!(
            launch.rank < launch.world,
            "rank {} of a world of {} was taken ({vars:?})",
            launch.rank,
            launch.world
        );
    }
}
