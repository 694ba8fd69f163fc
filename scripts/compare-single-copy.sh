#!/usr/bin/env bash
# Large allreduce over shared memory with and without single copy, against OpenMPI's shared-
# memory path (vader/sm with CMA single copy), in the baselines' harness (a barrier, then one
# timed allreduce; per iteration the slowest rank; median over ~T s of iterations): BCL's port
# of it on bcl.h with BCL_SINGLE_COPY_BYTES at its default (auto: from 256 KiB on 3+ ranks the
# direct plan; and the ring forced, BCL_ALGO=ring) and at 0 (the copy ring), then OpenMPI, 2
# and 4 ranks, one after the other in every round (this VM flips between a fast and a slow
# state).
#   scripts/compare-single-copy.sh [ROUNDS] [OUTDIR] [SECONDS]
# Writes OUTDIR/<lib>-np<N>-r<k>.txt and OUTDIR/table.md: per case the median of the rounds'
# busbw, and BCL's over OpenMPI's. REUSE=1 makes the table again from OUTDIR's files.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=${2:-/tmp/bcl-single-copy}
secs=${3:-1}
sizes=1M,16M,64M,256M
B=/tmp/bl
[ -x "$B/mpi_allreduce_bench" ] || bash ../shared/tools/baselines/setup.sh "$B"
cargo build --release -q -p bcl-ffi
harness=$PWD/target/release/bcl_allreduce_bench
cc -O3 -std=c99 -Iinclude benches/c/bcl_allreduce_bench.c -Ltarget/release -lbcl -lm \
  -Wl,-rpath,"$PWD/target/release" -o "$harness"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -n "${REUSE:-}" ] || { rm -rf "$out"; mkdir -p "$out"; }
for r in $(seq "$rounds"); do
  [ -n "${REUSE:-}" ] && break
  for np in 2 4; do
    bind=(--bind-to core); [ "$np" -gt "$(nproc)" ] && bind=(--oversubscribe --bind-to none)
    for sc in default ring 0; do
      env=(-x BCL_TRANSPORT=shm); lib=bcl-single
      [ "$sc" = 0 ] && { env+=(-x BCL_SINGLE_COPY_BYTES=0); lib=bcl-copy; }
      [ "$sc" = ring ] && { env+=(-x BCL_ALGO=ring); lib=bcl-ring; }
      timeout 600 mpirun -np "$np" "${bind[@]}" "${env[@]}" "$harness" -s "$sizes" -t "$secs" \
        -l "$lib" > "$out/$lib-np$np-r$r.txt" 2>&1
    done
    timeout 600 mpirun -np "$np" "${bind[@]}" "$B/mpi_allreduce_bench" -s "$sizes" -t "$secs" \
      -l openmpi-shm > "$out/mpi-np$np-r$r.txt" 2>&1
  done
  echo "round $r done" >&2
done
python3 - "$out" "$rounds" <<'PY' | tee "$out/table.md"
import glob, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(path):
    got = {}
    for line in open(path):
        f = line.split()
        if line.startswith('#') or len(f) < 10 or not f[0].isdigit():
            continue
        if f[9] == "FAIL":
            sys.exit(f"{path}: a wrong result at {f[0]} B")
        got[int(f[0])] = float(f[8])
    return got
print(f"busbw GB/s, median over {rounds} interleaved rounds (each round: the harness's median "
      "time; min-max across rounds in brackets).\n")
print("| ranks | size | BCL single copy (auto) | BCL single copy, ring | BCL copy ring | OpenMPI "
      "| auto / OpenMPI | ring / OpenMPI | copy / OpenMPI | auto / ring |")
print("|---|---|---|---|---|---|---|---|---|---|")
for np in (2, 4):
    runs = {lib: [rows(p) for p in sorted(glob.glob(f"{out}/{lib}-np{np}-r*.txt"))]
            for lib in ("bcl-single", "bcl-ring", "bcl-copy", "mpi")}
    for s in (1 << 20, 16 << 20, 64 << 20, 256 << 20):
        v = {lib: [r[s] for r in rs if s in r] for lib, rs in runs.items()}
        if not all(v.values()):
            continue
        m = {lib: statistics.median(x) for lib, x in v.items()}
        cell = lambda lib: f"{m[lib]:.2f} ({min(v[lib]):.2f}-{max(v[lib]):.2f})"
        print(f"| {np} | {s >> 20} MiB | {cell('bcl-single')} | {cell('bcl-ring')} | {cell('bcl-copy')} "
              f"| {cell('mpi')} | {m['bcl-single'] / m['mpi']:.2f}x | {m['bcl-ring'] / m['mpi']:.2f}x "
              f"| {m['bcl-copy'] / m['mpi']:.2f}x | {m['bcl-single'] / m['bcl-ring']:.2f}x |")
PY
