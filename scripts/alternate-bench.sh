#!/usr/bin/env bash
# A/B of bcl-bench settings or builds on this VM, whose speed flips every 10-60 s: for each size,
# every configuration runs once in turn, ROUNDS times, and the table gives the median time (µs)
# and busbw (GB/s, out of place) of each, and how often the second was faster than the first.
#   [TRANSPORT=tcp|shm|auto] scripts/alternate-bench.sh NP ROUNDS "SIZES" "LABEL:VAR=VALUE ..." "LABEL:..." ...
# A configuration is a label and environment assignments; BIN=PATH among them runs another
# bcl-bench build (default target/release/bcl-bench), ARG=X adds X to its arguments (one per
# ARG: "mixed:ARG=--devices=cpu,sim"). Example, one connection against two:
#   scripts/alternate-bench.sh 2 6 "16M 64M" "two:BCL_SOCKETS_PER_OP=2" "one:BCL_SOCKETS_PER_OP=1"
# Two builds (before/after a change), over shared memory:
#   TRANSPORT=shm scripts/alternate-bench.sh 4 8 "8 64M" "before:BIN=../base/target/release/bcl-bench" "after:"
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 5 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
np=$1 rounds=$2 sizes=$3 transport=${TRANSPORT:-tcp}
shift 3
for size in $sizes; do
  # About 0.2 GB through each rank per run: many iterations for small sizes, few for large.
  iters=$(python3 -c "
s = '$size'; v = int(s[:-1]) << {'K': 10, 'M': 20, 'G': 30}[s[-1]] if s[-1] in 'KMG' else int(s)
print(max(3, min(200, int(2e8 / (v * max(1, $np - 1))))))")
  for _ in $(seq "$rounds"); do
    for cfg in "$@"; do
      label=${cfg%%:*} bench=target/release/bcl-bench vars=() args=()
      for kv in ${cfg#*:}; do
        case $kv in BIN=*) bench=${kv#BIN=} ;; ARG=*) args+=("${kv#ARG=}") ;; *) vars+=("$kv") ;; esac
      done
      env "${vars[@]}" timeout 600 "$bench" allreduce "${args[@]}" --nranks "$np" --transport "$transport" \
        -b "$size" -e "$size" -n "$iters" -w 1 -c 0 2>/dev/null |
        awk -v l="$label" '$1 ~ /^[0-9]+$/ {print l, $1, $6, $8}'
    done
  done
done | python3 -c '
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in sys.stdin:
    label, size, us, busbw = line.split()
    runs[(label, int(size))].append((float(us), float(busbw)))
labels = list(dict.fromkeys(k[0] for k in runs))
head = [f"{l} us".rjust(12) + f"{l} GB/s".rjust(12) for l in labels]
print("size".rjust(11), *head, f"| {labels[1]} faster than {labels[0]}")
for size in sorted({k[1] for k in runs}):
    a, b = runs[(labels[0], size)], runs[(labels[1], size)]
    wins = sum(y[0] < x[0] for x, y in zip(a, b))
    cells = [f"{statistics.median(t for t, _ in runs[(l, size)]):.1f}".rjust(12)
             + f"{statistics.median(g for _, g in runs[(l, size)]):.3f}".rjust(12) for l in labels]
    print(str(size).rjust(11), *cells, f"| {wins} of {len(a)}")'
