#!/usr/bin/env bash
# Installs the Debian packages topkv builds and tests with. Idempotent: when
# everything is already there it prints nothing and touches nothing.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libfaiss-dev libopenblas-dev        # Faiss (static) and the BLAS it links
  libhnswlib-dev                      # hnswlib (header-only)
  libtbb-dev                          # oneTBB
  libomp-dev                          # OpenMP (GCC's libgomp comes with g++)
  catch2                              # Catch2 v2 + CTest integration
  libcli11-dev libfmt-dev nlohmann-json3-dev
  libcpp-httplib-dev                  # topkv serve (cpp-httplib)
  python3 python3-pip python3-numpy python3-matplotlib   # plots, model fetch
  clang libclang-rt-dev               # libFuzzer targets (tests/fuzz, TOPKV_FUZZ)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
