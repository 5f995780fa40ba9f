#!/usr/bin/env bash
# Refresh constraints.txt, the lock of every Python package a development install holds.
#
# pip resolves pyproject.toml's loose ranges (what people installing tfplan into their own
# environment get) into a new, empty venv, the same installs as scripts/setup.sh; the result is
# frozen, versions pinned, into constraints.txt. scripts/setup.sh (and so .ci/run) installs with
# `uv pip install -c constraints.txt`, so a fresh clone installs what CI tested. Refresh it on
# purpose (new releases, a new dependency), run the full tier, and commit it with the change:
#
#     bash scripts/lock.sh && .venv/bin/python -m pytest --tier=full
#
# Why pip's own freeze and not another lock tool: it records what pip really installed and the
# tests really ran with (kubeflow-training's --no-deps install included), needs nothing beyond
# pip, and setup.sh consumes it with pip's standard `-c` constraints.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip setuptools wheel
# the same installs as scripts/setup.sh, without the lock
"${pip[@]}" install -q '.[dev]'
"${pip[@]}" install -q --no-deps 'kubeflow-training>=1.9,<2'
"${pip[@]}" install -q --no-deps 'tf_keras>=2.16,<3'
{
  echo "# The lock: every package of a development install, pinned (pip freeze of a new venv)."
  echo "# Made by scripts/lock.sh with $("$work/venv/bin/python" --version) on $(uname -m); refresh with"
  echo "#     bash scripts/lock.sh"
  echo "# scripts/setup.sh installs with uv pip install -c constraints.txt: what CI tested."
  "${pip[@]}" freeze --all --exclude tfplan | LC_ALL=C sort -f
} >constraints.txt.new
mv constraints.txt.new constraints.txt
echo "lock: constraints.txt holds $(grep -cv '^#' constraints.txt) packages"
