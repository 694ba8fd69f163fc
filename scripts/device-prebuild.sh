#!/usr/bin/env bash
# Builds (release, `--features cuda`) what scripts/device-check.sh runs on a GPU machine and
# copies it, without debug info, into DIR (default .device-bin, ignored by git): the cuda
# backend's tests, the backend conformance tests, the mixed-ring tests, bcl-bench, the
# cuda_bandwidth example, libbcl.so (for the C ABI's CUDA test, which nvcc builds there) and the
# sample device plugin (libarena.so). The lent GPU machines have no Rust toolchain: build here, carry DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.device-bin}
mkdir -p "$dir"
json=$(mktemp)
cargo test --release --locked --features cuda -p bcl-backends -p bcl-tests --no-run \
  --message-format=json >"$json"
cargo build --release --locked --features cuda -p bcl-bench -p bcl-backends --bins --examples \
  --message-format=json >>"$json"
cargo build --release --locked --features cuda -p bcl-ffi --lib --message-format=json >>"$json"
python3 - "$json" "$dir" <<'PY'
import json, shutil, subprocess, sys
wanted = {"cuda", "backends_agree", "cuda_ring", "bcl-bench", "cuda_bandwidth", "libbcl.so"}
found = {}
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact":
        continue
    if m.get("executable") and m["target"]["name"] in wanted:
        found[m["target"]["name"]] = m["executable"]
    for f in m.get("filenames", []):
        if f.endswith("/libbcl.so"):
            found["libbcl.so"] = f
missing = wanted - found.keys()
if missing:
    sys.exit(f"device-prebuild: not built: {sorted(missing)}")
for name, path in found.items():
    dst = f"{sys.argv[2]}/{name}"
    shutil.copyfile(path, dst)
    subprocess.run(["strip", "--strip-debug", dst], check=True)
    shutil.copymode(path, dst)
    print(f"{dst}  <- {path}")
PY
rm -f "$json"
# The sample device plugin, for backends_agree and the three-vendor ring there.
cc -std=gnu11 -O2 -fPIC -shared -I include examples/device-plugin/arena_plugin.c \
  -o "$dir/libarena.so" -lm
du -sh "$dir"
