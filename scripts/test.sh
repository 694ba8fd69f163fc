#!/usr/bin/env bash
# The test command of the README: installs what the tests need on a fresh machine (as root:
# Debian packages; numpy from PyPI for the C ABI's Python client test), then runs every test
# of the workspace and the C example built through `make install` + pkg-config.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-pip)
command -v nm >/dev/null 2>&1 || missing+=(binutils)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)   # network-namespace fault tests
command -v kill >/dev/null 2>&1 || missing+=(procps)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)   # a small /dev/shm (bench test)
command -v mount >/dev/null 2>&1 || missing+=(mount)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)   # bcl-bench under mpirun
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${missing[@]}"
fi
python3 -c 'import numpy' 2>/dev/null || python3 -m pip install --quiet numpy

# Every test bounds its own waits; this outer limit only guards against the unforeseen.
timeout 1800 cargo test --workspace --release --locked
echo "== C example (make install + pkg-config, 4 processes)"
bash scripts/c-example.sh 4
