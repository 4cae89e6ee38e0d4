#!/usr/bin/env bash
# One device call for issue 13's acceptance: `ossrt serve gpt-oss-20b --load-format dummy --backend
# cuda` with no memory flags logs its memory plan, takes the model's 131,072-token context, and
# serves 1k, 8k, 32k and 100k-token prompts and 256 concurrent 1k-in/1k-out streams; then the same
# server at --gpu-memory-utilization 0.5, whose KV plan must shrink by 0.4 x the device's memory.
# Needs .carry/cuda (tools/device/cuda_pack.sh with ossrt built) and .carry/tokgz.
# Usage (on the device, from the repo root): tools/device/serve_memory_plan.sh
set -uo pipefail
ROOT=$(pwd)
PACK=$ROOT/.carry/cuda
FINAL=${OUT:-/tmp/ossrt-out}
mkdir -p "$FINAL"
exec > >(tee -a "$FINAL/serve_memory_plan.log") 2>&1
source "$ROOT/tools/device/pack_env.sh"  # LD_LIBRARY_PATH for $PACK
if [ -f "$ROOT/.carry/tokgz/tokenizer.json.gz" ]; then
  gunzip -c "$ROOT/.carry/tokgz/tokenizer.json.gz" > /tmp/tokenizer.json && export OSSRT_TOKENIZER=/tmp/tokenizer.json
fi
OSSRT=$PACK/bin/ossrt
echo "== commit $(head -1 "$PACK/COMMIT"); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"
ldd "$OSSRT" | grep "not found" && echo "!! missing libraries"
[ -x "$PACK/bin/graph_test" ] && timeout 120 "$PACK/bin/graph_test" --gtest_filter='CudaMemoryPlan.*' 2>&1 | tail -4

start_server() {  # start_server LOG [flags...]: waits for /health, prints the plan line
  local log=$1; shift
  "$OSSRT" serve gpt-oss-20b --load-format dummy --backend cuda --host 127.0.0.1 --port 18080 "$@" > "$log" 2>&1 &
  SERVER=$!
  for i in $(seq 1 480); do
    curl -sf 127.0.0.1:18080/health >/dev/null && break
    kill -0 $SERVER 2>/dev/null || { echo "!! server exited"; tail -20 "$log"; return 1; }
    sleep 0.5
  done
  echo "ready after $(( i / 2 )) s"; grep -E "memory plan|max_model_len|cuda:" "$log" | head -6
}
stop_server() { kill -TERM $SERVER; wait $SERVER; echo "serve exit $?"; }

echo "== serve with no memory flags"
if start_server /tmp/serve_default.log; then
  curl -s 127.0.0.1:18080/v1/models; echo
  timeout 300 python3 tools/device/serve_load.py 18080 prompts 1024,8192,32768,100000
  timeout 400 python3 tools/device/serve_load.py 18080 streams 256 1024 1024
  curl -s 127.0.0.1:18080/metrics | grep -E "^(vllm:cache_config_info|ossrt:(kv_cache|memory|max_)|vllm:num_preemptions|vllm:request_success_total)"
  stop_server
fi
echo "== serve --gpu-memory-utilization 0.5"
if start_server /tmp/serve_half.log --gpu-memory-utilization 0.5; then
  timeout 120 python3 tools/device/serve_load.py 18080 prompts 8192
  stop_server
fi
python3 - <<'PY'
import re
total = None
def kv(path):
    for line in open(path):
        m = re.search(r"memory plan \(([\d.]+) x ([\d.]+) GiB.*KV cache ([\d.]+) GiB = (\d+) tokens", line)
        if m: return float(m.group(1)), float(m.group(2)), float(m.group(3)), int(m.group(4))
a, b = kv("/tmp/serve_default.log"), kv("/tmp/serve_half.log")
print(f"KV at {a[0]}: {a[2]:.2f} GiB ({a[3]} tokens); at {b[0]}: {b[2]:.2f} GiB ({b[3]} tokens); "
      f"shrink {a[2]-b[2]:.2f} GiB, expected {(a[0]-b[0])*a[1]:.2f} GiB (0.4 x {a[1]:.1f} GiB)")
PY
