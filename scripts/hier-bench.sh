#!/usr/bin/env bash
# Hierarchical against flat allreduce on namespace "hosts": HOSTS namespaces of PER_HOST
# ranks, each host's NICS NICs (veths into a bridge in a switch namespace) shaped to RATE
# with `tc tbf`; ranks of a host talk over shared memory, hosts over TCP. Every algorithm
# runs once per round, rounds interleaved (the VM's fast and slow states fall on all of
# them alike); the summary gives medians per algorithm and size, and what auto picked.
#
#   scripts/hier-bench.sh HOSTS PER_HOST ROUNDS "ALGOS" "SIZES" [RATE]
#   scripts/hier-bench.sh 2 4 5 "ring hier-ring auto" "-b 16M -e 64M -f 2"
#   ITERS=200 WARMUP=20 scripts/hier-bench.sh 8 2 5 "ring rd hier-ring hier-rd auto" "-b 8 -e 8"
#   COLL=allgather scripts/hier-bench.sh 2 4 2 "ring hier-ring auto" "-b 16M -e 64M -f 2"
#   scripts/hier-bench.sh 2 4 5 "hier-ring hier-ring+BCL_SLICE_BYTES=131072" "-b 16M -e 16M"
#   NICS=2 scripts/hier-bench.sh 2 2 5 "hier-ring hier-ring+NIC=0" "-b 16M -e 16M" 1gbit
# (an algorithm followed by +VAR=VALUE settings for its ranks). NICS (default 1): NICs per
# host, each shaped to RATE; a host's rank l binds to NIC l % NICS (a NIC per rail), or every
# rank to NIC k with the pseudo-setting +NIC=k (the rails sharing one NIC of the same hosts).
#
# BENCH: another bcl-bench build (default target/release/bcl-bench).
# Needs root, iproute2 and sch_tbf. OUT (default /tmp/hier-bench) receives each run's JSON,
# the medians (one JSON per algorithm, for `bcl-bench plot`) and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=${1:-2}
per=${2:-4}
rounds=${3:-5}
algos=${4:-"ring hier-ring auto"}
sizes=${5:-"-b 16M -e 64M -f 2"}
rate=${6:-2gbit}
iters=${ITERS:-5}
coll=${COLL:-allreduce}
warmup=${WARMUP:-1}
out=${OUT:-/tmp/hier-bench}
bench=${BENCH:-target/release/bcl-bench}
[ -x "$bench" ] || cargo build --release --locked -p bcl-bench
mkdir -p "$out"
rm -f "$out"/*.json "$out"/summary.md

. scripts/lib/netns-hosts.sh
nics=${NICS:-1}
hosts_up "$hosts" "$rate" "$nics"

world=$((hosts * per))
port=29700
run() { # label round; a label is an algorithm, then any +VAR=VALUE for its ranks
    local algo=$1 round=$2 pids=() r h name vars pin nic
    name=${algo%%+*}
    vars=$(echo "${algo#"$name"}" | tr '+' '\n' | grep -v '^NIC=' | tr '\n' ' ' || true)
    pin=$(echo "${algo#"$name"}" | tr '+' '\n' | sed -n 's/^NIC=//p')
    port=$((port + 1))
    for r in $(seq 0 $((world - 1))); do
        h=$((r / per))
        nic=${pin:-$(((r % per) % nics))}
        # shellcheck disable=SC2086
        on_host "$h" env $vars BCL_RANK="$r" BCL_WORLD_SIZE="$world" \
            BCL_ROOT="$(host_addr 0):$port" BCL_BIND_IP="$(host_addr "$h" "$nic")" BCL_TRANSPORT=auto \
            timeout 600 "$bench" "$coll" $sizes -n "$iters" -w "$warmup" --algo "$name" \
            --json "$out/$algo-r$round.json" >"$out/$algo-r$round.rank$r.txt" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p" || { echo "run $algo round $round failed:"; cat "$out/$algo-r$round.rank0.txt"; exit 1; }
    done
    grep -E '^ +[0-9]+ ' "$out/$algo-r$round.rank0.txt" | sed "s/^/$algo r$round /"
}

echo "# $coll, $hosts hosts x $per ranks, $nics NIC(s) per host at $rate, $rounds rounds of: $algos ($sizes, $iters iters)"
for round in $(seq 1 "$rounds"); do
    for algo in $algos; do run "$algo" "$round"; done
done

python3 - "$out" "$hosts" "$per" "$rate" "$algos" "$coll" <<'EOF'
import glob, json, os, statistics, sys
out, hosts, per, rate, algos, coll = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5].split(), sys.argv[6]
rows = {}  # (algo, size) -> [(time, busbw, picked)]
for algo in algos:
    for path in glob.glob(f"{out}/{algo}-r*.json"):
        for line in open(path):
            r = json.loads(line)
            if r["in_place"]:
                continue
            rows.setdefault((algo, r["size_bytes"]), []).append((r["time_us"], r["busbw_gbs"], r.get("algorithm", "?"), r["wrong"]))
sizes = sorted({s for (_, s) in rows})
lines = [f"{coll}, {hosts} hosts x {per} ranks, each host's NIC(s) at {rate} (tc tbf), out of place, medians of "
         f"{len(glob.glob(f'{out}/{algos[0]}-r*.json'))} interleaved rounds",
         "", "| size | " + " | ".join(f"{a} µs | {a} busbw GB/s" for a in algos) + " | auto ran |",
         "|---|" + "---|---|" * len(algos) + "---|"]
medians = {}
for s in sizes:
    cells, picked = [], ""
    for a in algos:
        got = rows.get((a, s), [])
        assert all(w == 0 for *_, w in got), f"wrong results in {a} {s}"
        t = statistics.median(g[0] for g in got) if got else float("nan")
        b = statistics.median(g[1] for g in got) if got else float("nan")
        medians[(a, s)] = (t, b)
        cells += [f"{t:.1f}", f"{b:.3f}"]
        if a == "auto" and got:
            picked = "/".join(sorted({g[2] for g in got}))
    lines.append(f"| {s} | " + " | ".join(cells) + f" | {picked} |")
flat = [a for a in algos if not a.startswith("hier") and a != "auto"]
for a in algos:
    if not a.startswith("hier"):
        continue
    for f in flat:
        ratios = [medians[(f, s)][0] / medians[(a, s)][0] for s in sizes if medians[(a, s)][0] > 0]
        lines.append(f"\n{a} against {f}: time ratio (flat / hierarchical) " + ", ".join(f"{s} B {x:.2f}x" for s, x in zip(sizes, ratios)))
text = "\n".join(lines) + "\n"
open(f"{out}/summary.md", "w").write(text)
print(text)
for a in algos:
    with open(f"{out}/median-{a}.json", "w") as f:
        for s in sizes:
            t, b = medians[(a, s)]
            f.write(json.dumps({"collective": coll, "nranks": int(hosts) * int(per), "size_bytes": s,
                                "in_place": False, "time_us": t, "busbw_gbs": b}) + "\n")
EOF
