#!/usr/bin/env bash
# all_reduce through torch.distributed: "bcl" against "gloo", same job, interleaved, on 2 and
# 4 local ranks (scripts/torch-bench.py). Usage: scripts/torch-bench.sh [ROUNDS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import bcl.torch' 2>/dev/null || python3 -m pip install --quiet --no-deps --no-build-isolation ./python
script=$PWD/scripts/torch-bench.py
cd /tmp
for n in 2 4; do
  python3 -m torch.distributed.run --nproc-per-node "$n" "$script" "${1:-5}" 2>&1 | grep -E '^[|#]'
done
