#!/usr/bin/env bash
# Two builds in one device call (the pack of this tree plus an older build's ossrt and one test binary
# packed as <name>_old through cuda_pack.sh's EXTRA_BINARIES): the changed kernels' tests on the new
# build, the kernels' ncu durations in both builds' copies of one test (same shapes, same machine),
# then decode steps of both ossrt binaries interleaved (old, new, old, new).
# Usage: CHECKS="bin --gtest_filter=... ; bin2 ..." NCU_TEST="moe_mxfp4_test --gtest_filter=..."
#        NCU_KERNELS='regex:...' [NCU_COUNT=4] [MODEL=gpt-oss-20b] [QUANT=mxfp4-fp8] [BATCHES="1 256"]
#        tools/device/build_ab.sh        (device call from the repo root, pack unpacked into .carry/cuda)
set -uo pipefail
ROOT=$(pwd)
source "$ROOT/tools/device/pack_env.sh"  # PACK (.carry/cuda), OSSRT_SOURCE_DIR, LD_LIBRARY_PATH
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== checks on the new build, commit $(tr '\n' ' ' < "$PACK/COMMIT")"
IFS=';' read -ra checks <<< "${CHECKS:-}"
pids=()
for i in "${!checks[@]}"; do
  read -ra cmd <<< "${checks[$i]}"
  (timeout "${CHECK_S:-200}" "$PACK/bin/${cmd[0]}" "${cmd[@]:1}" > "/tmp/check_$i.log" 2>&1; echo "exit $?" >> "/tmp/check_$i.log") &
  pids+=("$!")
done
wait "${pids[@]}"
for i in "${!checks[@]}"; do
  echo "-- ${checks[$i]}"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure$|^exit" "/tmp/check_$i.log" | head -12
done
read -ra ncu_test <<< "${NCU_TEST:-}"
for suffix in _old ""; do
  [ ${#ncu_test[@]} -gt 0 ] || break
  TEST="${ncu_test[0]}$suffix ${ncu_test[*]:1}" KERNELS="$NCU_KERNELS" COUNT="${NCU_COUNT:-4}" LABEL="${ncu_test[0]}$suffix" \
    LINES_MAX=1000 tools/device/ncu_kernel_detail.sh | grep -E "^== |<.*\(MoeGemmArgs\)|  Duration|DRAM Throughput|Issued Warp"
done
MODEL=${MODEL:-gpt-oss-20b} QUANT=${QUANT:-mxfp4-fp8} BATCHES="${BATCHES:-1 256}" DEADLINE_S=${AB_S:-200} \
  tools/device/decode_ab.sh old=OSSRT_AB_BIN=ossrt_old new= old2=OSSRT_AB_BIN=ossrt_old new2= 2>&1 | grep -vE "^$|^--$"
