#!/usr/bin/env bash
# 8 B allreduce latency over TCP on loopback, many short interleaved rounds: BCL and
# OpenMPI-TCP timed by the same harness (median of ~1 s of iterations each), and for 2 ranks the
# bare TCP exchange floor, one after the other in every round. The VM's speed flips every
# 10-60 s, so a single round says little; the medians over ROUNDS and the count of rounds won do.
#   scripts/compare-latency.sh [ROUNDS] [RANKS] (needs the builds of scripts/compare-baselines.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
np=${2:-2}
harness=target/release/bcl_allreduce_bench floor=target/release/tcp_exchange_floor
[ -x "$harness" ] && [ -x "$floor" ] && [ -x /tmp/bl/mpi_allreduce_bench ] ||
  { echo "run scripts/compare-baselines.sh first (it builds the harnesses)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The same binding as scripts/compare-baselines.sh: one core each, or none where ranks outnumber cores.
bind=(--bind-to core); [ "$np" -gt "$(nproc)" ] && bind=(--oversubscribe --bind-to none)
for r in $(seq "$rounds"); do
  b=$(timeout 120 mpirun -np "$np" "${bind[@]}" -x BCL_TRANSPORT=tcp "$harness" -s 8 -t 1 | awk '$1==8 {print $4}')
  m=$(timeout 120 mpirun -np "$np" "${bind[@]}" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
    --mca oob_tcp_if_include lo /tmp/bl/mpi_allreduce_bench -s 8 -t 1 | awk '$1==8 {print $4}')
  f=nan
  [ "$np" -eq 2 ] && f=$(timeout 120 "$floor" -s 52 -n 20000 | awk '$1==52 {print $4}')
  echo "$r $b $m $f"
done | NP=$np python3 -c '
import math, os, statistics, sys
rows = [list(map(float, l.split()[1:])) for l in sys.stdin]
for r in rows:
    print(f"BCL {r[0]:6.2f}  OpenMPI-TCP {r[1]:6.2f}  floor {r[2]:6.2f} us")
med = [statistics.median(c) for c in zip(*rows)]
won = sum(r[0] <= r[1] for r in rows)
floor = "" if math.isnan(med[2]) else f", floor {med[2]:.1f}"
np = os.environ["NP"]
print(f"{np} ranks, median over {len(rows)} rounds: BCL {med[0]:.1f}, OpenMPI-TCP {med[1]:.1f}{floor} us; "
      f"BCL at or below OpenMPI in {won} of {len(rows)} rounds")'
