#!/usr/bin/env bash
# The test command of the README: installs what the tests need on a fresh machine (as root:
# Debian packages; numpy and ml_dtypes from PyPI for the C ABI's Python client test and the
# oracle's rounding check; NVRTC from PyPI for
# the cuda backend's kernel compile test), then runs every test of the workspace, the cuda
# backend's tests that need no GPU, the C example built through `make install` + pkg-config,
# and the torch backend (scripts/torch-test.sh: torch from PyPI, `pip install ./python`).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v c++ >/dev/null 2>&1 || missing+=(g++)   # the torch backend's C++ part
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
# numpy: the C ABI's Python client; numpy and ml_dtypes (bfloat16): the oracle's rounding check.
python3 -c 'import numpy, ml_dtypes' 2>/dev/null || python3 -m pip install --quiet numpy ml_dtypes ||
  python3 -m pip install --quiet --break-system-packages numpy ml_dtypes
# NVRTC, from NVIDIA's PyPI wheel (no GPU or toolkit needed): the cuda backend's kernels
# compile through it in the feature-cuda tests below.
nvrtc_lib=/opt/bcl-nvrtc/nvidia/cu13/lib
if [ ! -e "$nvrtc_lib/libnvrtc.so.13" ]; then
  wheel=('nvidia-cuda-nvrtc>=13.0,<13.1')
  python3 -m pip install --quiet --no-deps --target /opt/bcl-nvrtc "${wheel[@]}" ||
    python3 -m pip install --quiet --no-deps --break-system-packages --target /opt/bcl-nvrtc "${wheel[@]}"
fi

# The flood tests (tests/tests/security.rs) hold a few hundred connections on both ends at once,
# beyond a default soft limit of 1024 descriptors: take the hard limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# Every test bounds its own waits; this outer limit only guards against the unforeseen.
echo "== cargo test --workspace --release [test.sh +${SECONDS} s]"
timeout 1800 cargo test --workspace --release --locked
echo "== cuda backend, no GPU here: kernels compile through NVRTC; opening cuda:N is an error [test.sh +${SECONDS} s]"
echo "   (its GPU tests are ignored here: scripts/device-check.sh runs them on a GPU machine)"
LD_LIBRARY_PATH=$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  timeout 900 cargo test --release --locked --features cuda -p bcl-backends -p bcl-tests \
  --test cuda --test backends_agree --test cuda_ring --lib
echo "== C example (make install + pkg-config, 4 processes) [test.sh +${SECONDS} s]"
bash scripts/c-example.sh 4
echo "== torch.distributed backend \"bcl\" (torch from PyPI, pip install ./python, torchrun) [test.sh +${SECONDS} s]"
bash scripts/torch-test.sh
