#!/usr/bin/env bash
# Install libbcl into a temporary prefix with `make install`, build examples/c/allreduce.c
# with pkg-config exactly as the README shows, and run it on N local processes.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
make -s install PREFIX="$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc -std=c99 -Wall -Wextra -Werror examples/c/allreduce.c $(pkg-config --cflags --libs bcl) -o "$prefix/allreduce"
id=$(python3 -c 'import secrets, socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(f"bcl://127.0.0.1:{s.getsockname()[1]}/{secrets.token_hex(16)}")')
pids=()
for ((r = 0; r < n; r++)); do
  BCL_RANK=$r BCL_WORLD_SIZE=$n BCL_UNIQUE_ID=$id BCL_INIT_TIMEOUT_S=30 BCL_TIMEOUT_S=30 \
    timeout 60 "$prefix/allreduce" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
