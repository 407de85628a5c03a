# Sourced from the repo root on the GPU host by a hold script (bench/results/gpu_session22/s22*.sh):
# unpacks the carried bundle (.gpu/bundle.tar.xz, README "Building for a GPU host") into /tmp/b,
# puts its binaries on PATH, records the GPU in $O/gpu.txt, and defines
#   step TEXT                  "<seconds since the hold began>s TEXT" into $O/steps.txt, then $O
#                              packed into $OUT/r.tgz (a call returns at most 8 files; a timeout
#                              still returns what finished)
#   synth_l8                   the Llama-3-8B geometry, Q4_K random weights, 1M context: $L8
#   decode_l8 NAME CTX STORE T [OPTION...]
#                              `bench decode` of $L8 at CTX with --store-type STORE, at most T s:
#                              two-level quest, k = 256, --gpu-mem-budget 24G, synthetic fill
#                              (AS_BUILT, "Llama-8B geometry at 512K and 1M under 24G"), and any
#                              further options given; $O/NAME.txt and $O/NAME/
#   gpu_tests TEST...          each GPU test binary of the bundle (at most 200 s), log $O/test-TEST.log,
#                              a step each with its summary line
#   search_bench               `bench gpu-ops --only search` into $O/search.{txt,jsonl}; prints the
#                              Llama-8B 512K rows (score, far) of every table type
# shellcheck shell=bash
S0=$(date +%s); O=/tmp/b/out; L8=/tmp/b/l8.gguf
# shellcheck disable=SC1091,SC2015
mkdir -p "$O" && tar -xJf .gpu/bundle.tar.xz -C /tmp/b && source /tmp/b/bundle/env.sh ||
  { echo "gpu-hold: could not unpack .gpu/bundle.tar.xz" >&2; exit 1; }
step() { echo "$(( $(date +%s) - S0 ))s $*" | tee -a "$O/steps.txt"; tar czf "$OUT/r.tgz" -C /tmp/b out; }
synth_l8() { topkv model synth --preset llama3-8b --type q4_k --context 1048640 -o "$L8" -q; }
decode_l8() {
  timeout "$4" topkv bench decode -m "$L8" --backend cuda --warmup 4 --steps 32 -q --no-plot --contexts "$2" \
    --modes topk --index quest:page=16,coarse_ratio=16 --k 256 --gpu-mem-budget 24G --store-type "$3" \
    --out-dir "$O/$1" "${@:5}" > "$O/$1.txt" 2>&1
}
gpu_tests() {
  for t in "$@"; do
    /usr/bin/time -f "$t %e s" timeout 200 "$t" > "$O/test-$t.log" 2>&1
    step "$t rc=$? $(grep -E 'test cases|passed|failed' "$O/test-$t.log" | tail -1)"
  done
}
search_bench() {
  timeout 90 topkv bench gpu-ops --only search --reps 50 --out "$O/search.jsonl" > "$O/search.txt" 2>&1
  step "search rc=$?"; grep -E "llama8b 512K.*(score|far)" "$O/search.txt" | grep -v rerank
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$O/gpu.txt"
