#!/usr/bin/env bash
# The main job: install dependencies, build, and serve the OpenAI-compatible API.
# With no arguments it serves the embedded default model (`tiny` preset, dummy weights, bundled
# tokenizer) on 0.0.0.0:8000. Any `ossrt serve` flag can be passed, e.g.
#   scripts/run.sh /models/gpt-oss-20b --backend cuda --port 8000 --api-key sk-local
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec "${OSSRT_BUILD_DIR:-build}/ossrt" serve "$@"
