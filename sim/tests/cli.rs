//! `bcl-sim` as a user runs it: a row too large for its step limit is said, left out, and
//! fails the run only after the rows that fit are printed and written; a `beta-curve` sets
//! each row's links by its size; told a cluster's own links, the selector picks the fastest.

use std::process::Command;

/// bcl-sim's allreduce sweep on 64 ranks (8 hosts of 8), 1 to 64 MiB by fours.
fn sweep() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bcl-sim"));
    c.args([
        "allreduce",
        "--nranks",
        "64",
        "-b",
        "1M",
        "-e",
        "64M",
        "-f",
        "4",
    ]);
    c
}

#[test]
fn a_row_too_large_is_left_out_and_the_sweep_goes_on() {
    let json = std::env::temp_dir().join(format!("bcl-sim-cli-{}.json", std::process::id()));
    let out = sweep()
        .args(["--max-steps", "3000", "--json"])
        .arg(&json)
        .output()
        .expect("bcl-sim runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a left-out row must fail the run:\n{stdout}"
    );
    // 1 and 4 MiB fit in 3000 steps; 16 MiB is refused from the first host's plans, 64 MiB
    // once the plans built reach the limit.
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(rows[0].trim_start().starts_with("1048576 "), "{stdout}");
    assert!(rows[1].trim_start().starts_with("4194304 "), "{stdout}");
    assert!(
        stdout.contains("# 16777216 B: not simulated: too large to simulate: the first host's"),
        "{stdout}"
    );
    assert!(
        stdout.contains("# 67108864 B: not simulated: too large to simulate"),
        "{stdout}"
    );
    assert!(
        stdout.contains("# Avg bus bandwidth"),
        "the footer is printed:\n{stdout}"
    );
    assert!(
        stderr.contains("16777216 B, 67108864 B"),
        "the error names the rows left out: {stderr}"
    );
    let written = std::fs::read_to_string(&json).expect("the JSON rows are written");
    let _ = std::fs::remove_file(&json);
    // Two rows, each out of place and in place.
    assert_eq!(written.lines().count(), 4, "{written}");
    assert!(
        written.lines().all(|l| l.contains("\"simulated\":true")),
        "{written}"
    );

    // The same sweep within the default limit runs every row.
    let out = sweep().output().expect("bcl-sim runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| !l.starts_with('#')).count(),
        4,
        "{stdout}"
    );
}

/// The out-of-place times (µs) of a 2-rank local allreduce sweep, 64 KiB and 4 MiB.
fn local_times(topology: &str) -> Vec<f64> {
    let args = [
        "allreduce",
        "--nranks",
        "2",
        "-b",
        "64K",
        "-e",
        "4M",
        "-f",
        "64",
    ];
    rows(&args, &["--topology", topology])
        .into_iter()
        .map(|(time, _)| time)
        .collect()
}

/// The rows bcl-sim prints for `args` and `more`: each one's out-of-place time (µs) and
/// algorithm.
fn rows(args: &[&str], more: &[&str]) -> Vec<(f64, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_bcl-sim"))
        .args(args)
        .args(more)
        .output()
        .expect("bcl-sim runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let time = f.get(5).expect("a time column").parse().expect("a number");
            (time, f.last().expect("an algorithm").to_string())
        })
        .collect()
}

#[test]
fn a_beta_curve_slows_the_rows_past_its_knee_and_no_others() {
    let plain = local_times("local,beta=4");
    // By the 2 ranks' bytes together: 4 GB/s at 64 KiB a rank, as the scalar; 1 GB/s from
    // 4 MiB a rank.
    let curve = local_times("local,beta=4,beta-curve=131072:4/8388608:1");
    assert_eq!(plain.len(), 2);
    assert_eq!(curve.len(), 2);
    assert!(
        (curve[0] - plain[0]).abs() <= 1e-9 * plain[0],
        "{curve:?} {plain:?}"
    );
    // A 2-rank ring's 4 MiB row is mostly the link's bytes: 4 times slower links make it
    // more than twice as long.
    assert!(curve[1] > 2.0 * plain[1], "{curve:?} {plain:?}");
}

/// `--rate-stats` says after each row how its changes to the flows were settled: every
/// change one way, and the computations' flows counted.
#[test]
fn rate_stats_account_for_every_change_of_each_row() {
    let out = sweep().arg("--rate-stats").output().expect("bcl-sim runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" B, rates: "))
        .collect();
    assert_eq!(lines.len(), 4, "a line per row:\n{stdout}");
    for line in lines {
        let n: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| !w.is_empty())
            .map(|w| w.parse().expect("a count"))
            .collect();
        // size, changes, kept, computed, flows, flows each
        let (changes, kept, computed, flows) = (n[1], n[2], n[3], n[4]);
        assert!(changes > 0, "{line}");
        assert_eq!(kept + computed, changes, "{line}");
        assert!(computed == 0 || flows >= computed, "{line}");
    }
}

/// The rows of a 1024-rank allreduce sweep (128 hosts of the default cluster), 1 and 2 MiB:
/// each row's (time in µs, algorithm).
fn cluster_rows(topology: &str, algo: &str) -> Vec<(f64, String)> {
    let args = ["allreduce", "--nranks", "1024", "-b", "1M", "-e", "2M"];
    rows(&args, &["--topology", topology, "--algo", algo])
}

/// Told the cluster's own link constants (`links=cluster`, as a deployment sets
/// `BCL_LINK_INSIDE` / `BCL_LINK_BETWEEN`), BCL's selector picks at each size the fastest of
/// the algorithms it weighs, as the simulator times them forced one by one; with its
/// built-in constants (this project's VM, the default) it picks another at 1 MiB.
#[test]
fn told_the_clusters_own_links_the_selector_picks_the_fastest() {
    let own = cluster_rows("cluster,links=cluster", "auto");
    let builtin = cluster_rows("cluster", "auto");
    let forced: Vec<Vec<(f64, String)>> = ["ring", "rd", "hd", "hier-ring", "hier-rd", "hier-hd"]
        .iter()
        .map(|a| cluster_rows("cluster", a))
        .collect();
    assert_eq!(own.len(), 2);
    for (row, (time, algo)) in own.iter().enumerate() {
        let best = forced
            .iter()
            .map(|rows| rows[row].0)
            .fold(f64::INFINITY, f64::min);
        assert!(
            *time <= best * 1.0001,
            "row {row}: auto picks {algo} at {time} µs, the fastest forced takes {best} µs"
        );
    }
    assert_ne!(own[0].1, builtin[0].1, "{own:?} {builtin:?}");
    assert!(builtin[0].0 > own[0].0, "{own:?} {builtin:?}");
}
