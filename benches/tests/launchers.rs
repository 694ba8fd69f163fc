//! `bcl-bench` started the way clusters start jobs: by OpenMPI's `mpirun` (Debian's
//! openmpi-bin, installed by scripts/test.sh; the test fails loudly without it), with the
//! single-host directory rendezvous and with `BCL_ROOT` as on several nodes; and with
//! torchrun's variables. Every row of the table must have `#wrong` 0.

use std::process::{Command, Output};

const BENCH: &str = env!("CARGO_BIN_EXE_bcl-bench");

/// A short allreduce sweep, 8 B to 1 MiB.
const SWEEP: [&str; 11] = [
    "allreduce",
    "-b",
    "8",
    "-e",
    "1M",
    "-f",
    "8",
    "-n",
    "3",
    "-w",
    "1",
];

/// The data rows of the table, checked for `#wrong` 0 in both placements.
fn assert_table_ok(out: &Output, ranks: usize) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}: {stdout}{stderr}",
        out.status.code()
    );
    assert!(stdout.contains(&format!("nranks {ranks} ")), "{stdout}");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(rows.len() >= 3, "too few rows: {stdout}");
    for r in &rows {
        assert_eq!((r[8], r[12]), ("0", "0"), "wrong values: {r:?}\n{stdout}");
    }
    stdout
}

fn mpirun(np: usize, extra: &[&str]) -> Output {
    Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &np.to_string(),
        ])
        .args(extra)
        .arg(BENCH)
        .args(SWEEP)
        .output()
        .expect("mpirun not found: install Debian's openmpi-bin (scripts/test.sh does)")
}

#[test]
fn mpirun_on_one_host_rendezvous_through_a_private_directory() {
    let out = mpirun(4, &[]);
    let table = assert_table_ok(&out, 4);
    assert!(table.contains("Rank  3"), "{table}");
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("bcl-rendezvous-")
        })
        .collect();
    assert!(
        leftovers.is_empty(),
        "rendezvous directories left behind: {leftovers:?}"
    );
}

#[test]
fn mpirun_with_bcl_root_as_on_several_nodes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let root = format!("BCL_ROOT=127.0.0.1:{port}");
    let out = mpirun(3, &["-x", &root]);
    assert_table_ok(&out, 3);
}

#[test]
fn torchrun_variables_rendezvous_at_master_port_plus_one() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let children: Vec<_> = (0..3)
        .map(|rank| {
            Command::new(BENCH)
                .args(SWEEP)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", "3")
                .env("MASTER_ADDR", "localhost")
                .env("MASTER_PORT", (port - 1).to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    assert_table_ok(&outputs[0], 3);
    for o in &outputs[1..] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn srun_on_a_single_node_slurm_cluster() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/slurm-single-node.sh"
    );
    let started = Command::new("timeout")
        .args(["180", "bash", script, "start"])
        .output()
        .expect("run the Slurm setup script");
    assert!(
        started.status.success(),
        "single-node Slurm did not start (needs root and Debian's slurmctld, slurmd, munge): {}",
        String::from_utf8_lossy(&started.stderr)
    );
    // A port known to be free now (the default, derived from the job id, could be taken by
    // another service on a shared machine; BCL_PORT is how a user picks one).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let out = Command::new("srun")
        .env("BCL_PORT", port.to_string())
        .args(["-n", "4", "--overcommit", "-t", "5", BENCH])
        .args(SWEEP)
        .output()
        .expect("srun");
    let _ = Command::new("bash").args([script, "stop"]).status();
    // srun gathers every task's stdout; only rank 0 prints the table.
    let table = assert_table_ok(&out, 4);
    assert_eq!(table.matches("# Avg bus bandwidth").count(), 1, "{table}");
}
