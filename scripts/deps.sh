#!/usr/bin/env bash
# Install the Debian packages Braid builds and tests with, when missing, and
# those named as arguments (make test-sanitize and make fuzz add clang's).
# Idempotent and quiet when everything is present.
set -euo pipefail
pkgs=(libhwloc-dev libibverbs-dev libopenmpi-dev openmpi-bin libcmocka-dev clang-format
  libopenblas-dev zlib1g-dev dataset-fashion-mnist gnuplot-nox iperf3 iproute2 util-linux valgrind
  "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
