#!/usr/bin/env bash
# Small and medium allreduce (8 B, 1 KiB, 64 KiB, 1 MiB) against OpenMPI, called the way
# applications call it: the baselines' harness (a barrier, then one timed allreduce; per
# iteration the slowest rank; median over ~T s of iterations), BCL's port of it on bcl.h and
# OpenMPI's original, over tcp and over shared memory, 2 and 4 ranks, one after the other in
# every round (this VM flips between a fast and a slow state every 10-60 s).
#   scripts/compare-small.sh [ROUNDS] [OUTDIR] [SECONDS]
# Writes OUTDIR/<lib>-<transport>-np<N>-r<k>.txt, OUTDIR/table.md (per case the median of the
# rounds' medians, and the spread across rounds: slowest round / fastest round) and the plot
# OUTDIR/small.svg.
# Environment passed through to BCL's ranks as usual (BCL_LL_BYTES=0 turns the lines off);
# REUSE=1 makes the table again from OUTDIR's files.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=${2:-/tmp/bcl-small}
secs=${3:-0.5}
sizes=8,1K,64K,1M
B=/tmp/bl
[ -x "$B/mpi_allreduce_bench" ] || bash ../shared/tools/baselines/setup.sh "$B"
cargo build --release -q -p bcl-ffi
harness=$PWD/target/release/bcl_allreduce_bench
cc -O3 -std=c99 -Iinclude benches/c/bcl_allreduce_bench.c -Ltarget/release -lbcl -lm \
  -Wl,-rpath,"$PWD/target/release" -o "$harness"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pass=()
for v in $(env | grep -o '^BCL_[A-Z_]*' || true); do pass+=(-x "$v"); done
[ -n "${REUSE:-}" ] || { rm -rf "$out"; mkdir -p "$out"; }
for r in $(seq "$rounds"); do
  [ -n "${REUSE:-}" ] && break
  for tr in tcp shm; do
    for np in 2 4; do
      bind=(--bind-to core); [ "$np" -gt "$(nproc)" ] && bind=(--oversubscribe --bind-to none)
      timeout 300 mpirun -np "$np" "${bind[@]}" "${pass[@]}" -x BCL_TRANSPORT="$tr" \
        "$harness" -s "$sizes" -t "$secs" -l "bcl-$tr" > "$out/bcl-$tr-np$np-r$r.txt" 2>&1
      mca=(); [ "$tr" = tcp ] && mca=(--mca pml ob1 --mca btl tcp,self \
        --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
      timeout 300 mpirun -np "$np" "${bind[@]}" "${mca[@]}" "$B/mpi_allreduce_bench" \
        -s "$sizes" -t "$secs" -l "openmpi-$tr" > "$out/mpi-$tr-np$np-r$r.txt" 2>&1
    done
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
        got[int(f[0])] = float(f[3])
    return got
def human(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" if s >= 1024 else f"{s} B"
print(f"Median over {rounds} interleaved rounds of each round's median (µs; the harness: barrier, "
      "then one timed allreduce, the slowest rank); spread = slowest round / fastest round.\n")
print("| transport | ranks | size | BCL µs | OpenMPI µs | BCL / OpenMPI | BCL spread | OpenMPI spread | rounds won |")
print("|---|---|---|---|---|---|---|---|---|")
met = total = 0
for tr in ("tcp", "shm"):
    for np in (2, 4):
        runs = {lib: [rows(p) for p in sorted(glob.glob(f"{out}/{lib}-{tr}-np{np}-r*.txt"))]
                for lib in ("bcl", "mpi")}
        for s in (8, 1024, 65536, 1 << 20):
            b = [r[s] for r in runs["bcl"] if s in r]
            m = [r[s] for r in runs["mpi"] if s in r]
            if not b or not m:
                continue
            bm, mm = statistics.median(b), statistics.median(m)
            bs, ms = max(b) / min(b), max(m) / min(m)
            won = sum(x <= y for x, y in zip(b, m))
            total += 1
            met += bm <= mm and bs <= ms
            print(f"| {tr} | {np} | {human(s)} | {bm:.2f} | {mm:.2f} | {bm / mm:.2f} | {bs:.2f} | {ms:.2f} | {won}/{len(b)} |")
print(f"\nBCL at or below OpenMPI's median with no larger spread: {met} of {total} cases.")
# The plot: BCL's time over OpenMPI's per case, each round a dot, the median a bar.
cases = []
for tr in ("tcp", "shm"):
    for np in (2, 4):
        runs = {lib: [rows(p) for p in sorted(glob.glob(f"{out}/{lib}-{tr}-np{np}-r*.txt"))]
                for lib in ("bcl", "mpi")}
        for s in (8, 1024, 65536, 1 << 20):
            ratios = [b[s] / m[s] for b, m in zip(runs["bcl"], runs["mpi"]) if s in b and s in m]
            if ratios:
                cases.append((f"{tr} {np}r {human(s)}", ratios))
W, H, left, top, bottom = 60 + 46 * len(cases), 360, 50, 30, 90
ymax = max(2.5, max(max(r) for _, r in cases) * 1.05)
y = lambda v: top + (H - top - bottom) * (1 - v / ymax)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       '<rect width="100%" height="100%" fill="white"/>',
       f'<text x="{left}" y="18" font-size="13">BCL time / OpenMPI time, allreduce (barrier, then one call); bars: median of {rounds} rounds, dots: rounds</text>']
for v in [0.5 * k for k in range(int(ymax / 0.5) + 1)]:
    svg.append(f'<line x1="{left}" x2="{W - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="{"#000" if v == 1 else "#ddd"}"/>'
               f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
for i, (label, ratios) in enumerate(cases):
    x = left + 10 + 46 * i
    m = statistics.median(ratios)
    svg.append(f'<rect x="{x}" y="{min(y(m), y(1)):.1f}" width="30" height="{abs(y(m) - y(1)):.1f}" '
               f'fill="{"#4a8" if m <= 1 else "#d64"}"/>')
    svg += [f'<circle cx="{x + 15}" cy="{y(r):.1f}" r="2.5" fill="#333"/>' for r in ratios]
    svg.append(f'<text transform="translate({x + 19},{H - bottom + 8}) rotate(60)">{label}</text>')
svg.append("</svg>")
open(f"{out}/small.svg", "w").write("\n".join(svg))
PY
# Idle: what a rank's process uses while its communicator has no operation in flight.
idle=$PWD/target/release/bcl_idle_cpu
cc -O2 -std=c99 -Iinclude benches/c/bcl_idle_cpu.c -Ltarget/release -lbcl \
  -Wl,-rpath,"$PWD/target/release" -o "$idle"
for tr in tcp shm; do
  echo "idle, $tr, 4 ranks:" | tee -a "$out/table.md"
  timeout 120 mpirun -np 4 --oversubscribe --bind-to none -x BCL_TRANSPORT="$tr" "$idle" 5 \
    | sort | sed 's/^/    /' | tee -a "$out/table.md"
done
