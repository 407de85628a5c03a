# Session 30, second hold: the search kernels of this session (the far kernel staged and folded a round at a
# time, the one-level cut by a cluster of 8 blocks past 8,192 groups, the two-level expand and gather in the
# cuts' launches): the GPU tests against the CPU twins, `bench gpu-ops --only search` with this build and
# with the build before (topkv-old, the same machine). (A 512K decode with this build was planned too; a
# failed start left too little device time for it.)
source scripts/gpu-hold.sh
ok=1
for tl in gpu_test_gpu_search:90 gpu_test_gpu_offload:60 gpu_test_gpu_table_budget:40 gpu_test_cuda_model:40; do
  t=${tl%:*}; timeout ${tl#*:} $t > $O/test-$t.log 2>&1; rc=$?; [ $rc = 0 ] || ok=0
  step "$t rc=$rc $(grep -E 'test cases' $O/test-$t.log | tail -1)"
done
for b in topkv topkv-old; do
  timeout 80 $b bench gpu-ops --only search --reps 30 --out $O/search-$b.jsonl > $O/search-$b.txt 2>&1
  step "search $b rc=$?"
done
grep -E "llama8b 512K/layer (multipole k=256|quest:page=16,coarse_ratio=16 k=256) (score|\+ cut|\+ gather|\+ far)" $O/search-topkv.txt $O/search-topkv-old.txt | sed 's/BENCH search *//'
