#!/usr/bin/env bash
# Overhead of the health layer: the same bcl-bench binary with BCL_HEALTH=off and on (and,
# optionally, a binary built before signatures and the health layer existed), interleaved
# A B A B so that this VM's fast/slow phases hit every variant alike. Prints the median
# out-of-place time per (variant, ranks, size).
#   scripts/health-overhead.sh [ROUNDS] [OLD_BCL_BENCH]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
old=${2:-}
cargo build --release -q -p bcl-bench
new=target/release/bcl-bench
out=$(mktemp)
run() { # variant binary health ranks args...
  local variant=$1 bin=$2 health=$3 ranks=$4; shift 4
  BCL_HEALTH=$health "$bin" allreduce --nranks "$ranks" "$@" 2>/dev/null |
    awk -v v="$variant" -v n="$ranks" '!/^#/ && NF >= 9 { print v, n, $1, $6, $8 }' >>"$out"
}
for _ in $(seq "$rounds"); do
  for ranks in 2 4; do
    iters=$((ranks == 2 ? 20000 : 5000))
    [ -n "$old" ] && run before "$old" on "$ranks" -b 8 -e 8 -n "$iters" -w 500
    run health-off "$new" off "$ranks" -b 8 -e 8 -n "$iters" -w 500
    run health-on "$new" on "$ranks" -b 8 -e 8 -n "$iters" -w 500
  done
  [ -n "$old" ] && run before "$old" on 2 -b 1M -e 64M -f 4 -n 20 -w 3
  run health-off "$new" off 2 -b 1M -e 64M -f 4 -n 20 -w 3
  run health-on "$new" on 2 -b 1M -e 64M -f 4 -n 20 -w 3
done
python3 - "$out" "$rounds" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    v, n, size, t, bw = line.split()
    rows.setdefault((int(size), int(n), v), []).append((float(t), float(bw)))
print(f"# median of {sys.argv[2]} interleaved runs, out-of-place")
print(f"# {'bytes':>10} {'ranks':>5} {'variant':>10} {'time_us':>10} {'busbw_GBps':>10}")
for (size, n, v), ms in sorted(rows.items()):
    print(f"  {size:>10} {n:>5} {v:>10} {statistics.median(t for t, _ in ms):>10.2f} {statistics.median(b for _, b in ms):>10.3f}")
PY
rm -f "$out"
