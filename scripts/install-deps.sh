#!/usr/bin/env bash
# Installs the Debian packages xrnic needs to build its XDP program (clang, libbpf headers)
# and to link xsk-rs / libbpf-rs (libbpf-sys and libxdp-sys build vendored libbpf/libxdp:
# they need m4, make, pkg-config, libelf and zlib headers). `ip` (iproute2) and `ping`
# (iputils-ping) are used by the network-namespace tests, `setpriv` (util-linux) by the
# non-root error test.
#
# Idempotent: installs only what is missing, and runs `apt-get update` only then.
set -euo pipefail

PKGS=(clang llvm gcc libc6-dev m4 libelf-dev zlib1g-dev pkg-config make linux-libc-dev libbpf-dev
    iproute2 iputils-ping util-linux)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all packages present (${PKGS[*]})"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-deps: missing packages ${missing[*]} and not root (no sudo)" >&2
        exit 1
    fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
