//! `bcl-bench` over shared memory on a host whose `/dev/shm` is small, as in a container
//! (Docker gives 64 MiB): a private mount namespace with a tiny tmpfs on `/dev/shm`, created by
//! the test itself with `unshare -m` and `mount` (needs root, as CI is; it fails loudly without).
//! With 16 MiB, 8 ranks shrink their rings to fit and compute the right sums; with 256 KiB,
//! init fails with an error naming `/dev/shm` and the rank, and no process dies of SIGBUS. In
//! both cases no ring name is left behind. With a read-only `/dev/shm`, the default transport
//! (auto) leaves shared memory out and the ranks talk TCP.

use std::process::{Command, Output};

const BENCH: &str = env!("CARGO_BIN_EXE_bcl-bench");

/// Run `bcl-bench args` with a tmpfs mounted with `options` on `/dev/shm`; after it, the
/// namespace's `/dev/shm` is listed on stderr after a `left:` line.
fn under_small_dev_shm(options: &str, args: &[&str]) -> Output {
    let script = format!(
        "mount -t tmpfs -o {options} tmpfs /dev/shm || exit 99; \
         timeout 120 \"$0\" \"$@\"; rc=$?; echo left: >&2; ls /dev/shm >&2; exit $rc"
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script, BENCH])
        .args(args)
        .env("BCL_TIMEOUT_S", "60")
        .env("BCL_INIT_TIMEOUT_S", "30")
        .output()
        .expect("run unshare (util-linux)");
    assert_ne!(
        out.status.code(),
        Some(99),
        "could not mount a tmpfs on /dev/shm in a private mount namespace (root needed): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn left_behind(stderr: &str) -> Vec<&str> {
    stderr
        .split("left:\n")
        .nth(1)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("bcl."))
        .collect()
}

const SWEEP: [&str; 15] = [
    "allreduce",
    "--nranks",
    "8",
    "--transport",
    "shm",
    "-b",
    "8",
    "-e",
    "4M",
    "-f",
    "8",
    "-n",
    "2",
    "-w",
    "1",
];

#[test]
fn eight_ranks_fit_their_rings_into_a_16_mib_dev_shm() {
    let out = under_small_dev_shm("size=16m", &SWEEP);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    assert_eq!(left_behind(&stderr), Vec::<&str>::new(), "{stderr}");
}

#[test]
fn a_dev_shm_without_room_fails_init_with_an_error_naming_it() {
    let out = under_small_dev_shm("size=256k", &SWEEP);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // An exit code, not a signal: nobody died of SIGBUS.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("bootstrap failed: creating shared-memory ring")
            && stderr.contains("KiB free in /dev/shm")
            && stderr.contains("No space left on device"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("SIGBUS") && !stderr.contains("signal"),
        "{stderr}"
    );
    assert_eq!(left_behind(&stderr), Vec::<&str>::new(), "{stderr}");
}

#[test]
fn a_read_only_dev_shm_makes_auto_fall_back_to_tcp() {
    let args = [
        "allreduce",
        "--nranks",
        "2",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "64",
        "-n",
        "2",
        "-w",
        "1",
    ];
    let out = under_small_dev_shm("ro,size=1m", &args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("#  Links of rank 0: 1=tcp"), "{stdout}");
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    assert!(
        stderr.contains("shared memory unavailable; tcp to every peer")
            && stderr.contains("/dev/shm"),
        "the fallback is announced with its reason: {stderr}"
    );
}
