#!/usr/bin/env bash
# One device call for the CUDA backend (run on the H200 by the `run` tool, from the repo root):
#   (a) the binaries built on the CPU machine (tools/device/cuda_pack.sh put them in .carry/cuda)
#       resolve their libraries; (b) every GPU test binary (the ctest label `gpu`); (c) the golden
#       fixtures on --backend cuda (golden_cuda_test, plus `ossrt logits --backend cuda` when the
#       logits command is built); (d) the gpt-oss-20b dummy-weight benchmark and the HF transformers
#       baseline in the same call on the same GPU, table printed last, JSON under $OUT.
# Usage: tools/device/cuda_run.sh [quick]   (quick: tests only, no benchmark)
set -uo pipefail
MODE=${1:-full}
# Everything must end inside the device call's limit, with the table printed: each step gets at most
# what is left before DEADLINE_S (seconds from the start), minus a margin for the summary.
DEADLINE_S=${DEADLINE_S:-500}
START=$(date +%s)
budget() {  # budget <wanted seconds> -> seconds this step may take (0 = skip)
  local left=$((START + DEADLINE_S - 20 - $(date +%s)))
  if [ "$left" -lt 15 ]; then echo 0; elif [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
# The device tool returns at most 8 files: logs go to a work folder, tarred at the end; $FINAL gets
# device.log, the JSON results and logs.tar.gz.
OUT=/tmp/ossrt-work
mkdir -p "$FINAL" "$OUT"
exec > >(tee -a "$FINAL/device.log") 2>&1

echo "== device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
echo "== commit: $(cat "$PACK/COMMIT" 2>/dev/null)"
export OSSRT_SOURCE_DIR=$ROOT  # tests find fixtures through it (tests/test_paths.h)
# cuBLASLt 13 from the machine's CUDA toolkit or torch's wheels; our other shared libraries travel.
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
# NCCL (linked by the parallel module) from the machine or torch's nvidia-nccl wheel.
echo "== cuBLASLt from $CUBLAS_DIR"
missing=0
for b in "$PACK"/bin/*; do
  if ldd "$b" | grep -q "not found"; then echo "!! $b: $(ldd "$b" | grep 'not found' | tr '\n' ' ')"; missing=1; fi
done
ldd "$PACK/bin/ossrt" 2>/dev/null | sed 's/^/   /'
[ $missing = 0 ] || echo "!! some libraries are missing (see above)"

echo "== GPU tests (ctest label gpu)"
declare -A STATUS
run_test() {  # run_test <binary name> <wanted seconds>
  local t=$PACK/bin/$1 secs
  [ -x "$t" ] || { echo "-- $1 not built"; return; }
  secs=$(budget "$2")
  if [ "$secs" = 0 ]; then STATUS[$1]=skipped-no-time; echo "-- $1 skipped: no time left"; return; fi
  timeout "$secs" "$t" --gtest_color=no > "$OUT/$1.log" 2>&1
  local rc=$?
  STATUS[$1]=$rc
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|\[metric\]|Failure|rror" "$OUT/$1.log" | head -40
  echo "-- $1 exit $rc ($(( $(date +%s) - START )) s since start)"
}
if [ -x "$PACK/bin/ossrt" ] && [ -d tests/golden ] && [ "$(budget 60)" != 0 ]; then
  echo "== ossrt logits --backend cuda on the golden fixtures"
  for c in tests/golden/*/; do
    [ -f "$c/case.json" ] || continue
    python3 - "$c" <<'PY' > "$OUT/ids.json"
import json, sys
print(json.dumps(json.load(open(sys.argv[1] + "/case.json"))["prompt_ids"]))
PY
    if "$PACK/bin/ossrt" logits --model "$c" --backend cuda --ids-file "$OUT/ids.json" --out "$OUT/cuda_logits.npy" \
        > "$OUT/logits_cli.log" 2>&1; then
      python3 - "$c" "$OUT/cuda_logits.npy" <<'PY'
import json, sys
import numpy as np
case = json.load(open(sys.argv[1] + "/case.json"))
ref = np.load(sys.argv[1] + "/" + case.get("logits", "logits.npy")).astype(np.float64)
got = np.load(sys.argv[2]).astype(np.float64)
rel = np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
print(f"   {sys.argv[1]}: ossrt logits --backend cuda worst rel L2 {rel.max():.3g} at position {rel.argmax()}, "
      f"finite {np.isfinite(got).all()}, {'PASS' if rel.max() < 2e-2 and np.isfinite(got).all() else 'FAIL'}")
PY
    else
      echo "   $c: ossrt logits failed: $(tail -2 "$OUT/logits_cli.log")"
    fi
  done
fi

run_bench() {
  echo "== benchmark: ossrt (CUDA backend) gpt-oss-20b dummy weights"
  OSSRT_BENCH_OUT=$OUT/cuda_bench.json timeout "$(budget 200)" "$PACK/bin/model_test" --gtest_filter='CudaBench.*' \
    > "$OUT/bench.log" 2>&1
  grep -E "\[bench\]|FAILED|Failure|rror" "$OUT/bench.log"
  echo "== benchmark: HF transformers eager bf16, same GPU ($(( $(date +%s) - START )) s since start)"
  PYTHONUNBUFFERED=1 timeout "$(budget 150)" python3 tools/device/hf_baseline.py --out "$OUT/hf_baseline.json" \
    > "$OUT/hf.log" 2>&1
  grep -E "^\[hf\]|Error|error" "$OUT/hf.log" | tail -20
}

# Quick and most telling first; the benchmark before the long CPU-oracle suites.
run_test sample_test 60
run_test graph_test 90
run_test model_test 90
run_test golden_cuda_test 90
run_test engine_cuda_test 120
# BENCH_LAST=1: every test suite first, the benchmark in whatever time is left (a test record matters
# more than a benchmark when one call has to carry both).
[ "$MODE" = full ] && [ "${BENCH_LAST:-0}" != 1 ] && run_bench
run_test ops_test 180
run_test attention_test 150
run_test moe_test 150
# Every other packed GPU test (cuda_pack.sh packs what ctest labels gpu), so a new suite is never
# silently left out of the call.
for t in "$PACK"/bin/*_test; do
  name=$(basename "$t")
  [ -n "${STATUS[$name]+x}" ] || run_test "$name" 150
done
[ "$MODE" = full ] && [ "${BENCH_LAST:-0}" = 1 ] && run_bench

echo "== summary"
for k in "${!STATUS[@]}"; do echo "   $k: $([ "${STATUS[$k]}" = 0 ] && echo PASS || echo "FAIL (exit ${STATUS[$k]})")"; done
if [ "$MODE" = full ]; then
  python3 - "$OUT" "$(cat "$PACK/COMMIT" 2>/dev/null)" <<'PY'
import json, os, sys, datetime
out, commit = sys.argv[1], sys.argv[2]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception as e:
        return {"error": str(e)}
ours, hf = load("cuda_bench.json"), load("hf_baseline.json")
combined = {"commit": commit, "date": datetime.datetime.utcnow().isoformat() + "Z", "gpu": hf.get("gpu", "?"),
            "model": "gpt-oss-20b, dummy weights", "ossrt_cuda": ours, "hf_transformers": hf}
json.dump(combined, open(os.path.join(out, "cuda_bench_combined.json"), "w"), indent=2)
def cell(d, group, key, fmt):
    v = d.get(group, {}).get(key)
    return fmt.format(v) if isinstance(v, (int, float)) else "n/a"
print(f"\ngpt-oss-20b (dummy weights), {combined['gpu']}, commit {commit}")
print(f"{'metric':<28}{'ossrt cuda':>14}{'HF eager bf16':>16}{'speed-up':>10}")
rows = [("decode tok/s, batch 1", "decode_tok_s", "1", True), ("decode tok/s, batch 8", "decode_tok_s", "8", True),
        ("decode tok/s, batch 64", "decode_tok_s", "64", True), ("prefill ms, 1k tokens", "prefill_ms", "1024", False),
        ("prefill ms, 8k tokens", "prefill_ms", "8192", False)]
for label, group, key, higher_better in rows:
    a, b = ours.get(group, {}).get(key), hf.get(group, {}).get(key)
    speed = (a / b if higher_better else b / a) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a and b else None
    print(f"{label:<28}{cell(ours, group, key, '{:.1f}'):>14}{cell(hf, group, key, '{:.1f}'):>16}"
          f"{(f'{speed:.1f}x' if speed else 'n/a'):>10}")
PY
fi

cp "$OUT"/cuda_bench.json "$OUT"/hf_baseline.json "$OUT"/cuda_bench_combined.json "$FINAL"/ 2>/dev/null
tar czf "$FINAL/logs.tar.gz" -C "$OUT" --exclude='*.npy' . 2>/dev/null
