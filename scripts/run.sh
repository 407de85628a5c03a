#!/usr/bin/env bash
# The main job on a fresh machine: installs what the build needs and the
# default model (Gemma 3 270M), builds topkv, and runs `topkv generate` on it
# with offloaded top-k attention over a long prompt (the design notes), then
# prints its statistics. Pass your own arguments to run anything else:
#   scripts/run.sh generate -p "The capital of France is" -n 40
#   scripts/run.sh bench recall --help
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target topkv >/dev/null
model=$(scripts/fetch-model.sh)
if [ $# -gt 0 ]; then exec "$BUILD_DIR/bin/topkv" "$@"; fi
prompt=$(mktemp)
trap 'rm -f "$prompt"' EXIT
cat README.md scripts/*.sh > "$prompt"
printf '\n\nIn one sentence, the two set-up commands of this project are' >> "$prompt"
"$BUILD_DIR/bin/topkv" generate -m "$model" -f "$prompt" -n 48 -c 8192 --attn topk --index multipole --k 64
