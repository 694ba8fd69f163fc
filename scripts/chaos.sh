#!/usr/bin/env bash
# The chaos soak: jobs of 4 rank processes running collectives whose every result is checked,
# each hit by one fault at a random moment (SIGKILL; SIGSTOP shorter and longer than the hang
# timeout; a stranger sending garbage and a replayed handshake to every listening port; a
# flood of idle connections to them; a CPU hog; on namespace hosts, a tc-slowed link, a veth
# down and up, a veth down for good), trials alternating between shared memory and tcp.
# Prints per fault class: culprit and cause named, verdict latency p50/p95/max, false
# verdicts, wrong results, hung jobs and what was left (descriptors, threads and listening
# ports each surviving rank held after destroying its communicator; /dev/shm names); fails on
# any false verdict, wrong result, hang, leftover, miss or fault not injected (root needed).
# Usage: scripts/chaos.sh [short|long|TRIALS] [CLASS...]   (short: 3 trials per class, CI;
# long: 30, for the figures in docs/chaos.md)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-short}
shift || true
case "$mode" in
  short) trials=3 ;;
  long) trials=30 ;;
  '' | *[!0-9]*) echo "chaos.sh: short, long or a number of trials, not '$mode'" >&2; exit 2 ;;
  *) trials=$mode ;;
esac
cargo build --release --locked -p bcl-tests --bins
echo "== chaos: $trials trials per class"
timeout 3000 target/release/bcl-chaos "$trials" "$@"
