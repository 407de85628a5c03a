#!/usr/bin/env bash
# Session 17, a third hold: compute-sanitizer (memcheck, racecheck, synccheck)
# over every test case of every GPU test binary on this build, the kernels of
# sessions 13-16 included (two-level quest, far_dropped, the quant and MMVQ
# kernels). One process per case, 12 at a time, 480 s each; background queue:
#   mkdir -p /tmp/qs/scripts; cp scripts/gpu-check.sh /tmp/qs/scripts/
#   tar -xJf .up/sb.tar.xz -C /tmp/q; setsid nohup bash /tmp/s17e.sh &
S=/tmp/q/out/san
mkdir -p "$S"
BUNDLE=/tmp/q/sbundle OUT=$S GPU_CHECK_SANITIZE=1 GPU_CHECK_SANITIZE_SPLIT=case GPU_CHECK_SANITIZE_JOBS=12 \
  GPU_CHECK_SANITIZE_TIMEOUT=480 GPU_CHECK_TESTS=0 GPU_CHECK_BENCH=0 bash /tmp/qs/scripts/gpu-check.sh \
  > /tmp/q/out/gpu-check.txt 2>&1
echo "rc=$?" > /tmp/q/out/done
