#!/usr/bin/env python3
"""Per-layer view of a kernel trace (tools/device/kernel_trace.sh's CSV, one decode step a graph replay):
what each kernel adds to the step beyond the kernels before it (its end minus the latest end so far),
averaged over the last 20 whole steps, with gpt-oss's layer kinds told apart: the decode attention of
sliding (even) and full (odd) layers, and the RMSNorm before the QKV projection from the one after the
O projection. A step starts at the embedding gather. Usage: ktrace_layers.py TRACE.csv[.gz] ..."""
import csv
import gzip
import statistics
import sys


def steps_of(path, count=20):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = sorted(csv.DictReader(f), key=lambda x: int(x["start_ns"]))
    starts = [i for i, x in enumerate(rows) if "embedding_gather" in x["name"]]
    return [rows[starts[i]:starts[i + 1]] for i in range(max(0, len(starts) - count - 1), len(starts) - 1)]


def short(name):
    return name.replace("void ", "").split("(")[0].split("<")[0]


def main():
    for path in sys.argv[1:]:
        steps = steps_of(path)
        adds = {}
        for step in steps:
            frontier = int(step[0]["start_ns"])
            layer = -1
            for i, k in enumerate(step):
                name = short(k["name"])
                if "qkv" in name:
                    layer += 1
                end = int(k["end_ns"])
                kind = name
                if "sdpa" in name:
                    kind += "_full" if layer % 2 == 1 else "_sliding"
                if "rmsnorm" in name and i + 1 < len(step):
                    kind += "_before_qkv" if "qkv" in short(step[i + 1]["name"]) else "_other"
                adds.setdefault(kind, []).append(max(0, end - frontier) / 1000)
                frontier = max(frontier, end)
        print(f"{path}: {len(steps)} steps")
        print(f"  {'kernel':48s} {'per step':>8s} {'mean adds us':>12s} {'us a step':>10s}")
        for kind, v in sorted(adds.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {kind:48s} {len(v) / len(steps):8.1f} {statistics.mean(v):12.2f} {sum(v) / len(steps):10.1f}")


if __name__ == "__main__":
    main()
