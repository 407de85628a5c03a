# Session 33, first call: the GPU tests (per-layer store types in gpu_test_gpu_offload and
# gpu_test_gpu_search; session 32's review mends in the page-bounds and k-means engines), and
# the Llama-8B geometry's file for the next calls.
source scripts/gpu-hold.sh
gpu_tests gpu_test_gpu_offload gpu_test_gpu_search gpu_test_gpu_page_bounds gpu_test_gpu_kmeans \
  gpu_test_gpu_table_budget gpu_test_cuda_streamed
synth_l8; step "synth rc=$?"
