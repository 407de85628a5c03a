#!/usr/bin/env bash
# Session 18, call 6: the device search's kernels at the 512K / 1M shapes in GB/s against the
# copy ceiling (bench gpu-ops --only search; the copy row first), on this session's build.
#   carry .gpu/b18d.tar.xz; bash bench/results/gpu_session18/s18f.sh
set -u
W=/tmp/q S=$OUT/s18f
mkdir -p "$W" "$S"
tar -xJf .gpu/b18d.tar.xz -C "$W"
source "$W/b18d/env.sh"
topkv bench gpu-ops --only attention --quick --reps 20 > "$S/copy.txt" 2>&1  # the copy row (ceiling)
grep "BENCH copy" "$S/copy.txt"
topkv bench gpu-ops --only search --reps 50 --out "$S/search.jsonl" > "$S/search.txt" 2>&1
echo "search rc=$?"; grep BENCH "$S/search.txt"
