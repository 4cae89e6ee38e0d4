#!/usr/bin/env bash
# Packs the CUDA build made on the CPU machine for a device call: the GPU test binaries and the
# ossrt binary (stripped: debug info would not fit the 64 MiB carry limit) plus the non-system
# shared libraries they link (fmt, spdlog, ...) into .carry/cuda, which the `run` call carries.
# cuBLASLt (500 MB) and NCCL (200 MB) do not travel: the device machine has CUDA 13's and torch's. cudart is static.
# Usage: [KEEP_SYMBOLS=1] [EXTRA_BINARIES="other/build/tests/x_test ..."] [XZ=1] tools/device/cuda_pack.sh [build-dir]
# XZ=1 also writes .carry/cudaz/cuda.tar.xz (~10 MB instead of 170: one xz stream with a dictionary
# wider than a binary, so the test binaries' common code is stored once; ~70 s on 2 cores): carry
# [".carry/cudaz"] and unpack with `tar -C .carry -xJf .carry/cudaz/cuda.tar.xz` on the device.
# With XZ=1 the kernel tracer (tools/device/kernel_trace/build.sh) goes in too.
set -euo pipefail
BUILD=${1:-build-cudaA}
PACK=.carry/cuda
rm -rf "$PACK" && mkdir -p "$PACK/bin" "$PACK/lib"
# The GPU tests are whatever ctest labels `gpu` (tests/CMakeLists.txt), not a list kept here.
GPU_TESTS=$(ctest --test-dir "$BUILD" -L gpu --show-only=json-v1 2>/dev/null | python3 -c '
import json, sys
print(" ".join(sorted({t["command"][0] for t in json.load(sys.stdin).get("tests", []) if t.get("command")})))')
for t in $GPU_TESTS "$BUILD"/ossrt ${EXTRA_BINARIES:-}; do
  [ -f "$t" ] || continue
  # KEEP_SYMBOLS=1 keeps the symbol table (function names in a gdb backtrace), drops only debug info.
  if [ "${KEEP_SYMBOLS:-0}" = 1 ]; then strip --strip-debug -o "$PACK/bin/$(basename "$t")" "$t"
  else strip -o "$PACK/bin/$(basename "$t")" "$t"; fi
done
# Shared libraries outside glibc/libstdc++ and CUDA's: the device's Ubuntu may lack these versions.
for b in "$PACK"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt|ld-linux|libcublas|libcublasLt|libcuda|libnccl)[.-]' |
  while read -r lib; do cp -L "$lib" "$PACK/lib/"; done
git rev-parse HEAD > "$PACK/COMMIT"
git status --short -- src tests tools | grep -q . && echo "+uncommitted" >> "$PACK/COMMIT" || true
du -sh "$PACK" "$PACK"/bin/* "$PACK"/lib/* | sed 's/^/  /'
if [ "${XZ:-0}" = 1 ]; then
  "$(dirname "$0")/kernel_trace/build.sh" "$PACK" > /dev/null
  mkdir -p .carry/cudaz
  tar -C .carry -cf - cuda | xz -T1 --lzma2=preset=9,dict=192MiB > .carry/cudaz/cuda.tar.xz
  du -sh .carry/cudaz/cuda.tar.xz | sed 's/^/  /'
fi
