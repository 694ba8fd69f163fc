#!/usr/bin/env bash
# Mixed-chip loss in bcl-sim: a data-parallel gradient allreduce on a cluster of one vendor,
# of a slower second vendor, and of both (half the hosts each, spread evenly), flat ring and
# hierarchical ring, at 1k and 10k chips. Prints a Markdown table (docs/simulator.md).
#
#   scripts/sim-mixed.sh [SIZE]        # SIZE: the gradient bytes, default 1G
#
# Vendor b: devices reducing and copying at half speed (500 GB/s) with half the bandwidth
# inside a host (185 GB/s per rank); "b, slower NICs" also halves its NICs (8 x 25 GB/s).
# An allreduce moves every host's whole share, so a mixed cluster can at best keep the pace
# of its slower vendor's homogeneous cluster: the loss is given against that.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-1G}
cargo build --release -q -p bcl-sim
sim=target/release/bcl-sim
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

b="b-reduce=500,b-copy=500,b-intra=185@3"
declare -A spec=(
  [a]="cluster"
  [b]="cluster,b-share=1,$b"
  [mixed]="cluster,b-share=0.5,$b"
  [b-nic]="cluster,b-share=1,$b,b-nic=25@8"
  [mixed-nic]="cluster,b-share=0.5,$b,b-nic=25@8"
)
for n in 1024 10000; do
  for algo in ring hier-ring; do
    for k in a b mixed b-nic mixed-nic; do
      # 1024 ranks: one leaf of hosts stands for all (ring and hier-ring are symmetric).
      group=()
      [ "$n" = 1024 ] && group=(--group 32)
      "$sim" allreduce --nranks "$n" -b "$size" -e "$size" --algo "$algo" \
        --topology "${spec[$k]}" "${group[@]}" --json "$out/$n-$algo-$k.json" >/dev/null
    done
  done
done

python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
def t(n, algo, k):
    rows = [json.loads(l) for l in open(os.path.join(out, f"{n}-{algo}-{k}.json"))]
    return next(r["time_us"] for r in rows if not r["in_place"])
print("| chips | algorithm | all a (ms) | all b (ms) | mixed (ms) | mixed vs the slower (all b) | all b, slower NICs (ms) | mixed, b with slower NICs (ms) | mixed vs the slower |")
print("|---|---|---|---|---|---|---|---|---|")
for n in (1024, 10000):
    for algo in ("ring", "hier-ring"):
        a, b, m, bn, mn = (t(n, algo, k) for k in ("a", "b", "mixed", "b-nic", "mixed-nic"))
        print(f"| {n} | {algo} | {a/1e3:.2f} | {b/1e3:.2f} | {m/1e3:.2f} | {100*(m/max(a, b)-1):+.1f}% | "
              f"{bn/1e3:.2f} | {mn/1e3:.2f} | {100*(mn/max(a, bn)-1):+.1f}% |")
PY
