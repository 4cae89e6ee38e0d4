#!/usr/bin/env python3
"""What each kernel adds to a decode step, from a kernel timeline (tools/device/kernel_trace: CUPTI
start / end of every kernel, CUDA graphs and PDL overlap included).

A step is the run of kernels from one embedding gather to the next. The last --steps steps with the
most common kernel count (steady state: graphs captured) are taken. Walking a step's kernels in start
order with the frontier (the latest end so far): a kernel that starts after the frontier leaves the GPU
idle for the difference ("idle"); what it ends beyond max(frontier, its start) is what it adds to the
step ("adds"). Per step, idle + adds over all kernels = the step's span on the GPU; the period (one
step's first start to the next's) also holds the host's time between steps.

Usage: ktrace_summary.py ktrace.csv [--steps 20] [--first 24] [--step-kernel embedding_gather]
"""
import argparse
import csv
import re
import statistics
from collections import Counter, defaultdict


def short(name):
    """The function's name without namespace, template arguments or parameters."""
    base = re.sub(r"<.*", "", name.split("(")[0])
    return base.split("::")[-1] or name[:40]


def load(path):
    with open(path, newline="") as f:
        rows = [(int(r["start_ns"]), int(r["end_ns"]), r["name"]) for r in csv.DictReader(f)]
    rows.sort()
    return rows


def split_steps(rows, first_kernel):
    steps, current = [], None
    for row in rows:
        if first_kernel in row[2]:
            if current:
                steps.append(current)
            current = [row]
        elif current is not None:
            current.append(row)
    if current:
        steps.append(current)
    return steps


def walk(step):
    """Per kernel: (name, start offset, duration, idle before, adds), all in ns."""
    t0, frontier, out = step[0][0], step[0][0], []
    for start, end, name in step:
        idle = max(0, start - frontier)
        adds = max(0, end - max(frontier, start))
        out.append((name, start - t0, end - start, idle, adds))
        frontier = max(frontier, end)
    return out, frontier - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=20, help="steady-state steps to average")
    ap.add_argument("--first", type=int, default=24, help="kernels of the median step listed one by one")
    ap.add_argument("--step-kernel", default="embedding_gather", help="a name part of each step's first kernel")
    args = ap.parse_args()
    steps = split_steps(load(args.csv), args.step_kernel)
    if len(steps) < 3:
        raise SystemExit(f"{args.csv}: {len(steps)} steps found (no '{args.step_kernel}' kernels?)")
    # Keep the modal kernel count among the later steps, then the last --steps of those.
    counts = Counter(len(s) for s in steps[len(steps) // 3:])
    modal = counts.most_common(1)[0][0]
    indices = [i for i, s in enumerate(steps) if len(s) == modal and i + 1 < len(steps)][-args.steps:]
    periods = [steps[i + 1][0][0] - steps[i][0][0] for i in indices]
    per_op = defaultdict(lambda: {"n": 0, "dur": 0, "idle": 0, "adds": 0, "lag": []})
    spans = []
    for i in indices:
        walked, span = walk(steps[i])
        spans.append(span)
        prev_end = None
        for (name, offset, dur, idle, adds), (start, end, _) in zip(walked, steps[i]):
            o = per_op[short(name)]
            o["n"] += 1
            o["dur"] += dur
            o["idle"] += idle
            o["adds"] += adds
            if prev_end is not None:
                o["lag"].append(start - prev_end)
            prev_end = end
    n = len(indices)
    print(f"{len(steps)} steps in the trace; {n} steady steps of {modal} kernels")
    print(f"step period {statistics.mean(periods) / 1e3:.1f} us (median {statistics.median(periods) / 1e3:.1f}), "
          f"GPU span {statistics.mean(spans) / 1e3:.1f} us")
    print()
    print(f"{'kernel':48} {'per step':>8} {'mean us':>8} {'start lag us':>12} {'adds us/step':>12} {'idle us/step':>12}")
    for name, o in sorted(per_op.items(), key=lambda kv: -kv[1]["adds"]):
        lag = statistics.median(o["lag"]) / 1e3 if o["lag"] else 0.0
        print(f"{name[:48]:48} {o['n'] / n:8.1f} {o['dur'] / o['n'] / 1e3:8.2f} {lag:12.2f} "
              f"{o['adds'] / n / 1e3:12.1f} {o['idle'] / n / 1e3:12.1f}")
    total_adds = sum(o["adds"] for o in per_op.values()) / n / 1e3
    total_idle = sum(o["idle"] for o in per_op.values()) / n / 1e3
    print(f"{'(sum)':48} {modal:8d} {'':8} {'':12} {total_adds:12.1f} {total_idle:12.1f}")
    # The median step's first kernels, one by one: the chain of a layer.
    median_i = indices[sorted(range(n), key=lambda j: spans[j])[n // 2]]
    walked, _ = walk(steps[median_i])
    print()
    print(f"the median step's first {args.first} kernels (us from its start):")
    print(f"{'#':>3} {'kernel':48} {'start':>8} {'dur':>7} {'idle':>6} {'adds':>6}")
    for k, (name, offset, dur, idle, adds) in enumerate(walked[: args.first]):
        print(f"{k:3d} {short(name)[:48]:48} {offset / 1e3:8.2f} {dur / 1e3:7.2f} {idle / 1e3:6.2f} {adds / 1e3:6.2f}")


if __name__ == "__main__":
    main()
