#!/usr/bin/env bash
# bcl-sim against bcl-bench on this machine: allreduce on 2, 4 and 8 local ranks over shm and
# over TCP (rounds interleaved: every configuration once per round, so the VM's fast and slow
# states fall on all alike), then on 2 network-namespace hosts x 4 ranks joined by veths
# shaped with tc (scripts/hier-bench.sh, ring and hier-ring interleaved), each against
# bcl-sim calibrated from this machine's constants measured in the same rounds: each round
# also runs the cost model's fitting runs (scripts/measure-cost-model.sh's: ring and recursive
# doubling on 2 and 4 ranks, 8 B to 32 MiB) over shm and TCP, fitted as that script does
# (scripts/lib/cost_fit.py) into alpha (2 and 4 ranks), beta and gamma per transport, and beta
# by size (CURVE=1, the default: one figure per calibration size from 32 KiB up, the 2-rank
# ring's, for bcl-sim's beta-curve, keyed by both ranks' bytes: the ranks share the caches);
# between the namespace hosts, the shaped link's goodput measured first (a 2-host sendrecv).
#
#   scripts/sim-validate.sh [ROUNDS] [RATE]         # default 5 rounds, 2gbit
#   CURVE=0 REUSE=1 scripts/sim-validate.sh         # the same runs, one beta at every size
#
# Needs root (namespaces, tc) for the last part; NETNS=0 skips it. OUT (default
# /tmp/sim-validate) gets every run's JSON, table.md (measured median, range, simulated,
# error) and plot.svg (bcl-bench plot: measured and simulated side by side).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
rate=${2:-2gbit}
out=${OUT:-/tmp/sim-validate}
# REUSE=1: keep OUT's runs (recompute the fit, the simulations and the table).
[ "${REUSE:-0}" = 1 ] || rm -rf "$out"
mkdir -p "$out"
cargo build --release --locked -q -p bcl-bench -p bcl-sim
bench=target/release/bcl-bench
sim=target/release/bcl-sim
sizes="-b 64K -e 32M -f 8"

for round in $(seq 1 "$rounds"); do
    [ "${REUSE:-0}" = 1 ] && break
    for transport in shm tcp; do
        for n in 2 4; do
            for algo in ring rd; do
                timeout 600 "$bench" allreduce --nranks "$n" --transport "$transport" --algo "$algo" \
                    -b 8 -e 32M -f 4 -n 30 -w 5 -c 0 --json "$out/cal-$transport-$n-$algo-r$round.json" >/dev/null
            done
        done
        for n in 2 4 8; do
            timeout 600 "$bench" allreduce --nranks "$n" --transport "$transport" $sizes -n 10 -w 3 -c 0 \
                --json "$out/bench-$transport-$n-r$round.json" >/dev/null
        done
    done
    echo "round $round of $rounds done"
done
# The constants: gamma held at cost.rs's (GAMMA_SHM_GBS, GAMMA_TCP_GBS), as
# scripts/measure-cost-model.sh holds it between hosts: on this noisy VM the three-way fit of
# 2 ranks put gamma below zero (ring and doubling differ in it by half the reduced bytes
# only). Then, per rank count, alpha from the sizes to 2 KiB and beta from 128 KiB to 4 MiB
# with that alpha (that script's hosts class): one line through 8 B-4 MiB weighted by relative
# error follows the small sizes and was 2x fast at 4 MiB here. And beta at each size from
# 32 KiB up, from the 2-rank ring: past the caches a byte costs more, which one beta cannot
# carry. (Not from doubling: its one message of the whole buffer, received then reduced, took
# twice the ring's time at 32 MiB, where the model has them within 25%.)
GAMMA_SHM_GBS=${GAMMA_SHM_GBS:-6.24} GAMMA_TCP_GBS=${GAMMA_TCP_GBS:-4.97} CURVE=${CURVE:-1} \
    python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
sys.path.insert(0, "scripts/lib")
from cost_fit import coefficients, fit
out = sys.argv[1]
keys = {}
for t in ("shm", "tcp"):
    times = {}
    for f in glob.glob(f"{out}/cal-{t}-*-r*.json"):
        n, algo = f.split("/")[-1].split("-")[2:4]
        for line in open(f):
            o = json.loads(line)
            if not o["in_place"]:
                times.setdefault((int(n), algo, o["size_bytes"]), []).append(o["time_us"] * 1e-6)
    med = {k: statistics.median(v) for k, v in times.items()}
    gamma = 1 / float(os.environ[f"GAMMA_{t.upper()}_GBS"]) / 1e9

    def constants(world):
        keys = sorted(k for k in med if k[0] == world)
        a, _, _ = fit([k for k in keys if k[2] <= 2048], med, gamma)
        b = statistics.median(per_byte(k, a) for k in keys if 131072 <= k[2] <= 4 << 20)
        return a, b

    def per_byte(k, a):
        steps, sent, reduced = coefficients(*k)
        return (med[k] - steps * a - reduced * gamma) / sent

    a2, b2 = constants(2)
    a4, _ = constants(4)
    assert a2 > 0 and a4 > 0 and b2 > 0, f"{t}: the fit is not physical: {a2} {a4} {b2}"
    keys[t] = dict(alpha2=a2 * 1e6, alpha4=a4 * 1e6, beta=1 / b2 / 1e9, gamma=1 / gamma / 1e9)
    print(f"# {t}: alpha 2 ranks {a2*1e6:.1f} us, 4 ranks {a4*1e6:.1f} us; 1/beta {1/b2/1e9:.2f} GB/s; 1/gamma {1/gamma/1e9:.2f} GB/s (held)")
    curve = []
    for size in sorted({k[2] for k in med if k[0] == 2 and k[2] >= 32768}):
        b = per_byte((2, "ring", size), a2)
        assert b > 0, f"{t}: beta at {size} B is not physical: {b}"
        curve.append((size, 1 / b / 1e9))
    print(f"# {t}: 1/beta by size (2 ranks): " + ", ".join(f"{s} B {g:.2f}" for s, g in curve) + " GB/s")
    if os.environ["CURVE"] == "1":
        keys[t]["beta-curve"] = "/".join(f"{2 * s}:{g:.4g}" for s, g in curve)
for t in ("shm", "tcp"):
    open(f"{out}/cal-{t}.spec", "w").write(",".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in keys[t].items()))
tcp = keys["tcp"]
open(f"{out}/cal-tcp-between.spec", "w").write(
    f"tcp-alpha2={tcp['alpha2']:.4g},tcp-alpha4={tcp['alpha4']:.4g},tcp-beta={tcp['beta']:.4g}")
PY
for transport in shm tcp; do
    for n in 2 4 8; do
        "$sim" allreduce --nranks "$n" --topology "local,transport=$transport,$(cat "$out/cal-$transport.spec")" \
            $sizes --json "$out/sim-$transport-$n.json" >/dev/null
    done
done

if [ "${NETNS:-1}" != 0 ] && ! { [ "${REUSE:-0}" = 1 ] && [ -f "$out/netns/median-ring.json" ]; }; then
    # The shaped link's goodput: one rank per host, sendrecv of 16 MiB (busbw = bytes/s).
    OUT="$out/link" ITERS=5 COLL=sendrecv scripts/hier-bench.sh 2 1 3 "ring" "-b 16M -e 16M" "$rate" >/dev/null
    OUT="$out/netns" ITERS=5 scripts/hier-bench.sh 2 4 "$rounds" "ring hier-ring" "-b 64K -e 16M -f 4" "$rate" >/dev/null
fi
if [ -f "$out/link/median-ring.json" ]; then
    goodput=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['busbw_gbs'])" "$out/link/median-ring.json")
    echo "shaped link: $goodput GB/s goodput"
    for algo in ring hier-ring; do
        "$sim" allreduce --nranks 8 -b 64K -e 16M -f 4 \
            --topology "local,hosts=2,nic=1x$goodput,$(cat "$out/cal-shm.spec"),$(cat "$out/cal-tcp-between.spec")" \
            --algo "$algo" --json "$out/sim-netns-$algo.json" >/dev/null
    done
fi

python3 - "$out" "$rounds" <<'PY'
import glob, json, os, statistics, sys
out, rounds = sys.argv[1], sys.argv[2]
def load(path):
    return [json.loads(l) for l in open(path)]
cases = []  # (label, measured rows per round, simulated rows, series file for the plot)
for t in ("shm", "tcp"):
    for n in (2, 4, 8):
        runs = [load(p) for p in sorted(glob.glob(f"{out}/bench-{t}-{n}-r*.json"))]
        cases.append((f"{t}, {n} ranks", runs, load(f"{out}/sim-{t}-{n}.json")))
for algo in ("ring", "hier-ring"):
    med = f"{out}/netns/median-{algo}.json"
    if os.path.exists(med):
        runs = [load(p) for p in sorted(glob.glob(f"{out}/netns/{algo}-r*.json"))]
        cases.append((f"2 namespace hosts x 4, {algo}", runs, load(f"{out}/sim-netns-{algo}.json")))
lines = ["| configuration | size | measured µs: median (range) | simulated µs | simulated vs median |",
         "|---|---|---|---|---|"]
worst = 0.0
for label, runs, simulated in cases:
    sim = {r["size_bytes"]: r["time_us"] for r in simulated if not r["in_place"]}
    series = []
    for size in sorted(sim):
        got = [r["time_us"] for run in runs for r in run if r["size_bytes"] == size and not r["in_place"]]
        wrong = [r["wrong"] for run in runs for r in run if r["size_bytes"] == size]
        assert got and not any(wrong), f"{label} {size}: no clean measurement"
        m = statistics.median(got)
        err = sim[size] / m - 1
        worst = max(worst, abs(err))
        lines.append(f"| {label} | {size} | {m:.1f} ({min(got):.1f}-{max(got):.1f}) | {sim[size]:.1f} | {100*err:+.1f}% |")
        base = next(r for run in runs for r in run if r["size_bytes"] == size and not r["in_place"])
        series.append(dict(base, time_us=m, busbw_gbs=base["busbw_gbs"] * base["time_us"] / m))
    tag = label.replace(", ", "-").replace(" ", "_")
    with open(f"{out}/measured-{tag}.json", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in series)
    with open(f"{out}/simulated-{tag}.json", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in simulated if not r["in_place"])
lines.append(f"\nWorst |simulated/measured - 1|: {100*worst:.1f}% (medians of {rounds} interleaved rounds)")
text = "\n".join(lines) + "\n"
open(f"{out}/table.md", "w").write(text)
print(text)
PY
files=()
for f in "$out"/measured-*.json "$out"/simulated-*.json; do files+=("$f"); done
"$bench" plot "${files[@]}" -o "$out/plot.svg" --title "bcl-sim against bcl-bench (allreduce, out of place)"
echo "plot: $out/plot.svg"
