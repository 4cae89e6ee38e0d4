#!/usr/bin/env bash
# Issue 16's throughput point (256 concurrent random 1k/1k requests through `ossrt serve`) under the
# serve flags that trade per-step work: one server per variant, each `bench_h200.sh serve` with its
# own deadline, then a table. Variants (VARIANTS, "|"-separated serve flags, "-" for none; default):
#   -                                    the defaults (first and last: the spread of this measure)
#   --kv-cache-dtype fp8                 full layers' keys and values in half the bytes
#   --max-num-batched-tokens 16384       fewer, larger prefill steps
#   --max-num-batched-tokens 4096        more, smaller ones (decodes wait less behind a prompt)
# Usage (device call from the repo root, carry [".carry/cudaz", ".carry/tokgz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz; [PROMPTS=512] [EACH_S=75] tools/device/serve_c256_knobs.sh
# 512 prompts (two waves) take ~35 s a run on an H200 plus ~15 s of server start; 6 variants fit one call.
# Results: $OUT/<run>_knobN__serve.tar.gz per variant; untar into bench/results on the CPU machine.
set -uo pipefail
OUT=${OUT:-/tmp/ossrt-out}
IFS='|' read -r -a variants <<< "${VARIANTS:--|--kv-cache-dtype fp8|--max-num-batched-tokens 16384|--max-num-batched-tokens 4096|-}"
i=0
for v in "${variants[@]}"; do
  flags=$v
  [ "$flags" = - ] && flags=
  echo "== variant $i: ${flags:-defaults}"
  env DEADLINE_S="${EACH_S:-75}" QUANT="${QUANT:-mxfp4-fp8}" SERVE_CONCURRENCY=256 SERVE_PROMPTS="${PROMPTS:-512}" \
    SERVE_PROMPTS_8K=0 SERVE_FLAGS="$flags" RUN_SUFFIX="_knob$i" tools/device/bench_h200.sh serve 2>&1 |
    grep -E "server ready|!!|exit"
  i=$((i + 1))
done
echo "== 256 concurrent 1k/1k through ossrt serve, by variant"
mkdir -p /tmp/c256_knobs && for t in "$OUT"/*_knob*__serve.tar.gz; do tar xzf "$t" -C /tmp/c256_knobs; done
python3 - /tmp/c256_knobs "${variants[@]}" <<'PY'
import csv, glob, os, re, sys
root, names = sys.argv[1], sys.argv[2:]
for f in sorted(glob.glob(os.path.join(root, "*_knob*", "serve_1k_1k", "serve_summary.csv"))):
    n = int(re.search(r"_knob(\d+)_", f).group(1))
    for r in csv.DictReader(open(f)):
        print(f"{n} {names[n] if n < len(names) else '?':34s} {float(r['output_throughput']):9.1f} out tok/s"
              f"  TPOT {float(r['tpot_ms_mean']):6.2f} ms  ITL p50 {float(r['itl_ms_median']):6.2f}"
              f"  TTFT p50 {float(r['ttft_ms_median']):7.1f} ms  ({r['completed']}/{r['num_prompts']} in {float(r['duration_s']):.1f} s)")
PY
