# Session 31, second call (same warm H100, after s31a.sh): `bench decode` 512K, q8_0 store, i8 tables
# with topkv-old (the same bench, the row-list kernel before Q8Run). (The call also first tried the
# gpu-hold.sh helper with an option it does not take; that try wrote nothing kept.)
source scripts/gpu-hold.sh
timeout 420 topkv-old bench decode -m "$L8" --backend cuda --warmup 4 --steps 32 -q --no-plot --contexts 512K \
  --modes topk --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type q8_0 \
  --out-dir "$O/p512-i8-old" --device-table-type i8 > "$O/p512-i8-old.txt" 2>&1
step "decode old rc=$?"
