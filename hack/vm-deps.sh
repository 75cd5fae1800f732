#!/bin/bash
# vm-deps.sh installs what the vm runtime needs on the host: QEMU from Debian's packages (apt-get)
# and Debian's cloud kernel, unpacked (apt-get download + dpkg-deb -x) into a cache directory so
# that the host's /boot is untouched. It prints the kernel's path. Warm, it does nothing but check.
#   AGENTBOX_VM_CACHE  the cache (default /var/cache/agentbox/vm)
# The versions are pinned: QEMU_VERSION and KERNEL_PKG below (bump both deliberately).
set -euo pipefail
QEMU_PKGS="qemu-system-x86 qemu-utils"
QEMU_VERSION="1:7.2+dfsg-7+deb12u18+b3"
# The kernel package linux-image-cloud-amd64 6.1.192-3 depends on:
KERNEL_PKG="linux-image-6.1.0-57-cloud-amd64"
KERNEL_VERSION="6.1.192-3"
cache=${AGENTBOX_VM_CACHE:-/var/cache/agentbox/vm}
dir="$cache/${KERNEL_PKG}_${KERNEL_VERSION}"

missing=""
for p in $QEMU_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" != 0 ]; then echo "run as root (sudo make ...) to install:$missing" >&2; exit 1; fi
  echo "installing:$missing" >&2
  apt-get update -qq >&2
  pins=""; for p in $missing; do
    if apt-cache madison "$p" | grep -qF "$QEMU_VERSION"; then pins="$pins $p=$QEMU_VERSION"; else pins="$pins $p"; fi
  done
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pins >/dev/null
fi

if [ ! -e "$dir/done" ]; then
  if [ "$(id -u)" != 0 ]; then echo "run as root (sudo make ...) to unpack the guest kernel into $dir" >&2; exit 1; fi
  echo "unpacking $KERNEL_PKG $KERNEL_VERSION into $dir" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && { apt-get download -qq "$KERNEL_PKG=$KERNEL_VERSION" >&2 2>/dev/null || { apt-get update -qq >&2 && apt-get download -qq "$KERNEL_PKG=$KERNEL_VERSION" >&2; }; })
  mkdir -p "$tmp/x"
  dpkg-deb -x "$tmp"/${KERNEL_PKG}_*.deb "$tmp/x"
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$tmp"/x/boot/vmlinuz-* "$dir/vmlinuz"
  cp "$tmp"/x/boot/config-* "$dir/config"
  mv "$tmp"/x/lib/modules/* "$dir/modules"
  chmod -R a+rX "$dir"
  touch "$dir/done"
fi
ln -sfn "$(basename "$dir")" "$cache/current"
echo "$cache/current/vmlinuz"
