#!/usr/bin/env bash
# Set up a development machine: system packages the tests need (a real sshd, iproute2 for
# network namespaces, nftables and iptables for the firewall tests, a real Slurm with munge,
# Java for Spark),
# then a virtualenv in .venv with tfplan installed editable. Idempotent: only what is missing is
# installed.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v ps >/dev/null 2>&1 || need+=(procps)
# root's PATH has the sbin folders; a plain user's may not: look there too
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need+=(nftables)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)
# Slurm test bed (tests/slurm_testbed.py): daemons and clients; none of them starts by itself.
[ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
# Spark test bed (tests/spark_testbed.py): Java for Spark's daemons and drivers (pyspark, which
# carries Spark itself, comes with the dev extra below).
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need[*]}"
    # other engineers may be installing at the same time: wait for the dpkg lock, do not fail
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
      --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "setup: please install ${need[*]} (the SSH, multi-host, firewall, Slurm and Spark tests need them)" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# constraints.txt is the lock (scripts/lock.sh makes it): every package at the version CI tested,
# whatever the registry serves today. pyproject.toml's own ranges stay loose for people who
# install tfplan into their own environment.
lock=(-c constraints.txt)
# uv installs the lock (pip is only what brings it): on a fresh machine it took 35 s where pip
# took 94 (it downloads and unpacks in parallel); --compile-bytecode, as pip does, or every
# process would compile TensorFlow's modules again (its import 13 s instead of 4).
.venv/bin/python -m pip install -q "${lock[@]}" uv 2>&1 | grep -v "^WARNING: Location" || true
install=(.venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode "${lock[@]}")
"${install[@]}" --upgrade pip setuptools wheel
"${install[@]}" -e '.[dev]'
# training-operator v1's SDK, for its TFJob model types only (tests/k8s_helpers.py); without its
# dependencies: it pins kubernetes<36, the client tfplan uses is newer.
"${install[@]}" --no-deps 'kubeflow-training>=1.9,<2'
# Keras 2 for recipe.legacy_keras (tests/test_known_failures.py trains TensorFlow's multi-worker
# Keras tutorial with it); without its dependencies: it requires the full `tensorflow` package,
# which would install beside tensorflow-cpu (both are the `tensorflow` module).
"${install[@]}" --no-deps 'tf_keras>=2.16,<3'
# The project's own modules compiled too (the editable install leaves them as sources): where
# PYTHONDONTWRITEBYTECODE is set (this machine, CI's), every tfplan command and every task would
# compile them again at each start (0.1 s of CPU each); the recipes' bytecode travels with them
# to the hosts (transports/base.py put_tree), checked against the sources' times as always.
.venv/bin/python -m compileall -q -j 0 tfplan recipes hydra_plugins examples >/dev/null
.venv/bin/tfplan --version
