#!/usr/bin/env bash
# BCL against the peers on this machine, allreduce fp32 sum, 2 and 4 ranks, interleaved (BCL,
# then each peer, then again) because this VM flips between a fast and a slow state. Uses the
# baseline harnesses of ../shared/tools/baselines (built by its setup.sh into /tmp/bl).
#   scripts/compare-baselines.sh [ROUNDS] [OUTDIR] [tcp|shm]
#   tcp (default): BCL over TCP on loopback vs OpenMPI over TCP and Gloo (PyTorch's CPU backend)
#   shm: BCL over shared memory vs BCL over TCP and OpenMPI's default shared-memory path
# Writes OUTDIR/<lib>-np<N>-r<k>.{txt,json}, a median table (OUTDIR/table.md) and the plot
# (OUTDIR/allreduce.svg, made from the median series).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
out=${2:-/tmp/bcl-compare}
mode=${3:-tcp}
case $mode in
  tcp) peers="mpi gloo" ;;
  shm) peers="bcltcp mpi" ;;
  *) echo "mode must be tcp or shm, not '$mode'" >&2; exit 2 ;;
esac
bl=../shared/tools/baselines
B=/tmp/bl
sizes=8,1K,64K,1M,16M,64M,256M
[ -x "$B/mpi_allreduce_bench" ] && [ -x "$B/gloo_allreduce_bench" ] || bash "$bl/setup.sh" "$B"
cargo build --release -q -p bcl-bench
bench=$PWD/target/release/bcl-bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$out"; mkdir -p "$out"
for r in $(seq "$rounds"); do
  for np in 2 4; do
    bind=(--bind-to core); [ "$np" -gt "$(nproc)" ] && bind=(--oversubscribe --bind-to none)
    # BCL: nccl-tests method (mean of back-to-back iterations); many iterations for small
    # messages (the harnesses run each size for 1 s), few for large ones.
    run_bcl() { # LIB TRANSPORT
      "$bench" allreduce --nranks "$np" --transport "$2" -b 8 -e 64K -f 2 -n 1000 -w 100 \
        --json "$out/small.json" > "$out/$1-np$np-r$r.txt" 2>&1
      "$bench" allreduce --nranks "$np" --transport "$2" -b 128K -e 256M -f 2 -n 10 -w 3 \
        --json "$out/large.json" >> "$out/$1-np$np-r$r.txt" 2>&1
      cat "$out/small.json" "$out/large.json" > "$out/$1-np$np-r$r.json"
    }
    run_bcl bcl "$mode"
    for peer in $peers; do
      case $peer in
        bcltcp) run_bcl bcltcp tcp ;;
        mpi)
          mca=(); [ "$mode" = tcp ] && mca=(--mca pml ob1 --mca btl tcp,self \
            --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
          timeout 900 mpirun -np "$np" "${bind[@]}" "${mca[@]}" \
            "$B/mpi_allreduce_bench" -s "$sizes" -t 1 -l "openmpi-$mode" > "$out/mpi-np$np-r$r.txt" 2>&1 ;;
        gloo)
          rdv=$(mktemp -d /tmp/gloo-rdv.XXXXXX)
          pids=()
          for k in $(seq 1 $((np - 1))); do
            "$B/gloo_allreduce_bench" "$k" "$np" "$rdv" -a ring -s "$sizes" -t 1 >/dev/null 2>&1 & pids+=($!)
          done
          timeout 900 "$B/gloo_allreduce_bench" 0 "$np" "$rdv" -a ring -s "$sizes" -t 1 > "$out/gloo-np$np-r$r.txt" 2>&1
          for p in "${pids[@]}"; do wait "$p" || true; done
          rm -rf "$rdv" ;;
      esac
    done
    echo "round $r np $np done" >&2
  done
done
python3 - "$out" "$rounds" "$mode" <<'PY'
import glob, json, os, statistics, sys
out, rounds, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sizes = [8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
def harness(path):
    rows = {}
    for line in open(path):
        f = line.split()
        if line.startswith('#') or len(f) < 9:
            continue
        try:
            rows[int(f[0])] = (float(f[3]), float(f[5]), float(f[8]))
        except ValueError:
            pass
    return rows
def bcl(path):
    rows = {}
    for line in open(path):
        d = json.loads(line)
        if not d["in_place"]:
            rows[d["size_bytes"]] = (d["time_us"], d["time_us"], d["busbw_gbs"])
    return rows
med = {}
libs = ("bcl", "mpi", "gloo") if mode == "tcp" else ("bcl", "bcltcp", "mpi")
peers = libs[1:] if mode == "tcp" else ("mpi",)
readers = {"bcl": (bcl, "json"), "bcltcp": (bcl, "json"), "mpi": (harness, "txt"), "gloo": (harness, "txt")}
for lib in libs:
    reader, ext = readers[lib]
    for np in (2, 4):
        runs = [reader(p) for p in sorted(glob.glob(f"{out}/{lib}-np{np}-r*.{ext}"))]
        for s in sizes:
            vals = [r[s] for r in runs if s in r]
            if vals:
                med[(lib, np, s)] = tuple(statistics.median(v[i] for v in vals) for i in range(3)) + (len(vals),)
names = {"bcl": f"BCL {mode}", "bcltcp": "BCL tcp", "mpi": f"OpenMPI {mode}", "gloo": "Gloo ring"}
def human(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" if s >= 1024 else f"{s} B"
lines = [f"Median of {rounds} interleaved runs; time in µs (BCL: mean of back-to-back iterations, as nccl-tests; OpenMPI/Gloo: harness median, harness mean in brackets); busbw GB/s.", ""]
for np in (2, 4):
    lines += [f"### {np} ranks", "", "| size | " + " | ".join(f"{names[l]} time | {names[l]} busbw" for l in libs) + f" | BCL / {'best peer' if len(peers) > 1 else names[peers[0]]} busbw |", "|---" * 8 + "|"]
    for s in sizes:
        cells = []
        for l in libs:
            m = med.get((l, np, s))
            if not m:
                cells += ["-", "-"]
            elif l.startswith("bcl"):
                cells += [f"{m[0]:.1f}", f"{m[2]:.3f}"]
            else:
                cells += [f"{m[0]:.1f} ({m[1]:.1f})", f"{m[2]:.3f}"]
        best = max((med.get((l, np, s), (0, 0, 0))[2] for l in peers), default=0)
        b = med.get(("bcl", np, s), (0, 0, 0))[2]
        ratio = f"{b / best:.2f}x" if best > 0 and s >= 1 << 20 else "-"
        lines.append(f"| {human(s)} | " + " | ".join(cells) + f" | {ratio} |")
    lines.append("")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
for (lib, np, s), m in med.items():
    pass
for lib in libs:
    for np in (2, 4):
        pts = [(s, med[(lib, np, s)]) for s in sizes if (lib, np, s) in med]
        with open(f"{out}/median-{lib}-np{np}.txt", "w") as f:
            f.write(f"# label={names[lib].replace(' ', '-')} ranks={np}\n")
            for s, m in pts:
                f.write(f"{s} 0 0 {m[0]} 0 {m[1]} 0 0 {m[2]} ok\n")
PY
title="allreduce fp32, TCP loopback"; [ "$mode" = shm ] && title="allreduce fp32, one host: shared memory"
"$bench" plot "$out"/median-*.txt -o "$out/allreduce.svg" --title "$title"
