#!/usr/bin/env bash
# Measures the constants of the allreduce cost model (bcl-core/src/schedule/cost.rs) for one
# link class: bcl-bench allreduce with the ring, recursive doubling and halving-doubling
# forced, 2 and 4 ranks, 8 B .. 4 MiB, ROUNDS interleaved rounds (this VM flips speed: A B A
# B), then a least-squares fit of alpha (s per step), beta (s per byte sent), gamma (s per
# byte reduced) to the per-size medians of ring and doubling, weighted by relative error;
# halving-doubling's medians are printed beside the model's pick (the cost.rs tests hold the
# model to them).
# The class `hosts` is the link between hosts: every rank on a namespace host of its own
# whose NIC is shaped to RATE (default 2gbit, `scripts/lib/netns-hosts.sh`; needs root).
# The last line is the setting that hands these constants to BCL's selector in place of the
# built-in ones (`BCL_LINK_INSIDE` for tcp and shm, the links of one host; `BCL_LINK_BETWEEN`
# for hosts), from the largest world whose fit came out positive (this VM's noise can put β
# below zero; then no setting is printed).
# Usage: [RATE=2gbit] scripts/measure-cost-model.sh tcp|shm|hosts [ROUNDS] [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
transport=${1:?tcp, shm or hosts}
rounds=${2:-3}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
cargo build --release --locked -q -p bcl-bench
bench=./target/release/bcl-bench
sizes=(-b 8 -e 4M -f 4 -n 30 -w 5 -c 0)
if [ "$transport" = hosts ]; then
  . scripts/lib/netns-hosts.sh
  hosts_up 4 "${RATE:-2gbit}"
fi
port=29800
measure() { # ranks algo json
  if [ "$transport" != hosts ]; then
    "$bench" allreduce --nranks "$1" --transport "$transport" --algo "$2" "${sizes[@]}" --json "$3" >/dev/null
    return
  fi
  local pids=() r
  port=$((port + 1))
  for ((r = 0; r < $1; r++)); do
    on_host "$r" env BCL_RANK="$r" BCL_WORLD_SIZE="$1" BCL_ROOT="$(host_addr 0):$port" \
      BCL_BIND_IP="$(host_addr "$r")" timeout 600 "$bench" allreduce --algo "$2" "${sizes[@]}" \
      --json "$3" >/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
for ((r = 0; r < rounds; r++)); do
  for n in 2 4; do
    for algo in ring rd hd; do
      measure "$n" "$algo" "$out/$transport-$n-$algo-r$r.json"
    done
  done
done
python3 - "$out" "$transport" <<'PY'
import glob, json, os, statistics, sys
sys.path.insert(0, "scripts/lib")
from cost_fit import coefficients, fit
out, transport = sys.argv[1], sys.argv[2]
times = {}
for f in glob.glob(f"{out}/{transport}-*-r*.json"):
    n, algo = f.split("/")[-1].split("-")[1:3]
    for line in open(f):
        o = json.loads(line)
        if o["in_place"]:
            continue
        times.setdefault((int(n), algo, o["size_bytes"]), []).append(o["time_us"] * 1e-6)

med = {k: statistics.median(v) for k, v in times.items()}
worlds = sorted({k[0] for k in med})
# gamma (the reduction's cost per byte) from the 2-rank fit, where every step is one
# exchange and the ring's half-size reductions separate it from beta; then alpha and beta
# per world size with gamma fixed: on a small VM the per-step cost grows with the ranks per
# core, so each measured world size gets its own.
fitted = {k: v for k, v in med.items() if k[1] in ("ring", "rd")}
setting = None
if transport == "hosts":
    # Between hosts the link, not the reduction, bounds every large size, so gamma cannot be
    # told from beta there: it is the host's, taken from the tcp fit (cost.rs's TCP_2).
    gamma, how = 1 / float(os.environ.get("GAMMA_GBS", "4.97")) / 1e9, "fixed, GAMMA_GBS"
else:
    _, _, gamma = fit(sorted(k for k in fitted if k[0] == 2), med)
    how = "2-rank fit"
print(f"# {transport}: 1/gamma = {1 / gamma / 1e9:.2f} GB/s ({how}), medians of "
      f"{len(next(iter(times.values())))} runs in {out}")
for world in worlds:
    keys = sorted(k for k in fitted if k[0] == world)
    alpha, beta, _ = fit(keys, med, gamma)
    if transport == "hosts":
        # tbf passes a burst (256 KiB) faster than its rate, which bends the middle sizes:
        # alpha from the sizes to 2 KiB, beta from 128 KiB up with that alpha.
        alpha, _, _ = fit([k for k in keys if k[2] <= 2048], med, gamma)
        big = [k for k in keys if k[2] >= 131072]
        beta = statistics.median((med[k] - coefficients(*k)[0] * alpha - coefficients(*k)[2] * gamma)
                                 / coefficients(*k)[1] for k in big)
    print(f"# {transport} {world} ranks: alpha = {alpha * 1e6:.1f} us, 1/beta = {1 / beta / 1e9:.2f} GB/s")
    if alpha >= 0 and beta > 0 and gamma > 0:
        setting = f"{alpha * 1e6:.1f},{1 / beta / 1e9:.3f},{1 / gamma / 1e9:.2f}"
    print("# size  ring_us  rd_us  hd_us  fastest  by  model_picks")
    for size in sorted({k[2] for k in keys}):
        t = {a: med[(world, a, size)] for a in ("ring", "rd", "hd") if (world, a, size) in med}
        model = {a: sum(x * y for x, y in zip(coefficients(world, a, size), (alpha, beta, gamma)))
                 for a in t}
        # cost.rs breaks ties: doubling, then the ring, then halving-doubling
        pick = min(t, key=lambda a: (model[a], ("rd", "ring", "hd").index(a)))
        best = min(t, key=t.get)
        print(f"{size:8d} " + " ".join(f"{t[a] * 1e6:8.1f}" for a in ("ring", "rd", "hd") if a in t)
              + f"  {best:4} {sorted(t.values())[1] / t[best]:4.2f}  {pick}")
link = "BCL_LINK_BETWEEN" if transport == "hosts" else "BCL_LINK_INSIDE"
if setting:
    print(f"{link}={setting}")
else:
    print(f"# no {link} setting: no world's fit came out positive; measure more rounds")
PY
