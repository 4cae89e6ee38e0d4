#!/usr/bin/env bash
# Device call for the pipelined large-M MXFP4 MoE kernels (moe_mxfp4_wgmma_pipe.cu), from the repo
# root after pack_env.sh ($PACK set). Step `check`: the bit-identity test against the ring kernels,
# then (only if it passed) the MXFP4 suites as built (the pipe kernels are the default) and with
# OSSRT_CUDA_MOE_WGMMA_PIPE=0, then TimeRegimes' large-M rows as built (the ring vs pipe GEMM rows
# come from one process). Step `prefill`: tools/device/prefill_ab.sh ring (=0) vs pipe (skipped after
# a failed bit-identity check in the same call). Logs under $OUT/moe_pipe/.
# Usage: tools/device/moe_pipe_check.sh check|prefill ...
set -uo pipefail
R=$OUT/moe_pipe
mkdir -p "$R"
T=$PACK/bin/moe_mxfp4_test
echo "== commit $(tr '\n' ' ' < "$PACK/COMMIT")" | tee -a "$R/summary.txt"
for step in "$@"; do
  case $step in
    check)
      timeout 100 "$T" --gtest_filter='Mxfp4Moe.WgmmaPipeIsTheRingBitForBit' > "$R/bit_identity.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || failed=1
      echo "bit identity: exit $rc" | tee -a "$R/summary.txt"
      grep -E "\[metric\]|Failure|differ|OK \]|FAILED|PASSED" "$R/bit_identity.log" | head -40
      if [ $rc -eq 0 ]; then
        for v in default 0; do  # default: the switch unset
          env $([ $v = default ] || echo OSSRT_CUDA_MOE_WGMMA_PIPE=$v) timeout 120 "$T" \
            --gtest_filter='Mxfp4Moe.*:Mxfp4Backend.*' > "$R/suite_$v.log" 2>&1
          echo "suite, PIPE $v: exit $?" | tee -a "$R/summary.txt"
          grep -E "OK \]|FAILED|PASSED|Failure" "$R/suite_$v.log" | head -40
        done
        OSSRT_MOE_TIMING=large timeout 60 "$T" --gtest_filter=Mxfp4Moe.TimeRegimes > "$R/time.log" 2>&1
        echo "TimeRegimes: exit $?" | tee -a "$R/summary.txt"
        grep "\[timing\]" "$R/time.log"
      fi
      ;;
    prefill)
      [ "${failed:-0}" = 1 ] && { echo "prefill skipped: the bit-identity check failed"; continue; }
      DEADLINE_S=${DEADLINE_S:-150} tools/device/prefill_ab.sh ring=OSSRT_CUDA_MOE_WGMMA_PIPE=0 pipe= \
        > "$R/prefill_ab.log" 2>&1
      echo "prefill_ab: exit $?" | tee -a "$R/summary.txt"
      cat "$R/prefill_ab.log" | tail -30
      ;;
  esac
done
