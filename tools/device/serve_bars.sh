#!/usr/bin/env bash
# The batch-1 acceptance points of issues 15 and 16 through `ossrt serve`, one device call (~4 min):
#   1. gpt-oss-20b `mxfp4-fp8`, one stream: 1k in / 1k out, then 32k in / 1k out (issue 16: batch-1
#      decode at 32k within 15% of its speed at 1k; issue 15: 600 tok/s at least at 1k)
#   2. the same with `--kv-cache-dtype fp8` (run suffix _kvfp8: the full layers' keys in half the bytes)
#   3. gpt-oss-120b `mxfp4`, one stream, 1k / 1k (issue 15: 400 tok/s at least)
# then a table of TPOT and tok/s a user, 32k against 1k. Each part is tools/device/bench_h200.sh serve
# with a deadline of its own, so a slow one cannot take the others' time.
# Usage (device call from the repo root, carry [".carry/cudaz", ".carry/tokgz"]):
#   tar -C .carry -xJf .carry/cudaz/cuda.tar.xz; [PARTS="20b 120b"] tools/device/serve_bars.sh
# Results: $OUT/<run>__serve.tar.gz per part; on the CPU machine untar them into bench/results.
set -uo pipefail
OUT=${OUT:-/tmp/ossrt-out}
one() {  # one <deadline s> <env...>: a bench_h200.sh serve run with one stream
  local deadline=$1; shift
  env DEADLINE_S="$deadline" SERVE_CONCURRENCY=1 SERVE_PROMPTS=4 "$@" tools/device/bench_h200.sh serve
}
# PARTS picks some of them (default all three), e.g. PARTS=120b after a GPU suite in the same call.
PARTS=${PARTS:-20b 20b_kvfp8 120b}
for part in $PARTS; do
  case $part in
    20b) one 150 QUANT=mxfp4-fp8 SERVE_LONG_INPUT=32768 SERVE_CONCURRENCY_8K=1 SERVE_PROMPTS_8K=3 ;;
    20b_kvfp8)
      one 150 QUANT=mxfp4-fp8 SERVE_LONG_INPUT=32768 SERVE_CONCURRENCY_8K=1 SERVE_PROMPTS_8K=3 \
        SERVE_FLAGS="--kv-cache-dtype fp8" RUN_SUFFIX=_kvfp8 ;;
    120b) one 170 MODEL=gpt-oss-120b QUANT=mxfp4 SERVE_PROMPTS_8K=0 ;;
    *) echo "serve_bars.sh: unknown part '$part' (20b, 20b_kvfp8, 120b)" >&2 ;;
  esac
done
echo "== summary (one stream, through ossrt serve)"
mkdir -p /tmp/serve_bars && for t in "$OUT"/*__serve.tar.gz; do tar xzf "$t" -C /tmp/serve_bars; done
python3 - /tmp/serve_bars <<'PY'
import csv, glob, os, sys
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*", "serve_*", "serve_summary.csv"))):
    run, point = f.split(os.sep)[-3:-1]
    for r in csv.DictReader(open(f)):
        rows[(run, point)] = r
        print(f"{run:70s} {point:14s} TTFT {float(r['ttft_ms_median']):8.1f} ms  TPOT {float(r['tpot_ms_median']):6.3f} ms"
              f"  {float(r['tok_s_per_user']):7.1f} tok/s a user")
for (run, point), r in rows.items():
    if point != "serve_32k_1k" or (run, "serve_1k_1k") not in rows: continue
    short, long_ = float(rows[(run, "serve_1k_1k")]["tok_s_per_user"]), float(r["tok_s_per_user"])
    print(f"{run}: 32k decodes {100 * (1 - long_ / short):.1f}% slower than 1k (bar: 15%)")
PY
