#!/usr/bin/env bash
# Session 18, call 5: --build-on gpu through generate's overlapped build (the streaming build's
# TBB tasks call the engine while the prefill runs), against the host build, on the Qwen2.5-1.5B
# geometry (synthetic weights) over a ~120K-token prompt of this repository's sources; the same
# greedy tokens are not expected (different clusterings), the build left after the prefill is.
#   carry .gpu/b18d.tar.xz; bash bench/results/gpu_session18/s18e.sh
set -u
W=/tmp/q S=$OUT/s18e
mkdir -p "$W" "$S" /tmp/m
tar -xJf .gpu/b18d.tar.xz -C "$W"
source "$W/b18d/env.sh"
step() { echo "$(date +%T) $*" | tee -a "$S/steps.txt"; }
Q=/tmp/m/q15.gguf
topkv model synth --preset qwen2.5-1.5b --type q4_k --context 262144 -o $Q -q > "$S/synth.txt" 2>&1
cat src/*/*.cpp index/*.cpp offload/*.cpp gpu/*.cpp gpu/*.cu | head -c 200000 > /tmp/m/prompt.txt
wc -c /tmp/m/prompt.txt > "$S/prompt.txt"
for where in gpu host; do
  timeout 260 topkv generate -m $Q -f /tmp/m/prompt.txt -n 16 -c 160000 --backend cuda --attn topk --index multipole \
    --k-fraction 0.02 --chunk 4096 --build-on $where --json "$S/gen-$where.json" > "$S/gen-$where.out" 2> "$S/gen-$where.err"
  step "generate build-on $where rc=$? $(grep -oE '[0-9]+ keys indexed in [0-9.]+ s|prompt [0-9]+ tokens, prefill [0-9.]+ s|first token after [0-9.]+ s' "$S/gen-$where.err" | tr '\n' ';')"
done
