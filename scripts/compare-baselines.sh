#!/usr/bin/env bash
# BCL against the peers on this machine, allreduce fp32 sum, 2 and 4 ranks, interleaved (BCL,
# then each peer, then again) because this VM flips between a fast and a slow state. Uses the
# baseline harnesses of ../shared/tools/baselines (built by its setup.sh into /tmp/bl).
#   scripts/compare-baselines.sh [ROUNDS] [OUTDIR] [tcp|shm]
#   tcp (default): BCL over TCP on loopback vs OpenMPI over TCP and Gloo (PyTorch's CPU backend)
#   shm: BCL over shared memory vs BCL over TCP and OpenMPI's default shared-memory path
# BCL is timed twice: by benches/c/bcl_allreduce_bench.c, the baselines' MPI harness ported
# onto bcl.h and started by mpirun like OpenMPI's (the like-with-like figure), and by bcl-bench
# (nccl-tests' mean of back-to-back iterations). In tcp mode each round also measures the
# bounds: loopback TCP throughput (iperf3, one pair per rank at once) and a bare 2-process TCP
# exchange (benches/c/tcp_exchange_floor.c).
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
command -v iperf3 >/dev/null || { apt-get update -qq && apt-get install -y -qq iperf3; }
cargo build --release -q -p bcl-bench -p bcl-ffi
bench=$PWD/target/release/bcl-bench
# BCL timed by the baselines' own method: their MPI harness ported onto bcl.h.
harness=$PWD/target/release/bcl_allreduce_bench
cc -O3 -std=c99 -Iinclude benches/c/bcl_allreduce_bench.c -Ltarget/release -lbcl -lm \
  -Wl,-rpath,"$PWD/target/release" -o "$harness"
floor=$PWD/target/release/tcp_exchange_floor
cc -O2 -std=c99 benches/c/tcp_exchange_floor.c -o "$floor"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Aggregate loopback TCP throughput of NP iperf3 pairs streaming at once (GB/s): the most a
# ring of NP ranks can push through loopback sockets on this machine.
loopback() { # NP OUTFILE
  local base=$((5400 + RANDOM % 400)) i sp=() cp=()
  for i in $(seq 0 $(($1 - 1))); do iperf3 -s -1 -B 127.0.0.1 -p $((base + i)) >/dev/null 2>&1 & sp+=($!); done
  sleep 0.5
  for i in $(seq 0 $(($1 - 1))); do
    iperf3 -c 127.0.0.1 -p $((base + i)) -t 3 -l 1M -J > "$out/iperf-$i.json" 2>/dev/null & cp+=($!)
  done
  wait "${cp[@]}"; wait "${sp[@]}" 2>/dev/null || true
  python3 -c 'import json, sys
t = [json.load(open(f"{sys.argv[1]}/iperf-{i}.json"))["end"]["sum_received"]["bits_per_second"] / 8e9 for i in range(int(sys.argv[2]))]
print(f"{sum(t):.3f}", " ".join(f"{x:.3f}" for x in t))' "$out" "$1" > "$2"
  rm -f "$out"/iperf-*.json
}
rm -rf "$out"; mkdir -p "$out"
for r in $(seq "$rounds"); do
  for np in 2 4; do
    bind=(--bind-to core); [ "$np" -gt "$(nproc)" ] && bind=(--oversubscribe --bind-to none)
    # bcl-bench: nccl-tests method (mean of back-to-back iterations); many iterations for
    # small messages (the harnesses run each size for 1 s), few for large ones.
    run_bcl() { # LIB TRANSPORT
      "$bench" allreduce --nranks "$np" --transport "$2" -b 8 -e 64K -f 2 -n 1000 -w 100 \
        --json "$out/small.json" > "$out/$1-np$np-r$r.txt" 2>&1
      "$bench" allreduce --nranks "$np" --transport "$2" -b 128K -e 256M -f 2 -n 10 -w 3 \
        --json "$out/large.json" >> "$out/$1-np$np-r$r.txt" 2>&1
      cat "$out/small.json" "$out/large.json" > "$out/$1-np$np-r$r.json"
    }
    timeout 900 mpirun -np "$np" "${bind[@]}" -x BCL_TRANSPORT="$mode" \
      "$harness" -s "$sizes" -t 1 -l "bcl-$mode" > "$out/bclh-np$np-r$r.txt" 2>&1
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
    if [ "$mode" = tcp ]; then
      loopback "$np" "$out/loopback-np$np-r$r.txt"
      # Memory bandwidth of a+b->c on both cores (what a reduction needs at best).
      OMP_NUM_THREADS=$(nproc) OMP_PROC_BIND=spread "$B/membw" > "$out/membw-np$np-r$r.txt" 2>&1
      # 52 B: the frame of BCL's 8 B allreduce (16 B header, 28 B signature bundle, 8 B).
      [ "$np" = 2 ] && timeout 300 "$floor" -s 52 -n 20000 -w 1000 > "$out/floor-np2-r$r.txt"
    fi
    echo "round $r np $np done" >&2
  done
done
python3 - "$out" "$rounds" "$mode" <<'PY'
import glob, json, statistics, sys
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
libs = ("bclh", "bcl", "mpi", "gloo") if mode == "tcp" else ("bclh", "bcl", "bcltcp", "mpi")
peers = ("mpi", "gloo") if mode == "tcp" else ("mpi",)
readers = {"bclh": (harness, "txt"), "bcl": (bcl, "json"), "bcltcp": (bcl, "json"),
           "mpi": (harness, "txt"), "gloo": (harness, "txt")}
for lib in libs:
    reader, ext = readers[lib]
    for np in (2, 4):
        runs = [reader(p) for p in sorted(glob.glob(f"{out}/{lib}-np{np}-r*.{ext}"))]
        for s in sizes:
            vals = [r[s] for r in runs if s in r]
            if vals:
                med[(lib, np, s)] = tuple(statistics.median(v[i] for v in vals) for i in range(3)) + (len(vals),)
# The loopback bound: NP iperf3 pairs at once move T GB/s in all; a bandwidth-optimal
# allreduce puts 2(NP-1)/NP of the data through each rank's socket, so busbw <= T / NP.
loop = {}
for np in (2, 4):
    t = [float(open(p).read().split()[0]) for p in glob.glob(f"{out}/loopback-np{np}-r*.txt")]
    if t:
        loop[np] = (statistics.median(t), min(t), max(t))
# STREAM "add" (reads a, b, writes c; GB/s counts all three): a reduction of R output bytes
# moves 3R, so the (p-1)S bytes an allreduce reduces in all take 3(p-1)S/A on this machine.
adds = [float(l.split()[2]) for p in glob.glob(f"{out}/membw-np*-r*.txt") for l in open(p) if l.startswith("add ")]
add = statistics.median(adds) if adds else None
def cpu_bound(np):
    # Socket work at the loopback rate and the reduction at memory speed share the same cores:
    # t/S = 2(p-1)/T_p + 3(p-1)/A; busbw = 2(p-1)/p / (t/S).
    return 2 * (np - 1) / np / (2 * (np - 1) / loop[np][0] + 3 * (np - 1) / add)
floors = [harness(p).get(52) for p in glob.glob(f"{out}/floor-np2-r*.txt")]
floors = [f[0] for f in floors if f]
names = {"bclh": f"BCL {mode}", "bcl": f"BCL {mode} (bcl-bench)", "bcltcp": "BCL tcp (bcl-bench)",
         "mpi": f"OpenMPI {mode}", "gloo": "Gloo ring"}
def human(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" if s >= 1024 else f"{s} B"
lines = [f"Median over {rounds} interleaved rounds. Time in µs: BCL, OpenMPI and Gloo by the same harness "
         "(barrier, then one timed allreduce; per iteration the slowest rank; median, mean in brackets); "
         "`BCL (bcl-bench)`: mean of back-to-back iterations, as nccl-tests. busbw in GB/s from the median.", ""]
best_name = "best peer" if len(peers) > 1 else names[peers[0]]
for np in (2, 4):
    head = "| size | " + " | ".join(f"{names[l]} time | {names[l]} busbw" for l in libs) + f" | BCL / {best_name} busbw |"
    cols = 2 * len(libs) + 2
    bounded = np in loop and add
    if bounded:
        head += " loopback bound busbw | CPU model busbw | BCL / CPU model |"
        cols += 3
    lines += [f"### {np} ranks", "", head, "|---" * cols + "|"]
    for s in sizes:
        cells = []
        for l in libs:
            m = med.get((l, np, s))
            if not m:
                cells += ["-", "-"]
            elif readers[l][0] is bcl:
                cells += [f"{m[0]:.1f}", f"{m[2]:.3f}"]
            else:
                cells += [f"{m[0]:.1f} ({m[1]:.1f})", f"{m[2]:.3f}"]
        best = max((med.get((l, np, s), (0, 0, 0))[2] for l in peers), default=0)
        b = med.get(("bclh", np, s), (0, 0, 0))[2]
        cells.append(f"{b / best:.2f}x" if best > 0 and s >= 1 << 20 else "-")
        if bounded:
            bound, tight = loop[np][0] / np, cpu_bound(np)
            cells += [f"{bound:.3f}", f"{tight:.3f}", f"{b / tight:.0%}"] if s >= 16 << 20 else ["-"] * 3
        lines.append(f"| {human(s)} | " + " | ".join(cells) + " |")
    lines.append("")
    m8 = {l: med.get((l, np, 8)) for l in libs}
    if m8["bclh"]:
        parts = [f"8 B, {np} ranks: BCL {m8['bclh'][0]:.1f} µs"]
        parts += [f"{names[l]} {m8[l][0]:.1f} µs ({m8[l][0] / m8['bclh'][0]:.1f}x BCL's)" for l in peers if m8[l]]
        if np == 2 and floors:
            parts.append(f"the TCP exchange floor (`tcp_exchange_floor`, one 52 B frame each way) "
                         f"{statistics.median(floors):.1f} µs (rounds: {', '.join(f'{f:.1f}' for f in sorted(floors))})")
        lines += ["; ".join(parts) + ".", ""]
    if bounded:
        t = loop[np]
        lines += [f"Bounds, {np} ranks (shown from 16 MiB: smaller messages are served partly from the caches and can pass them): {np} iperf3 "
                  f"pairs at once stream {t[0]:.2f} GB/s through loopback TCP in all (rounds {t[1]:.2f}-{t[2]:.2f}); "
                  f"each rank of a bandwidth-optimal allreduce sends and receives 2({np}-1)/{np} of the data, "
                  f"so busbw <= {t[0] / np:.3f} GB/s. The reduction needs the same cores: with STREAM add at "
                  f"{add:.1f} GB/s (both cores), the CPU model (socket work at the loopback rate plus the "
                  f"reduction at memory speed, one after the other on the same cores) gives {cpu_bound(np):.3f} GB/s.", ""]
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
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
