//! The C ABI as C programs see it: the header against the library's exports, C programs built
//! by gcc against libbcl.so and libbcl.a on 4 processes, the bad-input program, and a bounded
//! fuzz of the entry points.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where cargo put libbcl.so and libbcl.a for this test build.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    assert!(
        deps.join("libbcl.so").exists(),
        "libbcl.so not built in {}",
        deps.display()
    );
    deps
}

fn out_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("bcl-c-abi-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("out dir");
    d
}

fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Compile `source` (in bcl-ffi/tests/c) against the shared (static = false) or static library.
fn compile(source: &str, name: &str, static_link: bool) -> PathBuf {
    compile_at(
        &root().join("bcl-ffi/tests/c").join(source),
        name,
        static_link,
    )
}

/// Compile the C file at `source` against the shared (static = false) or static library.
fn compile_at(source: &Path, name: &str, static_link: bool) -> PathBuf {
    let (lib, out) = (lib_dir(), out_dir().join(name));
    let mut cmd = Command::new("gcc");
    cmd.args([
        "-std=c99", "-pthread", "-Wall", "-Wextra", "-Werror", "-O1", "-o",
    ])
    .arg(&out)
    .arg(source)
    .arg("-I")
    .arg(root().join("include"));
    if static_link {
        cmd.arg(lib.join("libbcl.a")).args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
        ]);
    } else {
        cmd.arg("-L")
            .arg(&lib)
            .arg("-lbcl")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            // DT_RPATH, searched before LD_LIBRARY_PATH: cargo's test runner puts
            // target/<profile> on that path, where an older libbcl.so may lie (the
            // cdylib there is rebuilt only by `cargo build`).
            .arg("-Wl,--disable-new-dtags");
    }
    run_ok(&mut cmd, &format!("gcc {}", source.display()));
    out
}

#[test]
fn header_declares_exactly_what_the_library_exports_and_compiles_as_c99_and_cpp() {
    let header = std::fs::read_to_string(root().join("include/bcl.h")).expect("bcl.h");
    let mut declared: Vec<String> = header
        .lines()
        .filter_map(|l| {
            let rest = l
                .strip_prefix("bclResult_t ")
                .or_else(|| l.strip_prefix("const char* "))?;
            let name = &rest[..rest.find('(')?];
            (name.starts_with("bcl") && name.chars().all(|c| c.is_ascii_alphanumeric()))
                .then(|| name.to_string())
        })
        .collect();
    declared.sort();
    let nm = run_ok(
        Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(lib_dir().join("libbcl.so")),
        "nm",
    );
    let mut exported: Vec<String> = nm
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|s| s.starts_with("bcl"))
        .map(str::to_string)
        .collect();
    exported.sort();
    assert!(declared.len() >= 25, "parsed only {declared:?}");
    assert_eq!(
        declared, exported,
        "header declarations vs. libbcl.so exports"
    );
    let h = root().join("include/bcl.h");
    run_ok(
        Command::new("gcc")
            .args([
                "-std=c99",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-fsyntax-only",
                "-x",
                "c",
            ])
            .arg(&h),
        "gcc -std=c99",
    );
    run_ok(
        Command::new("g++")
            .args(["-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-x", "c++"])
            .arg(&h),
        "g++",
    );
    // The device-plugin header, as a vendor compiles against it.
    let plugin = root().join("include/bcl_device_plugin.h");
    for (compiler, args) in [
        ("gcc", &["-std=c99", "-pedantic", "-x", "c"][..]),
        ("g++", &["-x", "c++"][..]),
    ] {
        run_ok(
            Command::new(compiler)
                .args(["-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I"])
                .arg(root().join("include"))
                .args(args)
                .arg(&plugin),
            compiler,
        );
    }
}

#[path = "../../bcl-backends/tests/support/mod.rs"]
mod plugin_build;

/// The C program on four processes whose odd ranks compute on the sample device plugin,
/// chosen as a C user would: BCL_DEVICE=plugin:N and BCL_DEVICE_PLUGIN.
#[test]
fn c_program_with_ranks_on_a_device_plugin() {
    let exe = compile("collectives.c", "collectives-plugin", false);
    let plugin = plugin_build::sample_plugin(&[]);
    run_ranks_with(4, "collectives on plugin ranks", |r| {
        let mut c = Command::new(&exe);
        if r % 2 == 1 {
            c.env("BCL_DEVICE", format!("plugin:{}", r / 2))
                .env("BCL_DEVICE_PLUGIN", &plugin);
        }
        c
    });
}

/// Start `n` rank processes made by `command(rank)` with the launcher variables set, and check
/// each prints "rank R OK" and exits 0 within a bounded time.
fn run_ranks_with(n: usize, what: &str, command: impl Fn(usize) -> Command) {
    // One world at a time: the unique id names a port that was free when it was made, and
    // another test's world starting meanwhile could take it before rank 0 binds it (CI saw
    // "store: binding: Address already in use").
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let id = bcl_core::UniqueId::new("127.0.0.1".parse().expect("ip")).expect("id");
    let children: Vec<Child> = (0..n)
        .map(|r| {
            command(r)
                .env("BCL_RANK", r.to_string())
                .env("BCL_WORLD_SIZE", n.to_string())
                .env("BCL_UNIQUE_ID", id.to_string())
                .env("BCL_TIMEOUT_S", "30")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    for (r, mut c) in children.into_iter().enumerate() {
        while c.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("{what} rank {r} hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = c.wait_with_output().expect("output");
        assert!(
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).contains(&format!("rank {r} OK")),
            "{what} rank {r}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn run_ranks(exe: &Path, n: usize) {
    run_ranks_with(n, &exe.display().to_string(), |_| Command::new(exe));
}

#[test]
fn c_program_on_four_processes_with_the_shared_library() {
    run_ranks(&compile("collectives.c", "collectives-shared", false), 4);
}

#[test]
fn c_program_on_four_processes_with_the_static_library() {
    run_ranks(&compile("collectives.c", "collectives-static", true), 4);
}

#[test]
fn collectives_on_a_host_stream_return_at_once_and_run_in_order() {
    run_ranks(&compile("host_stream.c", "host-stream", false), 4);
}

#[test]
fn counts_that_differ_between_ranks_are_a_mismatch_then_poison() {
    run_ranks(&compile("mismatch.c", "mismatch", false), 2);
}

#[test]
fn abort_from_another_thread_fails_the_call_in_flight_on_every_rank() {
    run_ranks(&compile("abort.c", "abort", false), 2);
}

/// The timing harness of `scripts/compare-baselines.sh` (the MPI harness of the baselines,
/// ported onto bcl.h), started by OpenMPI's mpirun as in the comparison: every size's result
/// checked by the harness itself, out of place and in place.
#[test]
fn allreduce_timing_harness_runs_under_mpirun_and_checks_its_results() {
    let exe = compile_at(
        &root().join("benches/c/bcl_allreduce_bench.c"),
        "bcl-allreduce-bench",
        false,
    );
    for in_place in [false, true] {
        let mut cmd = Command::new("timeout");
        cmd.args([
            "120",
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "3",
        ])
        .args(["-x", "BCL_TRANSPORT=tcp", "-x", "BCL_TIMEOUT_S=30"])
        .arg(&exe)
        .args(["-s", "8,1K,64K,1M,3M", "-t", "0.02", "-m", "3", "-w", "2"]);
        if in_place {
            cmd.arg("-i");
        }
        let out = run_ok(&mut cmd, "mpirun bcl_allreduce_bench");
        assert!(
            out.contains("ranks=3 ") && out.contains(&format!("inplace={}", u8::from(in_place))),
            "{out}"
        );
        let rows: Vec<Vec<&str>> = out
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim_start().starts_with("size_B"))
            .map(|l| l.split_whitespace().collect())
            .filter(|r: &Vec<&str>| !r.is_empty())
            .collect();
        let sizes: Vec<&str> = rows.iter().map(|r| r[0]).collect();
        assert_eq!(sizes, ["8", "1024", "65536", "1048576", "3145728"], "{out}");
        for r in &rows {
            assert_eq!(r.len(), 10, "{out}");
            assert_eq!(r[9], "ok", "the harness found a wrong result: {out}");
            let median: f64 = r[3].parse().expect("median_us");
            assert!(median > 0.0, "{out}");
        }
    }
}

#[test]
fn bad_input_from_c_gives_codes_and_messages() {
    let exe = compile("bad_input.c", "bad-input", false);
    let out = run_ok(&mut Command::new(&exe), "bad_input");
    assert!(out.contains("bad input OK"), "{out}");
}

#[test]
fn python_ctypes_client_on_four_processes_matches_numpy() {
    let script = root().join("bcl-ffi/tests/python/allreduce_numpy.py");
    let probe = Command::new("python3")
        .args(["-c", "import numpy"])
        .output();
    assert!(
        matches!(&probe, Ok(o) if o.status.success()),
        "python3 with numpy is required (.ci/run installs it: pip install numpy)"
    );
    run_ranks_with(4, "python", |_| {
        let mut cmd = Command::new("python3");
        cmd.arg(&script)
            .env("BCL_LIBRARY", lib_dir().join("libbcl.so"));
        cmd
    });
}

#[test]
fn c_program_splits_survives_a_dead_rank_by_shrinking_and_shrinks_after_a_revoke() {
    let exe = compile("lifecycle.c", "lifecycle", false);
    run_ranks(&exe, 4);
}
