# Session 30, first hold (call A): the GPU tests of a19c250 / c0fe8f2, the 8B geometry's 512K decode
# with a q8_0 store and f16 tables (call B: i8 tables, the same machine), the search kernels' bench and
# an ncu pass over every search kernel launch (durations, grids, registers, occupancy, DRAM share).
source scripts/gpu-hold.sh
gpu_tests gpu_test_cuda_model gpu_test_gpu_table_budget gpu_test_gpu_search
synth_l8; step "synth rc=$?"
decode_l8 p512-f16 512K q8_0 280 --device-table-type f16; step "decode 512K q8_0 f16 rc=$? $(grep -E 'tok/s|512K' $O/p512-f16.txt | tail -2 | tr '\n' ' ')"
search_bench
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 150 $NCU --csv --page raw --kernel-name-base demangled \
  --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum \
  topkv bench gpu-ops --only search --reps 1 > $O/ncu_search.csv 2> $O/ncu_search.err
step "ncu rc=$? $(wc -l < $O/ncu_search.csv) lines"
