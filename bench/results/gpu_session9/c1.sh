#!/usr/bin/env bash
# Session 9, call 1: every GPU test binary, then memcheck and synccheck over every
# test case of every binary (one process per case, 16 at a time).
#   c1.sh                                     tests, memcheck, synccheck -> $OUT/c1.tgz
#   RUN_TESTS=0 SAN_TOOLS=racecheck TAG=c2 c1.sh   racecheck alone -> $OUT/c2.tgz
set -uo pipefail
S0=$(date +%s); W=/tmp/s; TAG=${TAG:-c1}; mkdir -p $W/out; rm -rf $W/out/san
[ -d $W/bundle ] || tar -xJf .gpu/bundle.tar.xz -C $W || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $W/out/machine.txt
[ "${RUN_TESTS:-1}" = 0 ] || BUNDLE=$W/bundle OUT=$W/out/tests GPU_CHECK_BENCH=0 scripts/gpu-check.sh > $W/out/tests.txt 2>&1
echo "t=$(( $(date +%s) - S0 )) tests" | tee -a $W/out/time.txt
BUNDLE=$W/bundle OUT=$W/out/san GPU_CHECK_TESTS=0 GPU_CHECK_BENCH=0 GPU_CHECK_SANITIZE=1 GPU_CHECK_SANITIZE_SPLIT=case \
  GPU_CHECK_SANITIZE_JOBS=16 GPU_CHECK_SANITIZE_TIMEOUT=${SAN_TIMEOUT:-150} GPU_CHECK_SANITIZE_TOOLS="${SAN_TOOLS:-memcheck synccheck}" \
  scripts/gpu-check.sh > $W/out/san.txt 2>&1
echo "t=$(( $(date +%s) - S0 )) sanitizers" | tee -a $W/out/time.txt
tar czf $OUT/$TAG.tgz -C $W out
cat $W/out/machine.txt; [ "${RUN_TESTS:-1}" = 0 ] || tail -16 $W/out/tests/results.txt; grep -h "^SUMMARY.*FAIL" $W/out/tests/*.log
echo "sanitizer runs: $(wc -l < $W/out/san/sanitize-results.txt)"; grep -v " clean " $W/out/san/sanitize-results.txt | head -40
echo "clean: $(grep -c " clean " $W/out/san/sanitize-results.txt)"
