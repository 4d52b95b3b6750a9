#!/usr/bin/env bash
# Install the Debian packages given as arguments, but only those that are missing.
#
# Idempotent: when everything is already installed it does nothing (no network, no root
# needed). `apt-get update` runs at most once, and only when something must be installed.
# Never prompts: DEBIAN_FRONTEND=noninteractive, and tshark's "should non-superusers be
# able to capture packets?" question is preseeded to "no" (we only read files).
#
# Usage: scripts/install-deps.sh PACKAGE...
set -euo pipefail

missing=()
for pkg in "$@"; do
    # dpkg-query reports "install ok installed" only for a fully installed package.
    if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing missing Debian packages: ${missing[*]}" >&2
sudo=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then
        sudo=(sudo)
    else
        echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
for pkg in "${missing[@]}"; do
    if [[ $pkg == tshark || $pkg == wireshark-common ]]; then
        echo "wireshark-common wireshark-common/install-setuid boolean false" |
            "${sudo[@]}" debconf-set-selections
    fi
done
# Another apt may hold the locks (other builds on the machine): wait for it, don't fail.
apt=("${sudo[@]}" apt-get -q -o DPkg::Lock::Timeout=600)
for attempt in 1 2 3 4 5 6 7 8 9 10; do
    "${apt[@]}" update && break
    [[ $attempt -eq 10 ]] && exit 1
    echo "install-deps: apt-get update failed (lock held?), retrying in 15 s" >&2
    sleep 15
done
"${apt[@]}" install -y --no-install-recommends "${missing[@]}"
