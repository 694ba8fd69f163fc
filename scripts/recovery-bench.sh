#!/usr/bin/env bash
# Recovery figures (the life-cycle issue's targets): kill or stop 1 of 8 ranks -> the survivors'
# first correct allreduce after shrinking; a fresh process growing them back to 8; beside them
# the restart path a job takes without repair. Usage: scripts/recovery-bench.sh [TRIALS=30]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p bcl-tests --bin bcl-recover
python3 scripts/recovery-bench.py target/release/bcl-recover "${1:-30}"
