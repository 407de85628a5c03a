#!/usr/bin/env bash
# Trims the checkout for a device call that carries a bundle or model parts. The device tool counts
# the disk blocks of the tracked (and untracked, not ignored) files against the 64 MiB a call may
# carry, and the ~3,000 tracked files take ~50 MB of blocks. `out` moves every tracked top-level
# entry but scripts/ and .gitignore to $HOLD (default ../hold-<checkout>); mv keeps their mtimes, so
# the build redoes nothing once `back` returns them. Stop builds first: their sources go away.
#   scripts/gpu-trim.sh out|back
set -euo pipefail
cd "$(dirname "$0")/.."
HOLD=${HOLD:-$(cd .. && pwd)/hold-$(basename "$PWD")}
case "${1:-}" in
  out)
    if [ -e "$HOLD" ] && [ -n "$(ls -A "$HOLD")" ]; then
      echo "gpu-trim: $HOLD already holds entries; run 'scripts/gpu-trim.sh back' first" >&2
      exit 1
    fi
    mkdir -p "$HOLD"
    for e in $(git ls-files | cut -d/ -f1 | sort -u); do
      case "$e" in scripts | .gitignore) ;; *) if [ -e "$e" ]; then mv "$e" "$HOLD/"; fi ;; esac
    done
    ;;
  back)
    [ -d "$HOLD" ] || { echo "gpu-trim: nothing is held in $HOLD" >&2; exit 1; }
    shopt -s dotglob nullglob
    for held in "$HOLD"/*; do
      e=$(basename "$held")
      if [ -e "$e" ]; then echo "gpu-trim: $e is in the checkout again; its held copy stays in $HOLD" >&2; continue; fi
      mv "$held" .
    done
    rmdir "$HOLD" 2>/dev/null || true
    ;;
  *)
    sed -n '2,7p' "$0"
    exit 2
    ;;
esac
