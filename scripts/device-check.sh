#!/usr/bin/env bash
# The GPU checks of the cuda backend, as one run on a machine with an NVIDIA GPU:
#   1. the backend's tests: every kernel (dtype x op) against the cpu reference, staging
#      copies, streams, events, bad handles, stream holds;
#   2. the backend conformance tests with cuda:0 among the backends;
#   3. mixed rings: the conformance suite with 1 CUDA rank + 3 cpu ranks and with 2 CUDA ranks
#      sharing the GPU + 2 cpu ranks, and a collective ordered on a caller's stream;
#   4. bandwidths: device copy, the reduce kernel, staged host copies;
#   5. the C ABI on GPU ranks: bcl-ffi/tests/cuda/streams.cu built with nvcc against libbcl,
#      2 CUDA ranks + 2 cpu ranks as processes (device pointers, cudaStream_t ordering), with
#      the caller blocking on the stream by a pageable copy, then by cudaStreamSynchronize;
#   6. bcl-bench allreduce sweeps: 4 cpu ranks, 1 CUDA + 3 cpu, 2 CUDA + 2 cpu; 2 cpu ranks,
#      1 CUDA + 1 cpu; and three vendors in one ring: 1 CUDA + 2 device-plugin + 1 cpu;
#   7. repair with GPU ranks: bcl-bench --recover on 2 CUDA + 2 cpu ranks, a cpu rank killed
#      and then a CUDA rank killed; the survivors (CUDA among them) shrink and finish the sweep.
#   8. the torch backend "bcl" on CUDA tensors (python/tests/check_cuda.py, 2 ranks on the GPU):
#      every operation against Gloo, torch's current-stream semantics, DDP against Gloo's.
# Usage: scripts/device-check.sh [DIR]
#   Where cargo exists and no DIR is given, it first builds with `--features cuda`
#   (scripts/device-prebuild.sh); otherwise it runs the binaries prebuilt into DIR
#   (default .device-bin). Logs and JSON go to $OUT (default /tmp/bcl-device-check).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/bcl-device-check}
mkdir -p "$out"
exec > >(tee "$out/device-check.log") 2>&1
bins=${1:-.device-bin}
if [ -z "${1:-}" ] && command -v cargo >/dev/null 2>&1; then
  bash scripts/device-prebuild.sh "$bins" || exit 2
fi
for f in cuda backends_agree cuda_ring bcl-bench cuda_bandwidth libbcl.so libarena.so; do
  [ -e "$bins/$f" ] || { echo "missing $bins/$f: run scripts/device-prebuild.sh"; exit 2; }
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || exit 2
nproc; free -g | head -2
# The driver library is on the loader path; NVRTC may be in a CUDA toolkit or a pip wheel.
if ! ldconfig -p | grep -q 'libnvrtc.so.13'; then
  lib=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so.13' 2>/dev/null | head -1)
  [ -n "$lib" ] || { echo "no libnvrtc.so.13 on this machine"; exit 2; }
  export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "NVRTC: $lib"
fi
status=0
step() {
  echo; echo "== $*"
  local t0=$SECONDS
  "$@" || { echo "FAILED ($?): $*"; status=1; }
  echo "-- $((SECONDS - t0)) s"
}
export BCL_TEST_CUDA=1 RUST_BACKTRACE=1 BCL_SAMPLE_PLUGIN=$(realpath "$bins/libarena.so")
step timeout 150 "$bins/cuda" --include-ignored --test-threads=1
step timeout 120 "$bins/backends_agree" --test-threads=1
step timeout 200 "$bins/cuda_ring" --include-ignored --test-threads=1
step timeout 120 "$bins/cuda_bandwidth" 0 1024 20
c_abi_ranks() {
  local exe=$1 mode=${2:-BCL_TEST_PAGEABLE_COPY=1} id pids=() rank status=0
  id=$(python3 -c 'import secrets, socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(f"bcl://127.0.0.1:{s.getsockname()[1]}/{secrets.token_hex(16)}")')
  for rank in 0 1 2 3; do
    device=cpu; [ $rank -lt 2 ] && device=cuda:0
    env "$mode" BCL_RANK=$rank BCL_WORLD_SIZE=4 BCL_UNIQUE_ID=$id BCL_DEVICE=$device \
      BCL_INIT_TIMEOUT_S=30 BCL_TIMEOUT_S=20 LD_LIBRARY_PATH=$bins${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      timeout 60 "$exe" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  return $status
}
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -n "$nvcc" ]; then
  step "$nvcc" -O2 -Iinclude bcl-ffi/tests/cuda/streams.cu -L"$bins" -lbcl -o /tmp/bcl-c-abi-streams
  step c_abi_ranks /tmp/bcl-c-abi-streams
  step c_abi_ranks /tmp/bcl-c-abi-streams BCL_TEST_SYNC_FIRST=1
else
  echo "FAILED: no nvcc on this machine: the C ABI's CUDA test did not run"; status=1
fi
for sweep in 4:cpu 4:cuda:0,cpu,cpu,cpu 4:cuda:0,cuda:0,cpu,cpu 2:cpu 2:cuda:0,cpu \
  4:cuda:0,plugin:0,cpu,plugin:1; do
  n=${sweep%%:*} devices=${sweep#*:}
  BCL_DEVICE_PLUGIN=$BCL_SAMPLE_PLUGIN step timeout 100 "$bins/bcl-bench" allreduce --nranks "$n" --devices "$devices" \
    -b 8 -e 256M -f 4 -n 10 -w 3 --json "$out/allreduce-$n-${devices//[:,]/_}.json"
done
for victim in 3 0; do
  step timeout 100 "$bins/bcl-bench" allreduce --nranks 4 --devices cuda:0,cuda:0,cpu,cpu \
    -b 8 -e 64M -f 8 -n 5 -w 2 --recover "$victim" --json "$out/recover-$victim.json"
done
# The torch backend on CUDA tensors: built here against this machine's torch (pip, no network:
# --no-build-isolation, --no-deps), linked with the cuda-featured libbcl from $bins, then
# python/tests/check_cuda.py on 2 ranks sharing the GPU.
torch_cuda() {
  local site=/tmp/bcl-torch-site root=$PWD
  python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"' || return 1
  rm -rf "$site"
  BCL_PREBUILT_LIBRARY=$(realpath "$bins/libbcl.so") python3 -m pip install --quiet --no-deps \
    --no-build-isolation --target "$site" ./python || return 1
  (cd /tmp && PYTHONPATH=$site timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 \
    "$root/python/tests/check_cuda.py")
}
step torch_cuda
echo; [ $status -eq 0 ] && echo "device-check: all passed" || echo "device-check: FAILURES above"
exit $status
