#!/usr/bin/env bash
# The H200 figures of `ossrt bench` (docs/bench.md), one device call per part. Builds nothing on the
# GPU machine: it runs the ossrt binary that tools/device/cuda_pack.sh put in .carry/cuda (a CUDA
# build made on the CPU machine) on dummy-weight gpt-oss-20b, and gpt-oss-120b where it fits (the
# kernel shapes; its bf16 weights, 234 GB, do not fit one H200 for serve and cost).
#
#   serve    `bench serve` against `ossrt serve gpt-oss-20b --load-format dummy --backend cuda` on
#            127.0.0.1: random 1k in / 1k out at concurrency 1, 8, 64, 256, and 8k in / 1k out at 64
#   kernels  `bench kernels` for every op at gpt-oss-20b and -120b shapes against its floor
#   cost     `bench cost` prefill (1k .. 127k where it fits) and decode at contexts 1k and 8k
#   structured  64 concurrent chat streams of 256 tokens, JSON-Schema constrained (tools/device/schemas)
#            against unconstrained, on one server (issue 18's target: within 5%)
#   spec     speculative decoding with the replay drafter (a benchmark drafter, docs/engine.md): the
#            cost of a 1 + 3 token verify step at batch 1, 8, 64 and batch-1 speed at set acceptance;
#            ngram on bench/prompts/code_edit.json (outputs forced to its answer) against plain
#   budget   the per-step token budget (`--max-num-batched-tokens`): one server per budget in BUDGETS
#            (default 2048 4096 8192 16384), each serving random 2k-6k-token prompts with 512-token
#            outputs at concurrency 64, so prompts keep arriving while the others decode: TPOT and ITL
#            (a step that carries a prefill chunk is a long gap for every decoding stream) against TTFT
#   cost32k  `bench cost` decode at context 32k (its prefill of up to 128 x 32k tokens needs a call
#            of its own); merge the two on the CPU machine:
#            ossrt bench cost --from-json <run>/cost_a/cost.json,<run>/cost_b/cost.json --result-dir <run>/cost
#
# Results: bench/results/<date>_<gpu>_gpt-oss-20b-dummy_<quantization>_<commit>/<part>/ (JSON, CSV, SVG),
# returned as $OUT/<run>__<parts>.tar.gz with the log $OUT/bench_h200_<parts>.log; on the CPU machine:
#   tar xzf <files_at>/<run>__<parts>.tar.gz -C bench/results && python3 tools/maint/bench_index.py
#
# Usage (device call from the repo root, carry [".carry/cuda", ".carry/tokgz"]):
#   tools/device/bench_h200.sh serve kernels        # ~6 min
#   tools/device/bench_h200.sh cost                 # ~8 min
#   tools/device/bench_h200.sh cost32k              # ~6 min
# Environment: DEADLINE_S (default 570: every step is cut to what is left of one call, so the
# tarball is always written), and for shorter trials SERVE_CONCURRENCY / SERVE_PROMPTS,
# COST_INPUT_LENS / COST_BATCHES / COST_CONTEXTS, KERNEL_MODELS / KERNEL_OPS (e.g.
# attention_full,attention_sliding) / KERNEL_DECODE / KERNEL_PREFILL / KERNEL_CONTEXT (decode context,
# default 1024) / KERNEL_SUFFIX (result folder kernels<suffix>, for a second context in one call);
# QUANT (default bf16) is the --quantization of every command (docs/quantization.md), MODEL (default
# gpt-oss-20b) its model; SERVE_PROMPTS_8K=0 skips serve's 8k/1k point, SERVE_CONCURRENCY_8K (default 64)
# sets its concurrency (1: the TTFT of one 8k prompt alone), SERVE_LONG_INPUT (default 8192) its prompt
# length (32768 with concurrency 1: batch-1 decode at 32k); OSSRT_BIN another binary of the pack (A/B:
# with a RUN_SUFFIX; its COMMIT is still the pack's, so say which build a folder holds); SERVE_FLAGS adds serve flags (e.g.
# "--kv-cache-dtype fp8"), SERVE_BENCH_FLAGS bench serve flags (e.g. "--temperature 1": sampled, not
# greedy, requests).
set -uo pipefail
[ $# -gt 0 ] || { sed -n '2,/^set -uo/{/^#/p}' "$0"; exit 2; }  # the header above, whatever its length
PARTS=("$@")
DEADLINE_S=${DEADLINE_S:-570}
START=$(date +%s)
budget() {  # budget <wanted seconds> -> seconds this step may take (0 = no time left)
  local left=$((START + DEADLINE_S - 15 - $(date +%s)))
  if [ "$left" -lt 20 ]; then echo 0; elif [ "$1" -lt "$left" ]; then echo "$1"; else echo "$left"; fi
}
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
TAG=$(IFS=_; echo "${PARTS[*]}")
mkdir -p "$FINAL"
exec > >(tee -a "$FINAL/bench_h200_$TAG.log") 2>&1

# OSSRT_BIN: another ossrt binary of the pack (cuda_pack.sh EXTRA_BINARIES, e.g. ossrt_main) for an A/B of
# two builds in one call; give it a RUN_SUFFIX (e.g. _main) so the two runs' folders differ.
OSSRT=$PACK/bin/${OSSRT_BIN:-ossrt}
[ -x "$OSSRT" ] || { echo "!! $OSSRT missing: run tools/device/cuda_pack.sh <cuda build dir> first, carry .carry/cuda"; exit 1; }
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
# The tokenizer travels gzipped (.carry/tokgz, 5 MB) or plain (.carry/tok); node_modules does not.
if [ -f "$ROOT/.carry/tokgz/tokenizer.json.gz" ]; then
  gunzip -c "$ROOT/.carry/tokgz/tokenizer.json.gz" > /tmp/tokenizer.json && export OSSRT_TOKENIZER=/tmp/tokenizer.json
elif [ -f "$ROOT/.carry/tok/tokenizer.json" ]; then
  export OSSRT_TOKENIZER=$ROOT/.carry/tok/tokenizer.json
fi
[ -n "${OSSRT_TOKENIZER:-}" ] || echo "!! no tokenizer (.carry/tokgz/tokenizer.json.gz): serve and bench serve will fail"
ldd "$OSSRT" | grep "not found" && echo "!! missing libraries (see above)"

COMMIT=$(head -1 "$PACK/COMMIT" 2>/dev/null || echo unknown)
DIRTY=$(grep -q uncommitted "$PACK/COMMIT" 2>/dev/null && echo "-dirty" || true)
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
GPU_SLUG=$(echo "$GPU_NAME" | tr 'A-Z' 'a-z' | sed -E 's/nvidia //; s/[^a-z0-9]+/-/g; s/-+$//')
# The weight format every command of the run is given (--quantization, docs/quantization.md) and the
# run folder is named by; server_info and bench cost record the resolved name too.
QUANT=${QUANT:-bf16}
# The model of every command (gpt-oss-120b: mxfp4 or mxfp4-fp8 fit one H200).
MODEL=${MODEL:-gpt-oss-20b}
RUN=$(date -u +%Y%m%d)_${GPU_SLUG}_${MODEL}-dummy_${QUANT}${RUN_SUFFIX:-}_${COMMIT:0:12}${DIRTY}  # RUN_SUFFIX: e.g. _kvfp8
RESULTS=/tmp/ossrt-bench-results
mkdir -p "$RESULTS/$RUN"
echo "== $RUN: $GPU_NAME, commit $COMMIT$DIRTY, parts: ${PARTS[*]}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | sed 's/^/   /'

MODEL_FLAGS=(--model "$MODEL" --load-format dummy --backend cuda --quantization "$QUANT")
PORT=18080
SERVER=

start_server() {  # waits for /health (dummy 20b: weights generated and uploaded), at most $1 seconds
  # SERVE_FLAGS: more serve flags for the whole run (e.g. "--kv-cache-dtype fp8"), split on spaces.
  local extra=(); [ -n "${SERVE_FLAGS:-}" ] && read -ra extra <<< "$SERVE_FLAGS"
  "$OSSRT" serve "${MODEL_FLAGS[@]}" --host 127.0.0.1 --port $PORT --max-num-seqs 256 "${extra[@]}" > /tmp/serve.log 2>&1 &
  SERVER=$!
  local t0; t0=$(date +%s)
  while ! curl -sf 127.0.0.1:$PORT/health > /dev/null; do
    kill -0 $SERVER 2>/dev/null || { echo "!! server exited:"; tail -20 /tmp/serve.log; SERVER=; return 1; }
    [ $(( $(date +%s) - t0 )) -lt "$1" ] || { echo "!! server not ready in $1 s"; tail -5 /tmp/serve.log; return 1; }
    sleep 0.5
  done
  echo "   server ready after $(( $(date +%s) - t0 )) s: $(grep -m1 -E 'memory plan' /tmp/serve.log | cut -c1-200)"
}
stop_server() {
  [ -n "$SERVER" ] || return 0
  kill -TERM $SERVER; wait $SERVER; echo "   serve exit $?"; SERVER=
  grep -o "step timing.*" /tmp/serve.log  # with OSSRT_CUDA_STEP_TIMING=1 (src/backend/cuda/step_timing.h)
}
trap stop_server EXIT

run_step() {  # run_step <name> <wanted seconds> <command...>: bounded by what is left of the call
  local name=$1 secs; secs=$(budget "$2"); shift 2
  if [ "$secs" = 0 ]; then echo "-- $name skipped: no time left in this call"; return 1; fi
  echo "== $name (at most $secs s, $(( $(date +%s) - START )) s since start)"
  timeout "$secs" "$@"
  local rc=$?
  echo "-- $name exit $rc after $(( $(date +%s) - START )) s"
  return $rc
}

part_serve() {
  start_server "$(budget 300)" || return 1
  # 1k in / 1k out: the TensorRT-LLM / SemiAnalysis shape; prompts per point make ~2 waves at each cap.
  run_step "bench serve 1k/1k" 330 "$OSSRT" bench serve --base-url http://127.0.0.1:$PORT --dataset random \
    --input-len 1024 --output-len 1024 --ignore-eos --max-concurrency "${SERVE_CONCURRENCY:-1,8,64,256}" \
    --num-prompts "${SERVE_PROMPTS:-4,16,128,512}" --warmup 2 --seed 0 --slo ttft=2000,tpot=50 --no-itl \
    ${SERVE_BENCH_FLAGS:-} --result-dir "$RESULTS/$RUN/serve_1k_1k"
  local long=${SERVE_LONG_INPUT:-8192}  # the long-prompt point's input length (32768: decode at 32k)
  [ "${SERVE_PROMPTS_8K:-128}" = 0 ] || run_step "bench serve $((long / 1024))k/1k" 200 "$OSSRT" bench serve --base-url http://127.0.0.1:$PORT --dataset random \
    --input-len "$long" --output-len 1024 --ignore-eos --max-concurrency "${SERVE_CONCURRENCY_8K:-64}" --num-prompts "${SERVE_PROMPTS_8K:-128}" \
    --warmup 2 --seed 1 --slo ttft=10000,tpot=50 --no-itl ${SERVE_BENCH_FLAGS:-} --result-dir "$RESULTS/$RUN/serve_$((long / 1024))k_1k"
  curl -s 127.0.0.1:$PORT/metrics > "$RESULTS/$RUN/serve_metrics.txt"
  stop_server
}

part_structured() {  # issue 18: 64 concurrent chat streams, JSON-Schema constrained vs unconstrained
  start_server "$(budget 300)" || return 1
  local out="$RESULTS/$RUN/structured" load="$ROOT/tools/device/serve_load.py" schemas="$ROOT/tools/device/schemas"
  mkdir -p "$out"
  # warm-up: compiles and caches both grammars, fills the CUDA graphs of these batch sizes
  run_step "structured warm-up" 60 python3 "$load" $PORT chat 64 16 "$schemas/person.json" > /dev/null
  run_step "structured warm-up" 60 python3 "$load" $PORT chat 64 16 "$schemas/notes.json" > /dev/null
  for round in 1 2; do  # alternating, so drift (clocks, heat) falls on both sides
    for schema in none person notes; do
      local file=; [ $schema = none ] || file="$schemas/$schema.json"
      run_step "structured 64 x ${STRUCTURED_TOKENS:-256} ($schema, round $round)" 90 \
        python3 "$load" $PORT chat 64 "${STRUCTURED_TOKENS:-256}" $file > /tmp/structured_step.out
      grep -v '^{' /tmp/structured_step.out
      grep '^{' /tmp/structured_step.out | sed "s/^{/{\"schema\": \"$schema\", /" | tee -a "$out/structured.jsonl"
    done
  done
  curl -s 127.0.0.1:$PORT/metrics > "$out/serve_metrics.txt"
  stop_server
}

part_kernels() {
  local only=(); [ -n "${KERNEL_OPS:-}" ] && only=(--ops "$KERNEL_OPS")
  run_step "bench kernels" 300 "$OSSRT" bench kernels --models "${KERNEL_MODELS:-gpt-oss-20b,gpt-oss-120b}" \
    --decode-tokens "${KERNEL_DECODE:-1,8,64,256}" --prefill-tokens "${KERNEL_PREFILL:-1024,8192}" \
    --decode-context "${KERNEL_CONTEXT:-1024}" "${only[@]}" --result-dir "$RESULTS/$RUN/kernels${KERNEL_SUFFIX:-}"
}

part_cost() {
  run_step "bench cost (prefill; decode at 1k and 8k)" 540 "$OSSRT" bench cost "${MODEL_FLAGS[@]}" \
    --input-lens "${COST_INPUT_LENS:-1024,2048,4096,8192,16384,32768,65536,130048}" --repeats 2 \
    --contexts "${COST_CONTEXTS:-1024,8192}" --batch-sizes "${COST_BATCHES:-1,2,4,8,16,32,64,128,256,512}" \
    --result-dir "$RESULTS/$RUN/cost_a"
}

part_cost32k() {
  run_step "bench cost (decode at 32k)" 540 "$OSSRT" bench cost "${MODEL_FLAGS[@]}" --no-prefill \
    --contexts "${COST_CONTEXTS:-32768}" --batch-sizes "${COST_BATCHES:-1,2,4,8,16,32,64,128}" \
    --result-dir "$RESULTS/$RUN/cost_b"
}

part_budget() {  # issue 16: --max-num-batched-tokens chosen by measurement
  local tokens saved=${SERVE_FLAGS:-}
  for tokens in ${BUDGETS:-2048 4096 8192 16384}; do
    SERVE_FLAGS="$saved --max-num-batched-tokens $tokens"
    start_server "$(budget 120)" || { SERVE_FLAGS=$saved; return 1; }
    # ITLs kept (no --no-itl): their p99 is where a prefill chunk's step shows.
    run_step "bench serve, budget $tokens" 120 "$OSSRT" bench serve --base-url http://127.0.0.1:$PORT --dataset random \
      --input-len "${BUDGET_INPUT_LEN:-4096}" --range-ratio 0.5 --output-len "${BUDGET_OUTPUT_LEN:-512}" --ignore-eos \
      --max-concurrency "${BUDGET_CONCURRENCY:-64}" --num-prompts "${BUDGET_PROMPTS:-192}" --warmup 4 --seed 2 \
      --slo ttft=2000,tpot=50 --result-dir "$RESULTS/$RUN/budget_$tokens"
    stop_server
  done
  SERVE_FLAGS=$saved
}

part_spec() {  # issue 17: speculative decoding's cost and speed with the replay (benchmark) drafter
  # The cost of verifying 1 + 3 tokens (every guess rejected: rate 0) against a plain step, at batch
  # 1, 8 and 64; then batch-1 speed at mean acceptance lengths ~1.66, 2.24, 2.73, 3.05 (docs/engine.md).
  local common=("$OSSRT" bench cost "${MODEL_FLAGS[@]}" --no-prefill --contexts 1024 --decode-steps 64 --warmup-steps 8)
  run_step "bench cost: plain decode" 120 "${common[@]}" --batch-sizes "${SPEC_BATCHES:-1,8,64}" \
    --result-dir "$RESULTS/$RUN/spec_plain"
  for rate in 0 0.42 0.62 0.75 0.83; do
    local batches=1; [ "$rate" = 0 ] && batches=${SPEC_BATCHES:-1,8,64}
    run_step "bench cost: replay drafter, k = 3, rate $rate" 120 "${common[@]}" --batch-sizes "$batches" \
      --speculative-config "{\"method\": \"replay\", \"num_speculative_tokens\": 3, \"replay_acceptance_rate\": $rate}" \
      --result-dir "$RESULTS/$RUN/spec_replay_$rate"
  done
  # ngram on a code-editing answer (bench/prompts/code_edit.json, outputs forced to it), against the
  # same prompt decoded plainly.
  local text=(--batch-sizes 1 --decode-text "$ROOT/bench/prompts/code_edit.json")
  run_step "bench cost: code edit, plain" 120 "${common[@]}" "${text[@]}" --result-dir "$RESULTS/$RUN/spec_code_plain"
  run_step "bench cost: code edit, ngram k = 3" 120 "${common[@]}" "${text[@]}" \
    --speculative-config '{"method": "ngram", "num_speculative_tokens": 3}' --result-dir "$RESULTS/$RUN/spec_code_ngram"
}

for part in "${PARTS[@]}"; do
  case $part in
    serve) part_serve ;;
    kernels) part_kernels ;;
    cost) part_cost ;;
    cost32k) part_cost32k ;;
    structured) part_structured ;;
    spec) part_spec ;;
    budget) part_budget ;;
    *) echo "!! unknown part '$part' (serve, kernels, cost, cost32k, structured, spec, budget)" ;;
  esac
done

echo "== results"
(cd "$RESULTS" && find "$RUN" -type f | sort | sed 's/^/   /')
tar czf "$FINAL/${RUN}__$TAG.tar.gz" -C "$RESULTS" "$RUN"
echo "== wrote $FINAL/${RUN}__$TAG.tar.gz ($(( $(date +%s) - START )) s)"
