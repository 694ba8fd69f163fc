//! `bcl-sim` as a user runs it: a row too large for its step limit is said, left out, and
//! fails the run only after the rows that fit are printed and written.

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
