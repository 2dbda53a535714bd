#!/usr/bin/env bash
# Installs what the reliability test beds need (tests/reliability/testbed.py): sshfs and
# openssh-server from Debian, plus FUSE's fusermount3 and util-linux's mount. Idempotent:
# installs only what is missing. Needs root (CI runs as root).
set -euo pipefail

missing=()
command -v sshfs >/dev/null 2>&1 || missing+=(sshfs)
[[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
command -v fusermount3 >/dev/null 2>&1 || missing+=(fuse3)
command -v mount >/dev/null 2>&1 || missing+=(mount)

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup_testbed: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# sshd's privilege-separation directory; /dev/fuse must exist for sshfs.
mkdir -p /run/sshd
if [[ ! -e /dev/fuse ]]; then
  echo "setup_testbed: /dev/fuse is missing: the two-host tests cannot mount sshfs here" >&2
  exit 1
fi
echo "setup_testbed: sshfs $(sshfs --version 2>&1 | sed -n 's/^SSHFS version //p'), $(/usr/sbin/sshd -V 2>&1 | head -1 || true)"
