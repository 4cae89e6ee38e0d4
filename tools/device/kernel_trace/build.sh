#!/usr/bin/env bash
# Builds libossrt_ktrace.so (kernel_trace.cpp, a CUPTI injection library) into the pack that device
# calls carry, with the libcupti it links (the device's CUDA 13 has one too, but this one matches the
# headers). Usage, after tools/device/cuda_pack.sh: tools/device/kernel_trace/build.sh [pack dir, default .carry/cuda]
set -euo pipefail
PACK=${1:-.carry/cuda}
CUDA=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$PACK/lib"
g++ -std=c++17 -O2 -shared -fPIC -Wall -Wextra -I"$CUDA/include" "$(dirname "$0")/kernel_trace.cpp" \
  -L"$CUDA/lib" -L"$CUDA/lib64" -lcupti -Wl,-rpath,'$ORIGIN' -o "$PACK/lib/libossrt_ktrace.so"
cp -L "$(ldd "$PACK/lib/libossrt_ktrace.so" | awk '/libcupti/ {print $3}')" "$PACK/lib/"
ls -la "$PACK/lib/libossrt_ktrace.so" "$PACK"/lib/libcupti*
