#!/usr/bin/env bash
# Session 24, last hold (one GPU): the far kernel with i8 value means reading its scales once at
# the end (not through the loop): gpu_test_gpu_search against the twin, then the search bench.
set -u
source scripts/gpu-hold.sh  # step
timeout 120 gpu_test_gpu_search > "$O/test-gpu_test_gpu_search.log" 2>&1
step "gpu_test_gpu_search rc=$? $(grep -E 'test cases' "$O/test-gpu_test_gpu_search.log" | tail -1)"
timeout 90 topkv bench gpu-ops --only search --reps 50 --out "$O/search.jsonl" > "$O/search.txt" 2>&1
step "search rc=$?"
grep -E "llama8b 512K/layer (multipole k=256|quest:page=16 k=256|quest:page=16,coarse_ratio=16 k=256)( f8 tables| i8 tables)? (score|\+ far)" "$O/search.txt"
