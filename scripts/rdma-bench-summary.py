#!/usr/bin/env python3
"""BCL over rdma next to raw verbs, from one Soft-RoCE VM run of scripts/rdma-vm-test.sh.

Prints bus bandwidth in MB/s (bcl-bench's GB/s columns round these to 0.01) of bench-*.json
and its ratio to the mean of ib_write_bw-{before,after}.txt, measured around them on the same
device.
"""
import json
import pathlib
import re
import sys

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/rdma-vm/out")


def raw_mb_s(name):
    text = (out / f"ib_write_bw-{name}.txt").read_text()
    rows = re.findall(r"^\s*1048576\s+\d+\s+([\d.]+)\s+([\d.]+)", text, re.M)
    if not rows:
        sys.exit(f"no ib_write_bw result in {out}/ib_write_bw-{name}.txt")
    return float(rows[-1][1]) * 1.048576  # perftest's MB is MiB: report decimal MB/s


def table(pattern, reference):
    print(f"{'bcl-bench over rdma':<28}{'size':>10}{'placement':>14}{'busbw MB/s':>12}{'of raw':>9}")
    for path in sorted(out.glob(pattern)):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            label = f"{row['collective']} {row['nranks']} ranks"
            place = "in-place" if row["in_place"] else "out-of-place"
            busbw = row["busbw_gbs"] * 1000
            print(f"{label:<28}{row['size_bytes'] >> 20:>8}Mi{place:>14}{busbw:>12.1f}"
                  f"{100 * busbw / reference:>8.0f}%")


before, after = raw_mb_s("before"), raw_mb_s("after")
reference = (before + after) / 2
print(f"One device (rxe0), every rank on it. ib_write_bw, 1 MiB RDMA writes, one QP: "
      f"{before:.1f} MB/s before, {after:.1f} MB/s after, mean {reference:.1f} MB/s")
table("bench-*.json", reference)
