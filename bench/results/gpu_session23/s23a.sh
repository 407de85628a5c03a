#!/usr/bin/env bash
# (Rewritten in session 24's review to call gpu-hold.sh's gpu_tests / search_bench: the same runs.)
# Session 23, first hold (one H100, idle): 1. the GPU tests touched by f8 device tables
# (--device-table-type f8: the search's cases with f8 tables against the twin; the f8 lane load
# shared with f8 store rows); 2. `bench gpu-ops --only search` (f16 and f8 tables at the 8B 512K
# shape); 3. the Llama-3-8B geometry at 512K, q8_0 store, f8 tables (the baseline, f16 tables,
# follows in s23b.sh on the same warm machine).
set -u
source scripts/gpu-hold.sh  # step, synth_l8, decode_l8, gpu_tests, search_bench
( synth_l8; step "synth rc=$?" ) &
gpu_tests gpu_test_gpu_search gpu_test_cuda_kernels gpu_test_gpu_offload
search_bench
wait
decode_l8 l512-q8_0-f8t 512K q8_0 300 --device-table-type f8
step "l512-q8_0-f8t rc=$?"; tail -4 "$O/l512-q8_0-f8t.txt"
