#!/usr/bin/env bash
# Runs a set of bcl-sim cases with two builds and says whether every output is the same,
# byte for byte: for engine and flow-model changes that must not move a simulated time.
#
#   scripts/sim-same-rows.sh OLD_BCL_SIM NEW_BCL_SIM [--big]
#
# The set: every collective at 64 ranks of the default cluster; each forced algorithm at 96;
# 4 local ranks over shm and tcp; an oversubscribed 512-rank cluster; an exact 2048-rank run
# (every rank simulated); the 10k sweep up to 256 MiB. --big adds the 100k rows from 16 MiB
# to 256 MiB (a few minutes). Exit 1 on the first difference, naming the case.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OLD_BCL_SIM NEW_BCL_SIM [--big]" >&2; exit 2; }
old=$1 new=$2 big=${3:-}
cases=()
for c in allreduce allgather reducescatter broadcast reduce alltoall gather scatter sendrecv; do
  cases+=("$c --nranks 64 -b 1K -e 16M -f 16")
done
for a in ring rd hd tree hier-ring hier-rd hier-hd hier-tree; do
  cases+=("allreduce --nranks 96 -b 8 -e 64M -f 64 --algo $a")
done
cases+=("allreduce --nranks 4 --topology local -b 8 -e 64M -f 8"
        "allreduce --nranks 4 --topology local,transport=tcp -b 8 -e 64M -f 8"
        "allreduce --nranks 512 --topology cluster,leaf=8,oversub=2 -b 64K -e 64M -f 32"
        "allreduce --nranks 2048 --group 0 -b 1M -e 16M -f 16"
        "allreduce --nranks 10000 -b 8 -e 256M")
[ "$big" = --big ] && cases+=("allreduce --nranks 100000 -b 16M -e 256M")
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086 # each case is a list of flags
  a=$("$old" $c 2>&1) || true
  # shellcheck disable=SC2086
  b=$("$new" $c 2>&1) || true
  if [ "$a" != "$b" ]; then
    echo "DIFFERENT: bcl-sim $c"
    diff <(echo "$a") <(echo "$b") | head -20
    exit 1
  fi
  echo "same: bcl-sim $c"
done
