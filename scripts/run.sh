#!/usr/bin/env bash
# The main job on a fresh machine: installs what the build needs, builds topkv,
# and runs it. Until `topkv generate` lands this runs the recall benchmark on
# synthetic attention data (a small default size; pass your own arguments to
# run something else: scripts/run.sh bench recall --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target topkv >/dev/null
if [ $# -gt 0 ]; then exec "$BUILD_DIR/bin/topkv" "$@"; fi
exec "$BUILD_DIR/bin/topkv" info
