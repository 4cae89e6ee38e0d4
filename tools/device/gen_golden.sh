#!/usr/bin/env bash
# Regenerates the golden fixtures of tests/golden/ on the GPU machine (python3 with torch,
# transformers, safetensors, numpy; no network). Run from anywhere; writes the fixtures in place and,
# when $OUT is set (the device tool's output folder), packs them into $OUT/golden.tgz with the log.
#   device:  bash tools/device/gen_golden.sh
#   here:    tar xzf <files_at>/golden.tgz -C tests/golden
set -uo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
LOG=${OUT:-/tmp}/generate.log
nvidia-smi -L || true
# --reuse-prompts: the committed fixtures' prompts, where their seed matches and they are still
# router-robust (generate.py prompt_for), so a regeneration takes ~25 s instead of ~5 min; pass
# --reuse-prompts '' to construct every prompt afresh.
python3 tests/golden/generate.py --out tests/golden --reuse-prompts tests/golden "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
  # Only the case folders travel back; the script and README are already in the repo.
  (cd tests/golden && tar czf "$OUT/golden.tgz" --exclude=generate.py --exclude=README.md --exclude=__pycache__ .)
  ls -la "$OUT"
fi
exit "$rc"
