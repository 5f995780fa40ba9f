"""Learn the shapes of the user's model for the plan, by building it once in a subprocess (cached).

The planner is TensorFlow-free: it computes the built-in models' variables from the config
(``tfplan.planning.sharding``). A user's Keras model (``model._target_``) has shapes only Keras
knows, so the first plan of a model builds it with ``python -m recipes.inspect_model`` (the
recipes as shipped, the user's package from ``recipe.code_dir``), as a TF1 replica would, and
keeps the answer in the user's cache (:func:`user_cache_dir`) under a key of everything that can
change it: the model and data config, the user's code and the recipes (their digests), the
TensorFlow version, and the files the config names by what they hold rather than where they lie
(:func:`_files_named`), so that a copy of the project, or another project on the same data,
finds it too. Later plans
of the same model read the cache (milliseconds instead of seconds of TensorFlow's import).

The build also runs the model once on a batch shaped as the data's features, checks that its
named inputs are features, and reports the features it does not take. A model that cannot be
built here gives no preview and the reason, with the exit status of the build (2: the config or
the data; 1: the user's own code raised, whose frames come along): the plan makes it an error
when every task runs on this machine, a warning otherwise (the hosts may differ). Only a build
that succeeded is kept.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tfplan.backends.staging import RECIPES_DIR
from tfplan.config.compose_cache import user_cache_dir  # noqa: F401 - re-exported
from tfplan.files import files_digest, write_atomic
from tfplan.planning.plan import UserCode, VariableSpec

__all__ = ["INSPECT_TIMEOUT_SECS", "Inspection", "inspect_model", "user_cache_dir"]

INSPECT_TIMEOUT_SECS = 180.0
# The files a path or glob of the config names are keyed by their content up to this much (a
# hash at about a GB/s), beyond it by their sizes and modification times (a copy that keeps
# them still hits).
HASHED_BYTES = 64 << 20


class Inspection:
    """The outcome: the variables (None when unknown), where they come from, or why not."""

    def __init__(
        self,
        variables: tuple[VariableSpec, ...] | None,
        source: str,
        problem: str = "",
        devices: dict[str, int] | None = None,
        unused_features: tuple[str, ...] = (),
        exit_code: int | None = None,
        frames: tuple[str, ...] = (),
        tables: tuple[dict[str, Any], ...] = (),
    ) -> None:
        self.variables = variables
        self.source = source
        self.problem = problem
        self.devices = devices or {}  # variable -> the ps the device setter put it on
        self.unused_features = unused_features  # the data's features no model input takes
        self.exit_code = exit_code  # of the failed build: 2 config or data, 1 the user's code
        self.frames = frames  # the user's own frames, innermost last, when their code raised
        self.tables = tables  # the model's Embedding tables, as recipes/inspect_model.py lists

    @property
    def refused(self) -> bool:
        """The recipes refused the config or the user's code raised (not a crash or a time-out):
        the tasks would fail the same way on a host like this one."""
        return self.variables is None and self.exit_code in (1, 2) and bool(self.problem)


def _files_named(value: Any) -> Any:
    """``value`` (a config subtree) with every absolute path or glob that matches files
    replaced by what those files are: their names below the pattern's folder and their content's
    digest (sizes and modification times beyond :data:`HASHED_BYTES`). Where the files lie does
    not change what a build of the model finds in them; what they hold does."""
    if isinstance(value, dict):
        return {k: _files_named(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_files_named(v) for v in value]
    if not isinstance(value, str) or not os.path.isabs(value):
        return value
    matched = sorted(p for p in glob.glob(value) if os.path.isfile(p))
    if not matched:
        return value  # no such file: the build fails, and a failed build is not kept
    root = re.split(r"[*?\[]", value, maxsplit=1)[0].rsplit("/", 1)[0] or "/"  # the fixed part
    try:
        stats = [os.stat(p) for p in matched]
        names = [os.path.relpath(p, root) for p in matched]
        if sum(st.st_size for st in stats) > HASHED_BYTES:
            sized = zip(names, stats, strict=True)
            return {"files": [[n, st.st_size, st.st_mtime_ns] for n, st in sized]}
        return {"files": names, "sha256": files_digest(map(Path, matched), Path(root))}
    except OSError:
        return value


@functools.lru_cache(maxsize=1)
def _recipes_digest() -> str:
    """The recipes that build the model (they change what a build finds)."""
    return files_digest(sorted(RECIPES_DIR.rglob("*.py")), RECIPES_DIR)


def _key(
    run_config: dict[str, Any], user_code: tuple[UserCode, ...], tf_version: str, num_ps: int
) -> str:
    what = {
        "listing": 3,  # what an inspection lists (2: its tables too; 3: files by content)
        "ps": num_ps,
        "model": _files_named(run_config.get("model")),
        "data": _files_named(run_config.get("data")),
        "code": [c.digest for c in user_code],
        "recipes": _recipes_digest(),
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
        lines = proc.stderr.splitlines()
        errors = [i for i, ln in enumerate(lines) if ln.startswith("error:")]
        if not errors:
            why = (proc.stderr.strip().splitlines() or ["?"])[-1]
            return Inspection(None, source, why)
        at = errors[-1]
        frames = tuple(ln.strip() for ln in lines[at + 1 :] if ln.startswith("  "))
        why = lines[at][len("error: ") :]
        return Inspection(None, source, why, exit_code=proc.returncode, frames=frames)
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    try:
        write_atomic(cached, json.dumps(raw))
    except OSError:
        pass  # a read-only home: the next plan builds it again
    return _inspection(raw, source)


def _inspection(raw: dict[str, Any], source: str) -> Inspection:
    devices = {str(v["name"]): int(v.get("ps", 0)) for v in raw["variables"]}
    unused = tuple(str(f) for f in raw.get("unused_features") or ())
    tables = tuple(dict(t) for t in raw.get("tables") or ())
    return Inspection(
        _variables(raw["variables"]),
        source,
        devices=devices,
        unused_features=unused,
        tables=tables,
    )
