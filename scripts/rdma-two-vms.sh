#!/usr/bin/env bash
# The 2-rank figures of issue 26 between two Soft-RoCE VMs of one vCPU each, joined by a virtual
# wire (a qemu socket netdev under a virtio NIC, rxe2 on it in each guest): one rank per "host",
# each with its own CPU for its NIC's packet work, as on two hosts with an RNIC each, instead of
# every rank and both ends of every transfer sharing one VM's CPUs (scripts/rdma-vm-test.sh).
# Per round, interleaved: ib_write_bw one-way and bidirectional (-b) between the VMs, bcl-bench
# allreduce and broadcast of 16 MiB over rdma (rank 0 in VM a, rank 1 in VM b), ib_write_bw
# again. Results: OUTDIR/{a,b}/*.txt, and the summary printed at the end.
#   scripts/rdma-two-vms.sh [ROUNDS] [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
out=${2:-target/rdma-vm/two}
bash scripts/rdma-vm.sh install
cargo build --release --locked --features rdma -p bcl-bench
mkdir -p target/rdma-vm "$out"
cp target/release/bcl-bench target/rdma-vm/bcl-bench
out=$(cd "$out" && pwd)
rm -rf "$out/a" "$out/b"
mkdir -p "$out/a" "$out/b"
wire=$((18700 + RANDOM % 200))

# One guest's part; $1 = a (10.253.0.1: servers, rank 0) or b (10.253.0.2: clients, rank 1).
# Pairs meet by retrying the client side, so neither guest needs to know when the other booted.
guest() {
  cat <<GUEST
side=$1 o=$out/$1 rounds=$rounds
bench=target/rdma-vm/bcl-bench
raw() { # name port [flags]
  local f=\$o/ib_write_bw-\$1.txt
  if [ \$side = a ]; then
    timeout 300 ib_write_bw -d rxe2 -x 1 -s 1048576 -n 100 -p \$2 \${3:-} > \$f 2>&1
  else
    for _ in \$(seq 120); do
      timeout 300 ib_write_bw -d rxe2 -x 1 -s 1048576 -n 100 -p \$2 \${3:-} 10.253.0.1 > \$f 2>&1 && return 0
      sleep 1
    done
    return 1
  fi
}
bcl() { # name port collective
  local rank=0 ip=10.253.0.1
  [ \$side = b ] && rank=1 ip=10.253.0.2
  timeout 600 env BCL_WORLD_SIZE=2 BCL_RANK=\$rank BCL_ROOT=10.253.0.1:\$2 BCL_BIND_IP=\$ip \\
    BCL_SECRET=two-vms BCL_TRANSPORT=rdma BCL_RDMA_DEVICE=rxe2 BCL_INIT_TIMEOUT_S=120 \\
    \$bench \$3 -b 16M -e 16M -n 5 -w 1 > \$o/\$1.txt 2>&1
}
for r in \$(seq \$rounds); do
  p=\$((19000 + 100 * r))
  for when in before after; do
    [ \$when = after ] && p=\$((p + 4)) &&
      bcl allreduce-\$r \$((p + 2)) allreduce && bcl broadcast-\$r \$((p + 3)) broadcast
    raw one-way-\$when-\$r \$p
    raw bidir-\$when-\$r \$((p + 1)) -b
  done
done
GUEST
}
guest a > "$out/a.sh"
guest b > "$out/b.sh"
export BCL_RDMA_VM_CPUS=1 BCL_RDMA_VM_MEMORY=2048 BCL_RDMA_VM_TIMEOUT=${BCL_RDMA_VM_TIMEOUT:-1800}
BCL_RDMA_VM_WIRE="listen=:$wire" BCL_RDMA_VM_IP=10.253.0.1 \
  bash scripts/rdma-vm.sh run "bash $out/a.sh" "$out/a" > "$out/a-console.txt" 2>&1 &
sleep 1
status=0
BCL_RDMA_VM_WIRE="connect=127.0.0.1:$wire" BCL_RDMA_VM_IP=10.253.0.2 \
  bash scripts/rdma-vm.sh run "bash $out/b.sh" "$out/b" > "$out/b-console.txt" 2>&1 || status=$?
wait $! || status=$?
[ "$status" = 0 ] || { tail -20 "$out/a-console.txt" "$out/b-console.txt"; echo "rdma-two-vms: a guest failed"; exit 1; }
python3 - "$out" "$rounds" <<'PY'
import re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def raw(name):  # perftest's average, MiB/s, as 10^6 B/s; -b prints both directions' sum
    m = re.search(r"^\s*1048576\s+\d+\s+[\d.]+\s+([\d.]+)", open(f"{out}/b/ib_write_bw-{name}.txt").read(), re.M)
    return float(m.group(1)) * 1.048576 / (2 if name.startswith("bidir") else 1)
def bench(name):  # out-of-place time of the 16 MiB row, µs -> busbw MB/s (2 ranks: = algbw)
    m = re.search(r"^\s*16777216\s+\d+\s+\S+\s+\S+\s+-?\d+\s+([\d.]+)", open(f"{out}/a/{name}.txt").read(), re.M)
    return 16777216 / float(m.group(1))
print("MB/s (10^6); ib_write_bw: 1 MiB writes, before / after the bcl-bench runs; bidir: per direction")
print("round    one-way      bidir  allreduce busbw  broadcast busbw")
for r in range(1, rounds + 1):
    two = lambda k: f"{raw(k + '-before-' + str(r)):.1f}/{raw(k + '-after-' + str(r)):.1f}"
    print(f"{r:5}  {two('one-way'):>9}  {two('bidir'):>9}  "
          f"{bench(f'allreduce-{r}'):15.1f}  {bench(f'broadcast-{r}'):15.1f}")
PY
