#!/usr/bin/env bash
# (Rewritten in session 24's review to call gpu-hold.sh's gpu_tests / search_bench: the same runs.)
# Session 24, last hold (one GPU): the far kernel with i8 value means reading its scales once at
# the end (not through the loop): gpu_test_gpu_search against the twin, then the search bench.
set -u
source scripts/gpu-hold.sh  # step, gpu_tests, search_bench
gpu_tests gpu_test_gpu_search
search_bench
