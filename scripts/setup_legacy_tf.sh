#!/usr/bin/env bash
# A second interpreter with TensorFlow 2.15 and tensorflow-estimator, in .venv-tf215 (or $1):
# what a host needs to run Estimator programs, which TensorFlow 2.16 removed. The full test tier
# runs an Estimator train_and_evaluate job on it under tfplan (tests/test_known_failures.py).
# constraints-legacy-tf.txt locks every package at the versions tested. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-.venv-tf215}
PYTHON=${PYTHON:-python3}
if [ -x "$target/bin/python" ] && "$target/bin/python" -c "import tensorflow_estimator" 2>/dev/null; then
  exit 0
fi
"$PYTHON" -m venv "$target"
# with scripts/setup.sh's uv (12 s on a fresh machine; pip took 128 s of the full tier's wall)
uv=${UV:-.venv/bin/uv}
"$uv" pip install -q --python "$target/bin/python" --compile-bytecode -c constraints-legacy-tf.txt \
  "tensorflow-cpu==2.15.1" "tensorflow-estimator==2.15.0"
"$target/bin/python" -c "import tensorflow_estimator" 2>/dev/null || {
  echo "setup_legacy_tf: tensorflow-estimator does not import in $target" >&2
  exit 1
}
