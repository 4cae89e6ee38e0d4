#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel: time per step, launches
per step and share of the step, slowest first (tools/device/profile_decode.sh).

Usage: ncu_step_table.py <ncu.csv> --steps N [--title T]
"""
import argparse
import collections
import csv
import io
import re


def short_name(name: str) -> str:
    # Template arguments and parameter lists make names unreadable; keep the function's own name
    # and the first template argument list, trimmed.
    name = re.sub(r"\(.*\)$", "", name)
    name = re.sub(r"^void ", "", name)
    return name if len(name) <= 90 else name[:87] + "..."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    text = open(a.csv, encoding="utf-8", errors="replace").read()
    # ncu prefixes its own lines ("==PROF==") to the CSV in the log file: keep the table only.
    start = text.find('"ID"')
    if start < 0:
        print("!! no kernels in", a.csv)
        return
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    per_kernel = collections.defaultdict(lambda: [0.0, 0])
    total_ns = 0.0
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        ns = value * {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
        k = per_kernel[short_name(r["Kernel Name"])]
        k[0] += ns
        k[1] += 1
        total_ns += ns
    steps = max(a.steps, 1)
    launches = sum(v[1] for v in per_kernel.values())
    print(f"-- {a.title}: {launches / steps:.0f} kernels a step, {total_ns / steps / 1e3:.1f} us of kernel time a step")
    print(f"{'us/step':>9} {'n/step':>7} {'us each':>8} {'share':>6}  kernel")
    for name, (ns, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0]):
        print(f"{ns / steps / 1e3:9.1f} {n / steps:7.1f} {ns / n / 1e3:8.2f} {100 * ns / total_ns:5.1f}%  {name}")


if __name__ == "__main__":
    main()
