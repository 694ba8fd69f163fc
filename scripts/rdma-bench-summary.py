#!/usr/bin/env python3
"""BCL over rdma next to raw verbs, from one Soft-RoCE VM run of scripts/rdma-vm-test.sh.

Prints bus bandwidth in MB/s (bcl-bench's GB/s columns round these to 0.01) of bench-*.json
and its ratio to two raw figures measured around it (before and after, means) on the same
device:
- one-way: ib_write_bw, one QP, one process posting (ib_write_bw-{before,after}.txt);
- like-for-like: what each rank of the collective's ring sends while it also receives. For a
  2-rank allreduce, `ib_write_bw -b` (both ends post; perftest prints the sum of the two
  directions, halved here); for a 4-rank allreduce, four one-way pairs at once in a ring
  (ib_write_bw-ring4-K-*.txt, the mean of the four streams); for a 2-rank broadcast, which
  sends one way, the one-way figure.
"""
import json
import pathlib
import re
import sys

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/rdma-vm/out")


def mb_s(path, required=True):
    text = path.read_text()
    rows = re.findall(r"^\s*1048576\s+\d+\s+([\d.]+)\s+([\d.]+)", text, re.M)
    if not rows:
        if required:
            sys.exit(f"no ib_write_bw result in {path}")
        return None
    return float(rows[-1][1]) * 1.048576  # perftest's MB is MiB: report decimal MB/s


def mean(xs):
    return sum(xs) / len(xs)


def around(name):
    return [mb_s(out / f"ib_write_bw-{name}-{when}.txt") if name else
            mb_s(out / f"ib_write_bw-{when}.txt") for when in ("before", "after")]


one_way = around("")
bidir = [x / 2 for x in around("bidir")]
# A pair of the four sometimes fails perftest's closing exchange of results under TCG
# ("Couldn't read remote address") after moving its data: the mean is over those that report.
ring4, reported = [], []
for when in ("before", "after"):
    streams = [mb_s(out / f"ib_write_bw-ring4-{k}-{when}.txt", required=False) for k in range(4)]
    streams = [s for s in streams if s is not None]
    if len(streams) < 2:
        sys.exit(f"fewer than 2 of the 4 ring pairs reported ({when})")
    ring4.append(mean(streams))
    reported.append(len(streams))
print("One device (rxe0), every rank on it; ib_write_bw, 1 MiB RDMA writes, MB/s before / after:")
print(f"  one-way, one QP:                        {one_way[0]:6.1f} / {one_way[1]:6.1f}")
print(f"  bidirectional (-b), per direction:      {bidir[0]:6.1f} / {bidir[1]:6.1f}")
print(f"  4 one-way pairs at once, per stream:    {ring4[0]:6.1f} / {ring4[1]:6.1f}"
      f"   ({reported[0]} / {reported[1]} of 4 pairs reported)")


def like_for_like(row):
    if row["collective"] == "allreduce" and row["nranks"] == 2:
        return mean(bidir), "bidir"
    if row["collective"] == "allreduce" and row["nranks"] == 4:
        return mean(ring4), "ring4"
    return mean(one_way), "one-way"


print(f"{'bcl-bench over rdma':<24}{'size':>8}{'placement':>14}{'busbw MB/s':>12}"
      f"{'of one-way':>12}{'of like-for-like':>22}")
for path in sorted(out.glob("bench-*.json")):
    for line in path.read_text().splitlines():
        row = json.loads(line)
        label = f"{row['collective']} {row['nranks']} ranks"
        place = "in-place" if row["in_place"] else "out-of-place"
        busbw = row["busbw_gbs"] * 1000
        ref, which = like_for_like(row)
        print(f"{label:<24}{row['size_bytes'] >> 20:>6}Mi{place:>14}{busbw:>12.1f}"
              f"{100 * busbw / mean(one_way):>11.0f}%{100 * busbw / ref:>13.0f}% ({which})")
