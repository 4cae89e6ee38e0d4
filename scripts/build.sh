#!/usr/bin/env bash
# Configures and builds ossrt into build/ (Release with debug info). CUDA is auto-detected.
# Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${OSSRT_BUILD_DIR:-build}
JOBS=${OSSRT_JOBS:-$(nproc)}
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
