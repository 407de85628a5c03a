# Session 31, third and fourth calls (same warm H100): the pair again in the other order (the build
# before, then this build, i8 tables), this build with the tables `auto` picks (f16), and 1M.
source scripts/gpu-hold.sh
ls /tmp/b/l8.gguf || synth_l8
d() {
  n=$1; b=$2; c=$3; shift 3
  timeout 540 $b bench decode -m "$L8" --backend cuda --warmup 4 --steps 32 -q --no-plot --contexts $c --modes topk \
    --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type q8_0 --out-dir "$O/$n" "$@" \
    > "$O/$n.txt" 2>&1
  step "decode $n rc=$? $(grep -E '^ +(524288|1048576)' $O/$n.txt)"
}
d p512-i8-old-2 topkv-old 512K --device-table-type i8
d p512-i8-new-2 topkv 512K --device-table-type i8
d p512-auto-new topkv 512K
# (the fourth call)
d p1m-auto-new topkv 1M
