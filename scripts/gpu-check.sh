#!/usr/bin/env bash
# The GPU checks, run on the GPU host from the repo root with a bundle built
# elsewhere (README, "Building for a GPU host"):
#   .gpu/bundle/bin/gpu_test_*   the GPU test binaries (CUDA backend vs CPU backend)
#   .gpu/bundle/bin/topkv        for `topkv bench gpu-ops`, when bundled
# Every log is teed into $OUT (default out/gpu-check); a short table of the
# per-op errors, each binary's exit code and the benchmark comes last.
#   scripts/gpu-check.sh                       # tests, then the benchmark (kernels +
#                                              # synthetic Gemma-3-270M and 4 Llama-3-8B
#                                              # layers end to end, graphs on and off)
#   GPU_CHECK_BENCH=0 scripts/gpu-check.sh     # tests only
#   GPU_CHECK_LLAMA8B=1 scripts/gpu-check.sh   # also a synthetic Llama-3-8B (Q4_K, ~4.6 GB
#                                              # written to $TMPDIR first; minutes)
#   GPU_CHECK_SANITIZE=1 scripts/gpu-check.sh  # first every gpu_test_* binary under compute-sanitizer
#                                              # (memcheck, racecheck, synccheck; slow)
#   GPU_CHECK_SANITIZE_TOOLS="memcheck" GPU_CHECK_SANITIZE_TIMEOUT=120   # which tools; seconds per run
#   GPU_CHECK_SANITIZE_SPLIT=case GPU_CHECK_SANITIZE_JOBS=16   # one run per test case, 16 at a time
#   GPU_CHECK_SANITIZE_CASES=FILE              # only these runs: "tool<TAB>binary<TAB>test case" per line
#                                              # (e.g. those an earlier pass left unfinished)
#   GPU_CHECK_TESTS=0                          # skip the plain test run (sanitizer or bench only)
# Exit status: 0 when every test binary passed, 1 when one failed, 77 when
# they skipped themselves (no device).
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${BUNDLE:-.gpu/bundle}
OUT=${OUT:-out/gpu-check}
mkdir -p "$OUT"
if [ ! -f "$BUNDLE/env.sh" ]; then
  echo "gpu-check: no bundle at $BUNDLE (build one as the README says, or set BUNDLE=...)" >&2
  exit 2
fi
# shellcheck disable=SC1091
source "$BUNDLE/env.sh"

if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
else
  echo "nvidia-smi not found" | tee "$OUT/nvidia-smi.txt"
  gpu="no nvidia-smi"
fi

status=0
: > "$OUT/results.txt"
# One compute-sanitizer run: tool, binary, Catch2 test spec ("" = every case),
# log name. The log keeps its first 300 lines (the first reports: later ones
# are often their consequences) and its last 100; one line goes to results.
sanitize_one() {
  local tool=$1 exe=$2 spec=$3 name=$4 start rc verdict
  start=$(date +%s)
  timeout "${GPU_CHECK_SANITIZE_TIMEOUT:-600}" compute-sanitizer --tool "$tool" --error-exitcode 3 "$exe" \
    ${spec:+"$spec"} > "$OUT/$name.full" 2>&1
  rc=$?
  { head -n 300 "$OUT/$name.full"; echo "[...]"; tail -n 100 "$OUT/$name.full"; } > "$OUT/$name.log"
  rm -f "$OUT/$name.full"
  case $rc in
    0) verdict=clean ;;
    124) verdict="not finished in ${GPU_CHECK_SANITIZE_TIMEOUT:-600} s" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  printf '%-60s %-28s %4ds\n' "${name#sanitize-}" "$verdict" $(($(date +%s) - start)) >> "$OUT/sanitize-results.txt"
}
# A test case's name as a Catch2 test spec: ',' '[' ']' and '\' escaped.
catch_spec() { printf '%s' "$1" | sed -e 's/[][\\,]/\\&/g'; }
if [ "${GPU_CHECK_SANITIZE:-0}" != 0 ]; then
  # With GPU_CHECK_SANITIZE_SPLIT=case every test case runs in its own process
  # (its log names the binary and the case's number), GPU_CHECK_SANITIZE_JOBS
  # at a time: racecheck and synccheck are tens of times slower than the
  # tests, and one slow case no longer hides the verdict on the others.
  : > "$OUT/sanitize-results.txt"
  jobs_max=${GPU_CHECK_SANITIZE_JOBS:-1}
  throttle() { while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done; }
  if [ -n "${GPU_CHECK_SANITIZE_CASES:-}" ]; then  # exactly the listed runs
    i=0
    while IFS=$'\t' read -r tool bin tc; do
      [ -n "$tc" ] || continue
      i=$((i + 1))
      [ -x "$BUNDLE/bin/$bin" ] || { echo "gpu-check: $GPU_CHECK_SANITIZE_CASES line $i: no $bin in $BUNDLE/bin" >&2; exit 2; }
      name="sanitize-$tool-$bin-listed$(printf '%02d' $i)"
      echo "$tc" > "$OUT/$name.case"
      throttle
      sanitize_one "$tool" "$BUNDLE/bin/$bin" "$(catch_spec "$tc")" "$name" &
    done < "$GPU_CHECK_SANITIZE_CASES"
  else
    for tool in ${GPU_CHECK_SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
      for exe in "$BUNDLE"/bin/gpu_test_*; do
        [ -x "$exe" ] || continue
        base="sanitize-$tool-$(basename "$exe")"
        if [ "${GPU_CHECK_SANITIZE_SPLIT:-binary}" = case ]; then
          i=0
          while IFS= read -r tc; do
            [ -n "$tc" ] || continue
            i=$((i + 1))
            echo "$(printf '%02d' $i) $tc" >> "$OUT/$base.cases"
            throttle
            sanitize_one "$tool" "$exe" "$(catch_spec "$tc")" "$base-$(printf '%02d' $i)" &
          done < <("$exe" --list-test-names-only 2>/dev/null)
        else
          throttle
          sanitize_one "$tool" "$exe" "" "$base" &
        fi
      done
    done
  fi
  wait
  sort "$OUT/sanitize-results.txt" >> "$OUT/results.txt"
  grep -q FAILED "$OUT/sanitize-results.txt" && status=1
fi
shopt -s nullglob
tests=("$BUNDLE"/bin/gpu_test_*)
if [ ${#tests[@]} -eq 0 ]; then
  echo "gpu-check: no gpu_test_* binaries in $BUNDLE/bin" >&2
  exit 2
fi
[ "${GPU_CHECK_TESTS:-1}" != 0 ] || tests=()
for exe in "${tests[@]}"; do
  name=$(basename "$exe")
  echo "==== $name"
  start=$(date +%s%N)
  "$exe" --durations yes 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  case $rc in
    0) verdict=passed ;;
    77) verdict="SKIPPED (no device)"; [ $status = 0 ] && status=77 ;;
    *) verdict="FAILED (exit $rc)"; status=1 ;;
  esac
  printf '%-28s %-22s %5d.%01ds\n' "$name" "$verdict" $((ms / 1000)) $((ms % 1000 / 100)) >> "$OUT/results.txt"
done

if [ "${GPU_CHECK_BENCH:-1}" != 0 ] && [ -x "$BUNDLE/bin/topkv" ]; then
  models=$(mktemp -d "${TMPDIR:-/tmp}/topkv-gpu-check.XXXXXX")
  trap 'rm -rf "$models"' EXIT
  echo "==== topkv bench gpu-ops"
  # Its model rows synthesise gemma3-270m and 4 layers of llama3-8b themselves (--synth).
  "$BUNDLE/bin/topkv" bench gpu-ops --out "$OUT/gpu-ops.jsonl" 2>&1 | tee "$OUT/bench.log"
  if [ "${GPU_CHECK_LLAMA8B:-0}" != 0 ]; then
    "$BUNDLE/bin/topkv" model synth --preset llama3-8b -q -o "$models/llama3-8b.gguf" 2>&1 | tee "$OUT/synth.log"
    "$BUNDLE/bin/topkv" bench gpu-ops --model-only --model "$models/llama3-8b.gguf" --out "$OUT/gpu-ops-8b.jsonl" \
      2>&1 | tee -a "$OUT/bench.log"
  fi
fi

echo
echo "================ gpu-check summary ($gpu) ================"
grep -h '^SUMMARY' "$OUT"/gpu_test_*.log | sed 's/^SUMMARY[-A-Z]* //' || true
echo
cat "$OUT/results.txt"
if [ -f "$OUT/bench.log" ]; then
  echo
  grep -h '^BENCH' "$OUT/bench.log" | sed 's/^BENCH //' || true
fi
echo "logs: $OUT"
exit $status
