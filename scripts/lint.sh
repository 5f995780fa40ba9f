#!/usr/bin/env bash
# Lint and type-check what CI checks: ruff (lint and format) on the product, the tests, the
# benchmarks and the examples; mypy (strict, pyproject.toml) on tfplan/ and recipes/.
set -euo pipefail
cd "$(dirname "$0")/.."
paths=(tfplan recipes tests bench examples hydra_plugins)
.venv/bin/ruff check "${paths[@]}"
.venv/bin/ruff format --check "${paths[@]}"
.venv/bin/mypy
