#!/usr/bin/env bash
# Configures and builds ossrt into build/ (Release; pass -DCMAKE_BUILD_TYPE=RelWithDebInfo for
# debug info). CUDA is auto-detected. Usage: scripts/build.sh [extra cmake args]
# OSSRT_KEEP_GOING=1 builds every target that can be built even when one fails (exit status still 1).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${OSSRT_BUILD_DIR:-build}
JOBS=${OSSRT_JOBS:-$(nproc)}
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
fi
KEEP=(); [ "${OSSRT_KEEP_GOING:-0}" = 1 ] && KEEP=(-- -k 0)
cmake --build "$BUILD_DIR" -j "$JOBS" "${KEEP[@]}"
