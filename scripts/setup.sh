#!/usr/bin/env bash
# Set up a development machine: system packages the tests need (a real sshd, iproute2 for
# network namespaces, nftables and iptables for the firewall tests), then a virtualenv in .venv
# with tfplan installed editable.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v ps >/dev/null 2>&1 || need+=(procps)
# root's PATH has the sbin folders; a plain user's may not: look there too
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need+=(nftables)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "setup: please install ${need[*]} (the SSH, multi-host and firewall tests need them)" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
.venv/bin/tfplan --version
