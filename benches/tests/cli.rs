//! `bcl-bench` end to end, as a user runs it: local rank processes, threads, every dtype and
//! op, the JSON rows, and refusal of bad flags.

use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_bcl-bench");

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BENCH)
        .args(args)
        .env("BCL_TIMEOUT_S", "60")
        .output()
        .expect("run bcl-bench");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The data rows of the table: (size, count, type, redop, #wrong out-of-place, #wrong in-place).
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn allreduce_on_four_mixed_processes_prints_nccl_tests_table() {
    let json = std::env::temp_dir().join(format!("bcl-bench-{}.json", std::process::id()));
    let (code, out, err) = run(&[
        "allreduce",
        "--nranks",
        "4",
        "--devices",
        "cpu,sim",
        "-b",
        "8",
        "-e",
        "1M",
        "-f",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        "--json",
        json.to_str().expect("path"),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(
            "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        ),
        "{out}"
    );
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains("# Avg bus bandwidth"), "{out}");
    // Local processes under the default transport (auto) talk through shared memory.
    assert!(
        out.contains("#  Links of rank 0: 1=shm 2=shm 3=shm"),
        "{out}"
    );
    assert!(out.contains("device sim:"), "{out}");
    let rows = rows(&out);
    let sizes: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(sizes, ["8", "64", "512", "4096", "32768", "262144"]);
    for r in &rows {
        // The last column names the algorithm the row ran with.
        assert_eq!(r.len(), 14, "{r:?}");
        assert!(
            r[13].parse::<bcl_core::schedule::Algorithm>().is_ok(),
            "{r:?}"
        );
        assert_eq!(
            (r[2].as_str(), r[3].as_str(), r[8].as_str(), r[12].as_str()),
            ("float", "sum", "0", "0")
        );
    }
    let text = std::fs::read_to_string(&json).expect("json written");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json row"))
        .collect();
    assert_eq!(lines.len(), 12, "one object per row and placement");
    let first = &lines[0];
    for key in [
        "collective",
        "nranks",
        "devices",
        "transport",
        "size_bytes",
        "count",
        "dtype",
        "redop",
        "in_place",
        "time_us",
        "algbw_gbs",
        "busbw_gbs",
        "wrong",
    ] {
        assert!(first.get(key).is_some(), "missing {key} in {first}");
    }
    assert_eq!(first["nranks"], 4);
    assert_eq!(lines[1]["in_place"], true);
    let _ = std::fs::remove_file(json);
}

#[test]
fn every_collective_dtype_and_op_in_threads_is_right() {
    for collective in [
        "allreduce",
        "allgather",
        "reducescatter",
        "broadcast",
        "reduce",
        "alltoall",
        "gather",
        "scatter",
        "sendrecv",
    ] {
        let (code, out, err) = run(&[
            collective,
            "--threads",
            "--nranks",
            "3",
            "-d",
            "all",
            "-o",
            "all",
            "-b",
            "48",
            "-e",
            "48",
            "-n",
            "1",
            "-w",
            "0",
            "-r",
            "1",
        ]);
        assert_eq!(code, 0, "{collective}: {out}\n{err}");
        let rows = rows(&out);
        let expected = if matches!(collective, "allreduce" | "reducescatter" | "reduce") {
            50
        } else {
            10
        };
        assert_eq!(rows.len(), expected, "{collective}: {out}");
        assert!(
            rows.iter().all(|r| r[8] == "0" && r[12] == "0"),
            "{collective}: {out}"
        );
    }
}

#[test]
fn tcp_between_threads_and_bus_bandwidth_factor() {
    let (code, out, err) = run(&[
        "allgather",
        "--threads",
        "--transport",
        "tcp",
        "--nranks",
        "2",
        "-b",
        "1M",
        "-e",
        "1M",
        "-n",
        "2",
        "-w",
        "1",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("#  Links of rank 0: 1=tcp"), "{out}");
    let r = &rows(&out)[0];
    // allgather busbw = algbw × (n-1)/n = algbw / 2 for 2 ranks.
    let (alg, bus): (f64, f64) = (r[6].parse().expect("algbw"), r[7].parse().expect("busbw"));
    assert!((bus - alg / 2.0).abs() <= 0.011, "{r:?}");
}

#[test]
fn bad_flags_are_refused() {
    for args in [
        vec!["allreduce", "-d", "float128"],
        vec!["allreduce", "-o", "xor"],
        vec!["allreduce", "--devices", "tpu"],
        vec!["allreduce", "--nranks", "2", "-r", "5"],
        vec![
            "allreduce",
            "--transport",
            "carrier-pigeon",
            "--nranks",
            "1",
        ],
    ] {
        let (code, out, err) = run(&args);
        assert_ne!(code, 0, "{args:?} was accepted: {out}");
        assert!(!err.is_empty(), "{args:?}: no error message");
    }
    // Numeric flags and settings out of range: exit 2 with a message naming the flag (or
    // the variable) and the value; never a panic.
    /// Flags, environment, and the words the error must hold.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case<'_>; 17] = [
        (&["--timeout=-1"], &[], "--timeout='-1'"),
        (&["--timeout", "inf"], &[], "--timeout='inf'"),
        (&["--timeout", "nan"], &[], "--timeout='NaN'"),
        (&["--timeout", "1e400"], &[], "--timeout='inf'"),
        (&["--timeout", "1e300"], &[], "--timeout="),
        (&["-n", "0"], &[], "-n/--iters='0'"),
        (&["-f", "0"], &[], "-f/--stepfactor='0'"),
        (&["-c", "2"], &[], "-c/--check='2'"),
        (&["--nranks", "0"], &[], "--nranks='0'"),
        (&["--nranks", "100000"], &[], "--nranks='100000'"),
        (&["--sockets-per-peer", "0"], &[], "--sockets-per-peer='0'"),
        (&["--slice-bytes", "1"], &[], "--slice-bytes='1'"),
        (&["-b", "64M", "-e", "8"], &[], "larger than -e"),
        (
            &["--nranks", "4", "--recover", "4"],
            &[],
            "--recover 4 needs a rank below",
        ),
        (
            &["--nranks", "2", "--recover", "1"],
            &[],
            "at least 3 ranks",
        ),
        (
            &["--threads", "--nranks", "4", "--recover", "1"],
            &[],
            "--recover kills a rank's process",
        ),
        (
            &["--threads", "--nranks", "1"],
            &[("BCL_TIMEOUT_S", "-1")],
            "BCL_TIMEOUT_S='-1'",
        ),
    ];
    for (flags, env, words) in cases {
        let out = Command::new(BENCH)
            .arg("allreduce")
            .args(flags)
            .envs(env.iter().copied())
            .output()
            .expect("run bcl-bench");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{flags:?} {env:?} was accepted");
        assert!(
            err.contains(words),
            "{flags:?} {env:?}: `{words}` missing from: {err}"
        );
        assert!(
            !err.contains("panicked"),
            "{flags:?} {env:?} panicked: {err}"
        );
    }
}

/// `--devices plugin:0,cpu` with `BCL_DEVICE_PLUGIN`: ranks on the sample device plugin's
/// devices beside cpu ranks, every result right.
#[test]
fn allreduce_with_ranks_on_a_device_plugin() {
    let plugin = plugin_build::sample_plugin(&[]);
    let out = Command::new(BENCH)
        .args([
            "allreduce",
            "--nranks",
            "4",
            "--devices",
            "plugin:0,cpu,plugin:1",
        ])
        .args([
            "-b", "8", "-e", "1M", "-f", "32", "-n", "2", "-w", "1", "-d", "all",
        ])
        .env("BCL_DEVICE_PLUGIN", &plugin)
        .env("BCL_TIMEOUT_S", "60")
        .output()
        .expect("run bcl-bench");
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{err}");
    assert!(stdout.contains("device arena:0"), "{stdout}");
    let rows = rows(&stdout);
    assert_eq!(rows.len(), 4 * 10, "{stdout}");
    for r in &rows {
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "{r:?}");
    }
}

#[path = "../../bcl-backends/tests/support/mod.rs"]
mod plugin_build;

#[test]
fn a_worker_killed_mid_sweep_makes_the_bench_print_the_verdict_and_fail() {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let mut bench = Command::new(BENCH)
        .args([
            "allreduce",
            "--nranks",
            "3",
            "-b",
            "4M",
            "-e",
            "4M",
            "-n",
            "100000",
            "-w",
            "1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run bcl-bench");
    // Find the rank processes (children of the launcher) once they are all up.
    let deadline = Instant::now() + Duration::from_secs(30);
    let workers = loop {
        let out = Command::new("pgrep")
            .args(["-P", &bench.id().to_string()])
            .output()
            .expect("pgrep (procps)");
        let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        if pids.len() == 3 {
            break pids;
        }
        assert!(Instant::now() < deadline, "the 3 ranks never started");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(1500));
    let victim = &workers[1];
    assert!(
        Command::new("kill")
            .args(["-KILL", victim])
            .status()
            .expect("kill")
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = bench.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = bench.kill();
            panic!("bcl-bench did not exit after a rank was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    bench
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert!(
        !status.success(),
        "bcl-bench succeeded without a rank: {err}"
    );
    assert!(
        err.contains(&format!("pid {victim}, cpu:")) && err.contains(") died"),
        "no verdict naming the killed rank (pid {victim}): {err}"
    );
}

#[test]
fn health_flag_prints_the_link_matrix_and_names_a_slow_device() {
    let (code, out, err) = run(&[
        "allreduce",
        "--nranks",
        "4",
        "--devices",
        "cpu,cpu,sim:copy=1:reduce=1,cpu",
        "-b",
        "1M",
        "-e",
        "4M",
        "-n",
        "100",
        "-w",
        "5",
        "--health",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("# per-link bandwidth (GB/s"), "{out}");
    assert!(
        out.contains("#  from\\to       0       1       2       3"),
        "{out}"
    );
    assert!(
        out.contains("# slow-node verdict: slow rank 2 (host") && out.contains("sim:"),
        "{out}"
    );
    assert_eq!(out.matches("# slow-node verdict:").count(), 1, "{out}");
}

/// `--recover 1`: rank 1 dies at the start of the middle row; the others shrink, say how long
/// the repair took, and finish the sweep on 3 ranks with every result checked.
#[test]
fn recover_kills_a_rank_mid_sweep_and_the_survivors_finish_it() {
    let json = std::env::temp_dir().join(format!("bcl-bench-recover-{}.json", std::process::id()));
    let mut args: Vec<&str> = "allreduce --nranks 4 -b 8 -e 64K -f 8 -n 2 -w 1 --recover 1 --json"
        .split(' ')
        .collect();
    args.push(json.to_str().expect("path"));
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("# recover: rank 1 was killed") && out.contains("shrank to 3 ranks"),
        "{out}"
    );
    assert!(
        out.contains("first error:") && out.contains("rank 1 ("),
        "{out}"
    );
    assert!(out.contains("Out of bounds values : 0 OK"), "{out}");
    // 8 B .. 32 KiB by 8: 5 rows; rank 1 dies at the start of the third (5 / 2 = 2 rows
    // before it), which the survivors measure again.
    assert_eq!(rows(&out).len(), 5, "{out}");
    let text = std::fs::read_to_string(&json).expect("json");
    let nranks: Vec<u64> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("row")["nranks"]
                .as_u64()
                .expect("nranks")
        })
        .collect();
    assert_eq!(nranks, [4, 4, 4, 4, 3, 3, 3, 3, 3, 3], "{text}");
    let _ = std::fs::remove_file(&json);
}

/// nccl-tests' sendrecv on a ring of cpu and sim ranks (the device path: the sim ranks send
/// from and receive into device buffers), out of place and in place: every element checked,
/// the bus bandwidth equal to the algorithm bandwidth as nccl-tests reports it.
#[test]
fn sendrecv_on_cpu_and_sim_ranks_is_checked_and_reports_busbw_as_algbw() {
    let (code, out, err) = run(&[
        "sendrecv",
        "--threads",
        "--nranks",
        "3",
        "--devices",
        "cpu,sim",
        "-b",
        "1K",
        "-e",
        "256K",
        "-f",
        "16",
        "-n",
        "2",
        "-w",
        "1",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 3, "{out}");
    for r in &rows {
        assert!(r[8] == "0" && r[12] == "0", "wrong elements: {out}");
        assert_eq!(r[6], r[7], "busbw is algbw for sendrecv: {out}");
        assert_eq!(r[10], r[11], "busbw is algbw for sendrecv: {out}");
    }
}

/// `bcl-bench rendezvous` runs both exchanges and reports what the store answered: every rank
/// reads every key in the star (N sets, N² gets); the tree sets each rank's key, each non-root
/// subtree and one table chunk, and reads each subtree once and the table from N - 1 ranks.
#[test]
fn rendezvous_reports_the_requests_each_exchange_asks_of_the_store() {
    let (code, out, err) = run(&["rendezvous", "--nranks", "5,40", "--rounds", "1"]);
    assert_eq!(code, 0, "{err}");
    let rows = rows(&out);
    let find = |n: &str, how: &str| {
        rows.iter()
            .find(|r| r[0] == n && r[1] == how)
            .unwrap_or_else(|| panic!("no {how} row for {n} ranks in:\n{out}"))
            .clone()
    };
    for (n, star, tree) in [
        (5u64, 5 + 25, 9 + 1 + 4 + 4),
        (40, 40 + 1600, 79 + 1 + 39 + 39),
    ] {
        assert_eq!(find(&n.to_string(), "star")[5], star.to_string(), "{out}");
        assert_eq!(find(&n.to_string(), "tree")[5], tree.to_string(), "{out}");
    }
    for bad in [
        &["rendezvous", "--nranks", "0"][..],
        &["rendezvous", "--nranks", "99999"],
        &["rendezvous", "--exchange", "ring"],
        &["rendezvous", "--rounds", "-1"],
        &["rendezvous", "--bogus"],
    ] {
        let (code, _, err) = run(bad);
        assert_eq!(code, 2, "{bad:?} should be refused: {err}");
        assert!(err.contains("rendezvous:"), "{bad:?}: {err}");
    }
}
