#!/usr/bin/env bash
# A/B of bcl-bench settings or builds on this VM, whose speed flips every 10-60 s: for each size,
# every configuration runs once in turn, ROUNDS times, and the table gives the median busbw
# (GB/s, out of place) of each and how often the second beat the first.
#   scripts/alternate-bench.sh NP ROUNDS "SIZES" "LABEL:VAR=VALUE ..." "LABEL:..." ...
# A configuration is a label and environment assignments; BIN=PATH among them runs another
# bcl-bench build (default target/release/bcl-bench). Example, one connection against two:
#   scripts/alternate-bench.sh 2 6 "16M 64M" "two:BCL_SOCKETS_PER_OP=2" "one:BCL_SOCKETS_PER_OP=1"
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 5 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
np=$1 rounds=$2 sizes=$3
shift 3
for size in $sizes; do
  # About 0.2 GB through each rank per run: many iterations for small sizes, few for large.
  iters=$(python3 -c "
s = '$size'; v = int(s[:-1]) << {'K': 10, 'M': 20, 'G': 30}[s[-1]]
print(max(3, min(50, int(2e8 / (v * max(1, $np - 1))))))")
  for _ in $(seq "$rounds"); do
    for cfg in "$@"; do
      label=${cfg%%:*} bench=target/release/bcl-bench vars=()
      for kv in ${cfg#*:}; do
        case $kv in BIN=*) bench=${kv#BIN=} ;; *) vars+=("$kv") ;; esac
      done
      env "${vars[@]}" timeout 600 "$bench" allreduce --nranks "$np" --transport tcp \
        -b "$size" -e "$size" -n "$iters" -w 1 -c 0 2>/dev/null |
        awk -v l="$label" '$1 ~ /^[0-9]+$/ {print l, $1, $8}'
    done
  done
done | python3 -c '
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in sys.stdin:
    label, size, busbw = line.split()
    runs[(label, int(size))].append(float(busbw))
labels = list(dict.fromkeys(k[0] for k in runs))
print("size".rjust(11), *[l.rjust(11) for l in labels], f"| {labels[1]} over {labels[0]}")
for size in sorted({k[1] for k in runs}):
    a, b = runs[(labels[0], size)], runs[(labels[1], size)]
    wins = sum(y > x for x, y in zip(a, b))
    print(str(size).rjust(11), *[f"{statistics.median(runs[(l, size)]):.3f}".rjust(11) for l in labels],
          f"| {wins} of {len(a)}")'
