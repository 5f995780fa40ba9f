"""Learn the shapes of the user's model for the plan, by building it once in a subprocess (cached).

The planner is TensorFlow-free: it computes the built-in models' variables from the config
(``tfplan.planning.sharding``). A user's Keras model (``model._target_``) has shapes only Keras
knows, so the first plan of a model builds it with ``python -m recipes.inspect_model`` (the
recipes as shipped, the user's package from ``recipe.code_dir``), as a TF1 replica would, and
keeps the answer in ``.tfplan/cache/`` under a key of everything that can change it: the model
and data config, the user's code (its digest) and the TensorFlow version. Later plans of the
same model read the cache (milliseconds instead of seconds).

A model that cannot be built here gives no preview and a plan warning with the reason (the hosts
may differ from this machine; if they do not, the tasks fail the same way, in one line).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tfplan.backends.staging import RECIPES_DIR
from tfplan.files import write_atomic
from tfplan.planning.plan import UserCode, VariableSpec

__all__ = ["INSPECT_TIMEOUT_SECS", "Inspection", "inspect_model"]

INSPECT_TIMEOUT_SECS = 180.0


class Inspection:
    """The outcome: the variables (None when unknown), where they come from, or why not."""

    def __init__(
        self,
        variables: tuple[VariableSpec, ...] | None,
        source: str,
        problem: str = "",
        devices: dict[str, int] | None = None,
    ) -> None:
        self.variables = variables
        self.source = source
        self.problem = problem
        self.devices = devices or {}  # variable -> the ps the device setter put it on


def _key(
    run_config: dict[str, Any], user_code: tuple[UserCode, ...], tf_version: str, num_ps: int
) -> str:
    what = {
        "ps": num_ps,
        "model": run_config.get("model"),
        "data": run_config.get("data"),
        "code": [c.digest for c in user_code],
        "tf": tf_version,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def _variables(raw: list[dict[str, Any]]) -> tuple[VariableSpec, ...]:
    return tuple(
        VariableSpec(
            name=str(v["name"]), shape=tuple(int(d) for d in v["shape"]), bytes=int(v["bytes"])
        )
        for v in raw
    )


def inspect_model(
    run_config: dict[str, Any],
    user_code: tuple[UserCode, ...],
    code_dir: str,
    cache_dir: Path,
    tf_version: str,
    num_ps: int = 1,
) -> Inspection:
    """The variables of the run config's Keras model, from the cache or a build in a
    subprocess (this interpreter, the recipes beside tfplan, ``code_dir`` first on the path)."""
    target = (run_config.get("model") or {}).get("_target_")
    key = _key(run_config, user_code, tf_version, num_ps)
    cached = cache_dir / f"model-{key}.json"
    source = f"an inspection build of {target}"
    try:
        raw = json.loads(cached.read_text())
        return _inspection(raw, f"{source} (cached)")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    with tempfile.TemporaryDirectory(prefix="tfplan-inspect-") as tmp:
        config = {**run_config, "output_dir": tmp}
        path = Path(tmp, "run.yaml")
        path.write_text(yaml.safe_dump(config, sort_keys=True))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([code_dir, str(RECIPES_DIR.parent)]),
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "CUDA_VISIBLE_DEVICES": "",
        }
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "recipes.inspect_model", str(path), str(num_ps)],
                capture_output=True,
                text=True,
                timeout=INSPECT_TIMEOUT_SECS,
                env=env,
                cwd=tmp,
            )
        except subprocess.TimeoutExpired:
            return Inspection(None, source, f"building it took over {INSPECT_TIMEOUT_SECS:g}s")
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        why = (
            errors[-1][len("error: ") :]
            if errors
            else (proc.stderr.strip().splitlines() or ["?"])[-1]
        )
        return Inspection(None, source, why)
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    write_atomic(cached, json.dumps(raw))
    return _inspection(raw, source)


def _inspection(raw: dict[str, Any], source: str) -> Inspection:
    devices = {str(v["name"]): int(v.get("ps", 0)) for v in raw["variables"]}
    return Inspection(_variables(raw["variables"]), source, devices=devices)
