#!/usr/bin/env bash
# llama.cpp as the peer of `topkv bench decode`: fetch a pinned, trimmed
# llama.cpp source (here, where the package index is reachable), build its
# llama-bench (on the GPU host, which has nvcc but no network), and run it on
# the same GGUF files and contexts as topkv. bench/peers/README.md has the
# whole procedure; bench/peers/compare.py puts both systems in one table.
set -euo pipefail

# The llama.cpp source comes from the llama-cpp-python sdist, which vendors a
# complete llama.cpp tree (vendor/llama.cpp, a git submodule at the commit
# below). Pinned by version and by the sdist's sha256 (the package index's).
readonly PYPKG_VERSION=0.3.36
readonly PYPKG_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
readonly LLAMA_COMMIT=0c1e57098bba43ac29e6e3b677cdceebdd22334f

readonly PROG=bench/peers/llama_cpp.sh
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
readonly ROOT
readonly PEERS="$ROOT/.peers"
SRC=${LLAMA_SRC:-$PEERS/llama.cpp}

usage() {
  cat <<EOF
usage: $PROG fetch [--force]
       $PROG build [--cpu] [--clean] [--configure-only]
       $PROG run -m MODEL.gguf --out DIR [options]
       $PROG --help

fetch   (needs the package index) downloads llama-cpp-python==$PYPKG_VERSION's sdist
        with pip, checks its sha256, and writes the llama.cpp it vendors
        (commit ${LLAMA_COMMIT:0:12}), trimmed to what llama-bench needs with the CPU and
        CUDA backends, to .peers/llama.cpp/ (git-ignored; ~16 MB). Does nothing when
        that version is already there (--force: fetch again).
build   configures and builds the llama-bench target into \$LLAMA_BUILD (default
        /tmp/llama-build; /tmp/llama-build-cpu with --cpu), reusing a build that is
        there. CUDA by default (sm_\$CUDA_ARCH, default 90); --cpu or GGML_CUDA=OFF for
        the CPU only. --clean removes the build folder first; --configure-only stops
        before compiling. A build cut short resumes where it stopped when run again.
        Logs: \$LLAMA_BUILD/*.log.
run     runs llama-bench on one GGUF file, one process per measurement, each under
        a time limit, and writes DIR/runs.csv (one line per run, appended as each
        ends) beside each run's JSON (llama-bench -o json) and log:
          decode:  -p 0 -n GEN -d CTX -fa 1 -ctk KV -ctv KV   for each context
          prefill: -p N -n 0 -fa 1 -b CHUNK -ub CHUNK        for each prompt length
        GPU memory: nvidia-smi's memory.used sampled every 100 ms during the run;
        the row holds its peak minus the reading just before the run (idle).
  -m, --model FILE       GGUF file (required)
  --out DIR              output folder (required; created; runs.csv is appended to)
  --contexts LIST        decode contexts, comma-separated, K = 1024, M = 1024^2
                         (default 0,4K,32K,128K)
  --prefill LIST         prefill prompt lengths (default 4K,32K; 'none' for none)
  --gen N                decode tokens per repetition (default 32)
  --reps N               repetitions per run, llama-bench -r (default 3)
  --kv-type T            KV cache type, -ctk/-ctv (default f16)
  --chunk N              prefill -b/-ub: tokens per forward pass (default 4096, as
                         topkv's --chunk 4096)
  --decode-ubatch N      decode runs' -ub, which also sizes the depth fill's passes and
                         the compute buffers llama.cpp reserves (default 512,
                         llama-bench's own; -b is max(2048, N))
  --threads N            llama-bench -t (default: llama-bench's)
  --timeout S            seconds per run before it is killed (default 300)
  --keep-going           after a decode run times out or fails, still run the larger
                         contexts (default: they are recorded as skipped)
  --bin FILE             llama-bench binary (default \$LLAMA_BUILD/bin/llama-bench)
  -- ARGS                passed on to every llama-bench call
Environment: LLAMA_SRC (source folder, default .peers/llama.cpp), LLAMA_BUILD,
GGML_CUDA (ON/OFF), CUDA_ARCH (default 90), JOBS (default: all cores).
EOF
}

die() { echo "$PROG: error: $*" >&2; exit 1; }
say() { echo "[llama.cpp] $*" >&2; }

need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found; $2"; }

# ---------------------------------------------------------------- fetch

# What llama-bench needs, relative to the llama.cpp root. ggml/src keeps its
# own files, ggml-cpu and ggml-cuda (the other backends' folders are dropped;
# ggml/src/CMakeLists.txt adds a backend's folder only when its option is on).
readonly KEEP=(CMakeLists.txt LICENSE cmake include src common vendor ggml/CMakeLists.txt ggml/cmake ggml/include
               ggml/src tools/llama-bench)

fetch() {
  local force=0
  for a in "$@"; do
    case $a in
      --force) force=1 ;;
      *) die "fetch: unknown argument '$a' (see --help)" ;;
    esac
  done
  local stamp="$SRC/PEER_SOURCE.txt"
  if [[ $force == 0 && -f $stamp ]] && grep -qx "sha256=$PYPKG_SHA256" "$stamp"; then
    say "llama-cpp-python $PYPKG_VERSION is already in $SRC ($(du -sh "$SRC" | cut -f1)); --force fetches again"
    return
  fi
  need python3 "install Python 3 with pip"
  python3 -m pip --version >/dev/null 2>&1 || die "python3 has no pip; install python3-pip"
  mkdir -p "$PEERS"
  FETCH_TMP=$(mktemp -d "$PEERS/fetch.XXXXXX")
  trap 'rm -rf "$FETCH_TMP"' EXIT
  local tmp=$FETCH_TMP

  local sdist="$PEERS/download/llama_cpp_python-$PYPKG_VERSION.tar.gz"
  if [[ ! -f $sdist ]] || ! echo "$PYPKG_SHA256  $sdist" | sha256sum -c --status; then
    say "downloading llama-cpp-python==$PYPKG_VERSION (sdist, ~77 MB; pip prepares its metadata, a minute or two)"
    mkdir -p "$PEERS/download"
    # pip checks the hash itself (--require-hashes); we check it again below.
    echo "llama-cpp-python==$PYPKG_VERSION --hash=sha256:$PYPKG_SHA256" >"$tmp/req.txt"
    python3 -m pip download --quiet --no-binary :all: --no-deps --require-hashes -r "$tmp/req.txt" \
      -d "$tmp/dl" >"$tmp/pip.log" 2>&1 || { tail -20 "$tmp/pip.log" >&2; die "pip download failed (log above)"; }
    local got
    got=$(ls "$tmp"/dl/*.tar.gz 2>/dev/null | head -1)
    [[ -n $got ]] || die "pip download wrote no .tar.gz sdist into $tmp/dl"
    mv "$got" "$sdist"
  fi
  echo "$PYPKG_SHA256  $sdist" | sha256sum -c --status ||
    die "$sdist: sha256 is $(sha256sum "$sdist" | cut -d' ' -f1), expected $PYPKG_SHA256; delete it and fetch again"
  say "sha256 ok: $PYPKG_SHA256"

  local top="llama_cpp_python-$PYPKG_VERSION/vendor/llama.cpp"
  tar -xzf "$sdist" -C "$tmp" "$top" || die "cannot extract $top from $sdist"
  local from="$tmp/$top" to="$tmp/llama.cpp"
  for p in "${KEEP[@]}"; do
    [[ -e $from/$p ]] || die "the sdist's llama.cpp has no $p; is the pinned version right?"
    mkdir -p "$(dirname "$to/$p")"
    mv "$from/$p" "$to/$p"
  done
  local d
  for d in "$to"/ggml/src/ggml-*/; do
    case $(basename "$d") in ggml-cpu | ggml-cuda) ;; *) rm -rf "$d" ;; esac
  done
  # miniaudio.h (4 MB) serves only the multimodal tool; its CMake target stays
  # (vendor/CMakeLists.txt adds it unconditionally) and includes nothing.
  rm -f "$to/vendor/miniaudio/miniaudio.h"
  # The original tools/CMakeLists.txt adds every tool; this one adds llama-bench.
  cat >"$to/tools/CMakeLists.txt" <<'EOF'
# Written by topkv's bench/peers/llama_cpp.sh: the trimmed tree holds only llama-bench.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
EOF
  cat >"$to/PEER_SOURCE.txt" <<EOF
llama.cpp trimmed for llama-bench by topkv's $PROG
package=llama-cpp-python==$PYPKG_VERSION (sdist, vendor/llama.cpp)
sha256=$PYPKG_SHA256
llama_cpp_commit=$LLAMA_COMMIT
kept=${KEEP[*]} (ggml/src without backends other than ggml-cpu and ggml-cuda; vendor without miniaudio.h)
EOF
  rm -rf "$SRC.old"
  if [[ -e $SRC ]]; then mv "$SRC" "$SRC.old"; fi
  mv "$to" "$SRC"
  rm -rf "$SRC.old"
  say "wrote $SRC: $(du -sh "$SRC" | cut -f1) ($(find "$SRC" -type f | wc -l) files)"
}

# ---------------------------------------------------------------- build

build() {
  local cuda=${GGML_CUDA:-ON} clean=0 configure_only=0
  for a in "$@"; do
    case $a in
      --cpu) cuda=OFF ;;
      --clean) clean=1 ;;
      --configure-only) configure_only=1 ;;
      *) die "build: unknown argument '$a' (see --help)" ;;
    esac
  done
  case ${cuda^^} in ON | 1 | TRUE) cuda=ON ;; OFF | 0 | FALSE) cuda=OFF ;; *) die "GGML_CUDA must be ON or OFF (got '$cuda')" ;; esac
  [[ -f $SRC/PEER_SOURCE.txt ]] || die "no llama.cpp source in $SRC; run '$PROG fetch' where the package index is reachable (and carry .peers/llama.cpp)"
  need cmake "install CMake"
  local bdir=${LLAMA_BUILD:-/tmp/llama-build}
  if [[ $cuda == OFF && -z ${LLAMA_BUILD:-} ]]; then bdir=/tmp/llama-build-cpu; fi
  if [[ $clean == 1 ]]; then rm -rf "$bdir"; fi
  mkdir -p "$bdir"
  local jobs=${JOBS:-$(nproc)}
  local gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  local opts=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=$cuda
              -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
              -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF
              -DLLAMA_BUILD_COMMIT=${LLAMA_COMMIT:0:8} -DLLAMA_BUILD_NUMBER=0)
  if [[ $cuda == ON ]]; then
    need nvcc "llama.cpp's CUDA build needs the CUDA toolkit (or build with --cpu)"
    opts+=(-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DGGML_CUDA_NCCL=OFF)
  fi
  local want="src=$SRC cuda=$cuda arch=${CUDA_ARCH:-90} ${gen[*]}"
  if [[ -f $bdir/CMakeCache.txt && -f $bdir/.peer-config && $(cat "$bdir/.peer-config") == "$want" ]]; then
    say "reusing the configured build in $bdir"
  else
    if [[ -f $bdir/CMakeCache.txt ]]; then rm -rf "$bdir"; mkdir -p "$bdir"; fi  # another source or options: start clean
    say "configuring into $bdir (GGML_CUDA=$cuda${gen:+, Ninja}; log: $bdir/configure.log)"
    # git would climb out of the trimmed tree into the enclosing repository and
    # stamp its commit into llama.cpp's build info; the ceiling stops it.
    GIT_CEILING_DIRECTORIES=$(dirname "$SRC") cmake -S "$SRC" -B "$bdir" "${gen[@]}" "${opts[@]}" \
      >"$bdir/configure.log" 2>&1 || { tail -30 "$bdir/configure.log" >&2; die "configure failed (log above)"; }
    echo "$want" >"$bdir/.peer-config"
  fi
  if [[ $configure_only == 1 ]]; then say "configured $bdir"; return; fi
  say "building llama-bench with $jobs jobs (log: $bdir/build.log; progress every 10%)"
  local t0=$SECONDS rc
  # Print a line whenever the build passes another 10% (ninja: [done/total], make: [ NN%]).
  set +e
  cmake --build "$bdir" --target llama-bench -j "$jobs" 2>&1 | tee "$bdir/build.log" | awk '
    { p = -1
      if (match($0, /^\[[0-9]+\/[0-9]+\]/)) { split(substr($0, 2, RLENGTH - 2), f, "/"); p = int(100 * f[1] / f[2]) }
      else if (match($0, /^\[ *[0-9]+%\]/)) { p = int(substr($0, 2, RLENGTH - 3)) }
      if (p >= next_p) { printf "[llama.cpp]   %d%%\n", p > "/dev/stderr"; next_p = (int(p / 10) + 1) * 10 } }
    BEGIN { next_p = 10 }'
  rc=${PIPESTATUS[0]}
  set -e
  [[ $rc == 0 ]] || { grep -E -m 20 'error|Error' "$bdir/build.log" >&2 || tail -30 "$bdir/build.log" >&2; die "build failed (rc $rc; log: $bdir/build.log)"; }
  [[ -x $bdir/bin/llama-bench ]] || die "the build ended but $bdir/bin/llama-bench is missing"
  say "built $bdir/bin/llama-bench in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------- run

# "4K,512,1M" -> "512 4096 1048576": sorted, without repeats. Exits on a bad entry.
counts() {
  local out=() x s mult
  IFS=, read -ra parts <<<"$1"
  for x in "${parts[@]}"; do
    s=${x^^} mult=1
    case $s in *K) mult=1024; s=${s%K} ;; *M) mult=1048576; s=${s%M} ;; esac
    [[ $s =~ ^[0-9]+$ ]] || die "'$x' is not a token count (digits, optionally K or M)"
    out+=($((10#$s * mult)))
  done
  ((${#out[@]})) || die "'$1' holds no token count"
  printf '%s\n' "${out[@]}" | sort -n | uniq | tr '\n' ' '
}

gpu_mem_used() {  # MiB in use on GPU $GPU_INDEX now, or nothing without nvidia-smi
  if [[ $HAVE_SMI == 1 ]]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" 2>/dev/null | head -1 | tr -d ' '
  fi
}

csv_quote() { local s=${1//\"/\"\"}; printf '"%s"' "$s"; }

# On SIGTERM/SIGINT (a device call's limit, ^C): stop the run in progress and
# its sampler, and record it, so runs.csv says what happened to every run.
RUN_PID=
interrupted() {
  if [[ -n $RUN_PID ]]; then
    kill -TERM "$RUN_PID" 2>/dev/null || true
    [[ -n $SAMPLER_PID ]] && kill "$SAMPLER_PID" 2>/dev/null
    printf '%s,%s,%s,%s,%s,,,,,%s\n' "$RUN_NAME" "$RUN_MODE" "$(csv_quote "$(basename "$MODEL")")" "$RUN_CTX" \
      "$(csv_quote interrupted)" "$(csv_quote "$RUN_CMD")" >>"$OUT/runs.csv"
    say "$RUN_NAME: interrupted; the runs before it are in $OUT/runs.csv"
  fi
  exit 130
}

# One llama-bench process: NAME MODE CONTEXT ARGS...; appends a line to runs.csv.
# Returns 1 when it timed out or failed.
one_run() {
  local name=$1 mode=$2 ctx=$3
  shift 3
  local cmd=("$BIN" -m "$MODEL" "$@" -r "$REPS" -o json "${EXTRA[@]}")
  local json="$OUT/$name.json" log="$OUT/$name.log" smi="$OUT/$name.smi"
  rm -f "$json" "$json.part" "$smi"
  local idle sampler=
  idle=$(gpu_mem_used)
  if [[ $HAVE_SMI == 1 ]]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" -lms 100 >"$smi" 2>/dev/null &
    sampler=$!
  fi
  local t0 rc=0
  t0=$(date +%s.%N)
  echo "# ${cmd[*]}" >"$log"
  # In the background so that a signal to this script is handled at once (interrupted()).
  timeout --signal=TERM --kill-after=10 "$TIMEOUT" "${cmd[@]}" >"$json.part" 2>>"$log" &
  RUN_PID=$! RUN_NAME=$name RUN_MODE=$mode RUN_CTX=$ctx RUN_CMD="${cmd[*]}" SAMPLER_PID=$sampler
  wait "$RUN_PID" || rc=$?
  RUN_PID=
  local wall
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [[ -n $sampler ]]; then kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true; fi
  local peak=
  [[ -s $smi && -n $idle ]] && peak=$(awk -v idle="$idle" '$1 ~ /^[0-9]+$/ && $1 > m { m = $1 } END { if (m != "") print m - idle }' "$smi")
  local status=ok
  if [[ $rc == 0 ]]; then mv "$json.part" "$json"; else
    status=$([[ $rc == 124 || $rc == 137 ]] && echo "timeout after ${TIMEOUT}s" || echo "failed rc=$rc")
  fi
  printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$name" "$mode" "$(csv_quote "$(basename "$MODEL")")" "$ctx" \
    "$(csv_quote "$status")" "$wall" "$idle" "$peak" "$(csv_quote "$name.json")" "$(csv_quote "${cmd[*]}")" >>"$OUT/runs.csv"
  local ts=
  [[ $status == ok ]] && ts=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ".join("%.1f" % t["avg_ts"] for t in r))' "$json" 2>/dev/null || true)
  say "$name: $status, ${wall} s${ts:+, $ts tok/s}${peak:+, GPU +$peak MiB}"
  [[ $status == ok ]] || { tail -3 "$log" | sed 's/^/    /' >&2; return 1; }
}

run() {
  MODEL= OUT=
  local contexts=0,4K,32K,128K prefill=4K,32K gen=32 kv=f16 chunk=4096 ubatch=512 threads= keep_going=0
  REPS=3 TIMEOUT=300 EXTRA=()
  BIN=${LLAMA_BUILD:-/tmp/llama-build}/bin/llama-bench
  while (($#)); do
    case $1 in
      -m | --model) MODEL=${2:?}; shift 2 ;;
      --out) OUT=${2:?}; shift 2 ;;
      --contexts) contexts=${2:?}; shift 2 ;;
      --prefill) prefill=${2:?}; shift 2 ;;
      --gen) gen=${2:?}; shift 2 ;;
      --reps) REPS=${2:?}; shift 2 ;;
      --kv-type) kv=${2:?}; shift 2 ;;
      --chunk) chunk=${2:?}; shift 2 ;;
      --decode-ubatch) ubatch=${2:?}; shift 2 ;;
      --threads) threads=${2:?}; shift 2 ;;
      --timeout) TIMEOUT=${2:?}; shift 2 ;;
      --keep-going) keep_going=1; shift ;;
      --bin) BIN=${2:?}; shift 2 ;;
      --) shift; EXTRA=("$@"); break ;;
      *) die "run: unknown argument '$1' (see --help)" ;;
    esac
  done
  [[ -n $MODEL ]] || die "run: give the model: -m FILE.gguf"
  [[ -f $MODEL ]] || die "run: model $MODEL: no such file"
  [[ -n $OUT ]] || die "run: give the output folder: --out DIR"
  [[ -x $BIN ]] || die "run: no llama-bench at $BIN; run '$PROG build' first (or set LLAMA_BUILD / --bin)"
  local ctx_list pre_list=
  ctx_list=$(counts "$contexts")  # here, not in the loops: a bad list stops the script before any run
  if [[ $prefill != none ]]; then pre_list=$(counts "$prefill"); fi
  need timeout "install GNU coreutils"
  need python3 "install Python 3"
  mkdir -p "$OUT"
  HAVE_SMI=0
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && HAVE_SMI=1
  GPU_INDEX=${CUDA_VISIBLE_DEVICES:-0}; GPU_INDEX=${GPU_INDEX%%,*}
  [[ $GPU_INDEX =~ ^[0-9]+$ ]] || GPU_INDEX=0
  trap interrupted TERM INT
  [[ -f $OUT/runs.csv ]] || echo "name,mode,model,context,status,wall_s,gpu_idle_mib,gpu_peak_mib,json,command" >"$OUT/runs.csv"
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(hostname)"
    cat "$SRC/PEER_SOURCE.txt" 2>/dev/null || true
    echo "llama-bench: $BIN"
    if [[ $HAVE_SMI == 1 ]]; then
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i "$GPU_INDEX"
    fi
  } >"$OUT/env.txt"
  [[ $HAVE_SMI == 1 ]] || say "no nvidia-smi: GPU memory is not recorded"
  local common=(-fa 1 -ngl 99)
  if [[ -n $threads ]]; then common+=(-t "$threads"); fi
  local stem ctx n skip=
  stem=$(basename "$MODEL" .gguf)
  for ctx in $ctx_list; do
    if [[ -n $skip ]]; then
      printf '%s,decode,%s,%s,%s,,,,,\n' "$stem-decode-d$ctx" "$(csv_quote "$(basename "$MODEL")")" "$ctx" \
        "$(csv_quote "skipped: $skip")" >>"$OUT/runs.csv"
      say "$stem-decode-d$ctx: skipped ($skip)"
      continue
    fi
    one_run "$stem-decode-d$ctx" decode "$ctx" -p 0 -n "$gen" -d "$ctx" -ctk "$kv" -ctv "$kv" \
      -b $((ubatch > 2048 ? ubatch : 2048)) -ub "$ubatch" "${common[@]}" ||
      { [[ $keep_going == 1 ]] || skip="context $ctx did not finish"; }
  done
  for n in $pre_list; do
    one_run "$stem-prefill-p$n" prefill "$n" -p "$n" -n 0 -ctk "$kv" -ctv "$kv" -b "$chunk" -ub "$chunk" \
      "${common[@]}" || true
  done
  say "results in $OUT (runs.csv; compare: python3 bench/peers/compare.py --llama $OUT --topkv DECODE.json --out DIR)"
}

# ---------------------------------------------------------------- main

case ${1:-} in
  fetch) shift; fetch "$@" ;;
  build) shift; build "$@" ;;
  run) shift; run "$@" ;;
  -h | --help | help) usage ;;
  "") usage >&2; exit 2 ;;
  *) usage >&2; die "unknown subcommand '$1'" ;;
esac
