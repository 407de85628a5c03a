#!/usr/bin/env bash
# Session 18, call 3: the GPU k-means engine's time per block (bench gpu-ops
# --only kmeans); what a real 128K prefill leaves after it with quest (the
# floor: no k-means); multipole at 512K built with --build-on gpu.
#   carry .gpu/b18c.tar.xz; bash bench/results/gpu_session18/s18c.sh
set -u
W=/tmp/q S=$OUT/s18c
mkdir -p "$W" "$S" /tmp/m
tar -xJf .gpu/b18c.tar.xz -C "$W"
source "$W/b18c/env.sh"
step() { echo "$(date +%T) $*" | tee -a "$S/steps.txt"; }
L=/tmp/m/l8.gguf
[ -e $L ] || topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o $L -q
topkv bench gpu-ops --only kmeans --reps 50 --out "$S/kmeans.jsonl" > "$S/kmeans.txt" 2>&1
step "gpu-ops kmeans rc=$?"; grep BENCH "$S/kmeans.txt"
B="topkv bench decode -m $L --backend cuda --modes topk --k 1024 --gpu-mem-budget 24G --steps 8 --warmup 2 -q --no-plot"
summ() { python3 -c "import json;r=json.load(open('$1/decode.json'))['results'][0];print('fill_s',round(r['fill_s'],1),'build_s',round(r['build_s'],2),'keys',r['keys_indexed'],'tok/s',round(r['tok_s'],1))" 2>&1 | tail -1; }
run() {
  local name=$1 lim=$2; shift 2
  [ $((SECONDS + 60)) -gt 575 ] && { step "$name skipped (time)"; return; }
  timeout $(( lim < 575 - SECONDS ? lim : 575 - SECONDS )) $B "$@" --out-dir "$S/$name" > "$S/$name.txt" 2>&1
  step "$name rc=$? $(summ "$S/$name")"
}
run quest-prefill-128K 150 --contexts 128K --index quest --fill prefill --chunk 4096
run mp-gpu-512K 420 --contexts 512K --index multipole --build-on gpu
cat "$S/steps.txt"
