#!/usr/bin/env bash
# The 4-rank figure of issue 26 against its like-for-like raw figure, between four Soft-RoCE VMs
# of one vCPU each on one host bridge (a tap per guest, rxe2 on its virtio NIC): one rank per
# "host", each with its own CPU for its NIC's packet work, as scripts/rdma-two-vms.sh does for
# 2 ranks. The raw figure is four ib_write_bw streams at once in a ring (guest k writes to guest
# k+1 while guest k-1 writes to it): every guest sends one stream and receives one, as every rank
# of a 4-rank allreduce does at each step. Per round, interleaved: the ring of streams, bcl-bench
# allreduce of 16 MiB over rdma (auto, then the ring forced), the ring of streams again. A
# 4-rank bcl-bench over tcp starts each part, so the guests begin it together.
# This host runs four vCPUs on its cores (two here): the raw streams and the allreduce run
# under the same sharing.
#   scripts/rdma-four-vms.sh [ROUNDS] [OUTDIR]       (needs root: a bridge and four taps)
# Results: OUTDIR/g{1..4}/*.txt, and the summary printed at the end (REUSE=1: the summary of
# OUTDIR's results again, nothing run).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
out=${2:-target/rdma-vm/four}
[ -n "${REUSE:-}" ] || run=1
summary() {
python3 - "$out" "$rounds" <<'PY'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def stream(g, name):  # perftest's average, MiB/s, as 10^6 B/s (the writer's report)
    m = re.search(r"^\s*1048576\s+\d+\s+[\d.]+\s+([\d.]+)", open(f"{out}/g{g}/ib_write_bw-{name}.txt").read(), re.M)
    if not m:
        sys.exit(f"rdma-four-vms: guest {g}: no ib_write_bw result in ib_write_bw-{name}.txt")
    return float(m.group(1)) * 1.048576
def ring(name):  # the mean stream of the four at once
    return statistics.mean(stream(g, name) for g in range(1, 5))
def busbw(name):  # rank 0's out-of-place 16 MiB row: its time (µs) -> busbw, MB/s
    text = open(f"{out}/g1/{name}.txt").read()
    m = re.search(r"^\s*16777216\s+\d+\s+\S+\s+\S+\s+-?\d+\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+(\d+)", text, re.M)
    if not m or m.group(2) != "0" or "Out of bounds values : 0 OK" not in text:
        sys.exit(f"rdma-four-vms: {name}: no checked 16 MiB row")
    # bcl-bench prints GB/s to two places, too coarse here; busbw = 2(n-1)/n x bytes / time
    return 1.5 * 16777216 / float(m.group(1))
print("MB/s (10^6). ring of streams: four ib_write_bw of 1 MiB writes at once, the mean stream,")
print("before / after the bcl-bench runs; allreduce: 4 ranks, 16 MiB, out of place, busbw")
print("round  ring of streams  allreduce auto  of ring  allreduce ring  of ring")
for r in range(1, rounds + 1):
    before, after = ring(f"ring-before-{r}"), ring(f"ring-after-{r}")
    raw = (before + after) / 2
    auto, rg = busbw(f"allreduce-auto-{r}"), busbw(f"allreduce-ring-{r}")
    print(f"{r:5}  {before:7.1f}/{after:<7.1f}  {auto:14.1f}  {auto / raw:7.0%}  {rg:14.1f}  {rg / raw:7.0%}")
PY
}
if [ -z "${run:-}" ]; then summary; exit; fi
bash scripts/rdma-vm.sh install
cargo build --release --locked --features rdma -p bcl-bench
mkdir -p target/rdma-vm "$out"
cp target/release/bcl-bench target/rdma-vm/bcl-bench
out=$(cd "$out" && pwd)
for g in 1 2 3 4; do rm -rf "$out/g$g"; mkdir -p "$out/g$g"; done

# The wire: a bridge and a tap per guest (names within the kernel's 15 characters), gone at
# exit. Bridged frames must not pass through the host's packet filter (a FORWARD policy could
# drop them): its sysctl is restored at exit.
br=br-bcl$$
nf=/proc/sys/net/bridge/bridge-nf-call-iptables
cleanup() {
  for g in 1 2 3 4; do ip link del "tb$$-$g" 2>/dev/null || true; done
  ip link del "$br" 2>/dev/null || true
  [ -z "${nf_was:-}" ] || echo "$nf_was" > "$nf"
}
trap cleanup EXIT
ip link add "$br" type bridge
ip link set "$br" up
for g in 1 2 3 4; do
  ip tuntap add dev "tb$$-$g" mode tap
  ip link set "tb$$-$g" master "$br"
  ip link set "tb$$-$g" up
done
if [ -e "$nf" ]; then nf_was=$(cat "$nf"); echo 0 > "$nf"; fi

# Guest $1 (1-4: 10.253.0.$1, rank $1 - 1). Stream k goes from guest k to guest k % 4 + 1 on
# port base + k: a guest serves its left neighbour's stream and writes its own to the right.
guest() {
  cat <<GUEST
g=$1 o=$out/g$1 rounds=$rounds
bench=target/rdma-vm/bcl-bench
right=\$((g % 4 + 1)) left=\$(((g + 2) % 4 + 1))
rank() { # name port [bcl-bench arguments...]: this guest's rank of a 4-rank run
  local name=\$1 port=\$2; shift 2
  timeout 900 env BCL_WORLD_SIZE=4 BCL_RANK=\$((g - 1)) BCL_ROOT=10.253.0.1:\$port \\
    BCL_BIND_IP=10.253.0.\$g BCL_SECRET=four-vms BCL_RDMA_DEVICE=rxe2 BCL_INIT_TIMEOUT_S=300 \\
    \$bench "\$@" > \$o/\$name.txt 2>&1
}
together() { # port: a 4-rank allreduce over tcp, so the four guests start what follows at once
  rank together-\$1 \$1 allreduce --transport tcp -b 8 -e 8 -n 1 -w 0
}
streams() { # name port
  together \$2
  local base=\$((\$2 + 10))
  timeout 300 ib_write_bw -d rxe2 -x 1 -s 1048576 -D 10 -p \$((base + left)) \\
    > \$o/ib_write_bw-\$1-server.txt 2>&1 &
  local server=\$!
  sleep 3
  for _ in \$(seq 60); do
    timeout 300 ib_write_bw -d rxe2 -x 1 -s 1048576 -D 10 -p \$((base + g)) 10.253.0.\$right \\
      > \$o/ib_write_bw-\$1.txt 2>&1 && break
    sleep 1
  done
  wait \$server
}
for r in \$(seq \$rounds); do
  p=\$((19000 + 100 * r))
  streams ring-before-\$r \$p
  together \$((p + 30)) && rank allreduce-auto-\$r \$((p + 31)) allreduce --transport rdma -b 16M -e 16M -n 5 -w 1
  together \$((p + 40)) && rank allreduce-ring-\$r \$((p + 41)) allreduce --transport rdma --algo ring -b 16M -e 16M -n 5 -w 1
  streams ring-after-\$r \$((p + 50))
done
GUEST
}
export BCL_RDMA_VM_CPUS=1 BCL_RDMA_VM_MEMORY=1536 BCL_RDMA_VM_TIMEOUT=${BCL_RDMA_VM_TIMEOUT:-3600}
pids=()
for g in 1 2 3 4; do
  guest $g > "$out/g$g.sh"
  BCL_RDMA_VM_WIRE="tap=tb$$-$g" BCL_RDMA_VM_IP=10.253.0.$g \
    bash scripts/rdma-vm.sh run "bash $out/g$g.sh" "$out/g$g" > "$out/g$g-console.txt" 2>&1 &
  pids+=($!)
  sleep 1
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
[ "$status" = 0 ] || { tail -20 "$out"/g*-console.txt; echo "rdma-four-vms: a guest failed"; exit 1; }
summary
