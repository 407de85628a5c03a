#!/usr/bin/env bash
# Session 18, call 2 (same H100 if still held): the quant kernels after the
# review's change; the synthetic fill's floor at 128K (quest, whose build is
# cheap); --build-on gpu at 128K again; a real prefill of 128K with the
# multipole build overlapped, on the GPU and on the host; multipole at 512K
# with the GPU k-means if time is left.
#   carry .gpu/b18b.tar.xz; bash bench/results/gpu_session18/s18b.sh
set -u
W=/tmp/q S=$OUT/s18b
mkdir -p "$W" "$S" /tmp/m
tar -xJf .gpu/b18b.tar.xz -C "$W"
source "$W/b18b/env.sh"
step() { echo "$(date +%T) $*" | tee -a "$S/steps.txt"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$S/gpu.txt"
L=/tmp/m/l8.gguf
[ -e $L ] || topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o $L -q
timeout 200 gpu_test_cuda_quant > "$S/test-quant.txt" 2>&1
step "gpu_test_cuda_quant rc=$? $(grep -E 'passed|failed' "$S/test-quant.txt" | tail -1)"
B="topkv bench decode -m $L --backend cuda --modes topk --k 1024 --gpu-mem-budget 24G --steps 8 --warmup 2 -q --no-plot"
summ() { python3 -c "import json;r=json.load(open('$1/decode.json'))['results'][0];print('fill_s',round(r['fill_s'],1),'build_s',round(r['build_s'],2),'keys',r['keys_indexed'],'tok/s',round(r['tok_s'],1))" 2>&1 | tail -1; }
run() {  # name, budget s, args
  local name=$1 lim=$2; shift 2
  [ $((SECONDS + 30)) -gt 575 ] && { step "$name skipped (time)"; return; }
  timeout $(( lim < 575 - SECONDS ? lim : 575 - SECONDS )) $B "$@" --out-dir "$S/$name" > "$S/$name.txt" 2>&1
  step "$name rc=$? $(summ "$S/$name")"
}
run quest-128K 150 --contexts 128K --index quest
run mp-gpu-128K 150 --contexts 128K --index multipole --build-on gpu
run mp-gpu-prefill-128K 200 --contexts 128K --index multipole --build-on gpu --fill prefill --chunk 4096
run mp-host-prefill-128K 250 --contexts 128K --index multipole --fill prefill --chunk 4096
cat "$S/steps.txt"
