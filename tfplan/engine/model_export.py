"""An experiment's trained Keras model as a ``.keras`` file, from any of its checkpoints.

``tfplan export model -e ID [--step N] [--out PATH]`` finds the experiment (its state in
``.tfplan/<experiment>/state.json``; the run config and the chief's command from the chief's
``run.yaml`` or the plan saved in the experiment's record, ``<output_dir>/tfplan/plan.json``),
picks a checkpoint in ``output_dir`` (the latest, or ``--step N``) and runs ``python -m
recipes.export`` with the plan's interpreter in a subprocess: tfplan never imports TensorFlow
itself, and the model is built by the recipes exactly as the tasks built it.

Every refusal is one line with the fix: no such experiment, no checkpoint yet, a step that is
not there (the steps that are), a built-in model (not a Keras model), a user's own program
(``recipe=command``: its checkpoints are its own), and per-host output (the checkpoints are on
the chief's host, not here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tfplan.backends.staging import RECIPES_DIR
from tfplan.engine.experiment import ExperimentFolder
from tfplan.engine.workspace import Workspace
from tfplan.errors import StateError, TfplanError
from tfplan.planning.plan import Plan
from tfplan.planning.state import State

__all__ = ["EXPORT_TIMEOUT_SECS", "ModelExport", "checkpoint_steps", "plan_export", "run_export"]

EXPORT_TIMEOUT_SECS = 900.0
_INDEX = re.compile(r"^model\.ckpt-(\d+)\.index$")
_SHOWN_STEPS = 10  # a refused --step lists at most the last this many steps


@dataclass(frozen=True)
class ModelExport:
    """One export, ready to run: the checkpoint, where the file goes, and the command."""

    experiment: str
    step: int
    checkpoint: str  # the checkpoint's prefix, <output_dir>/model.ckpt-<step>
    out: Path
    run_yaml: str  # the run config's text (run.yaml), written to a temporary file to run
    python: str
    env: dict[str, str]
    join_bytes: int | None = None  # --join-bytes: larger models are written as parts

    def command(self, run_yaml_path: str) -> list[str]:
        command = [
            self.python,
            "-m",
            "recipes.export",
            "--config",
            run_yaml_path,
            "--checkpoint",
            self.checkpoint,
            "--out",
            str(self.out),
        ]
        if self.join_bytes is not None:
            command += ["--join-bytes", str(self.join_bytes)]
        return command


def checkpoint_steps(folder: Path) -> dict[int, str]:
    """step -> checkpoint prefix of every checkpoint in ``folder`` (both the TF1 recipes' and
    the TF2 strategies' are ``model.ckpt-<step>``, whole once their ``.index`` is there)."""
    steps = {}
    for path in folder.glob("model.ckpt-*.index") if folder.is_dir() else ():
        match = _INDEX.match(path.name)
        if match:
            steps[int(match.group(1))] = str(path.with_suffix(""))
    return dict(sorted(steps.items()))


def _state(workspace: Workspace, experiment: str | None) -> State:
    """The experiment's state.

    Raises:
        StateError: no experiment of that id in the workspace (the known ones listed).
    """
    name = workspace.resolve_experiment(experiment)
    state = workspace.store(name).load()
    if state is None or not state.output_dir:
        known = ", ".join(workspace.experiments()) or "none yet"
        raise StateError(
            f"no experiment {name!r} in {workspace.root} (known: {known}): give one of them "
            "with -e ID, or run tfplan where you applied it"
        )
    return state


def _saved_plan(state: State) -> Plan | None:
    """The plan the experiment applied last, from its record (None when it is not here)."""
    raw = ExperimentFolder(state.record_dir or state.output_dir).saved_plan()
    try:
        return Plan.from_dict(raw) if raw else None
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class _Chief:
    """What the export needs of the chief: where it ran, its folder, command and environment."""

    host: str
    workdir: str
    command: tuple[str, ...]
    env: dict[str, str]


def _chief(state: State, plan: Plan | None) -> _Chief | None:
    """The chief as started (the state's record), else as planned last (the saved plan: a
    destroyed experiment's state keeps no task)."""
    ran = next((t for t in state.tasks if t.is_chief), None)
    if ran is not None:
        return _Chief(ran.host, ran.workdir, ran.command, ran.env)
    planned = next((t for t in plan.tasks if t.is_chief), None) if plan else None
    if planned is not None:
        return _Chief(planned.host, planned.workdir, planned.command, planned.env)
    return None


def _run_config(
    state: State, plan: Plan | None, chief: _Chief | None
) -> tuple[str, dict[str, Any]]:
    """The run config's text (run.yaml) and content: the chief's own file when it is on this
    machine, else the saved plan's (what run.yaml was written from).

    Raises:
        StateError: neither is here.
    """
    if chief is not None:
        path = Path(chief.workdir) / "run.yaml"
        try:
            text = path.read_text()
            data = yaml.safe_load(text)
            if isinstance(data, dict):
                return text, data
        except (OSError, yaml.YAMLError):
            pass
    if plan is not None and plan.run_config:
        return yaml.safe_dump(plan.run_config, sort_keys=True), dict(plan.run_config)
    record = ExperimentFolder(state.record_dir or state.output_dir).root / "plan.json"
    raise StateError(
        f"experiment {state.experiment_id!r}: no run config on this machine (neither the "
        f"chief's run.yaml nor {record}): run tfplan export where you applied it"
    )


def _interpreter(chief: _Chief | None) -> str:
    """The chief's interpreter (the plan's ``cluster.python``) when it runs here, else tfplan's
    own (where the plan's default interpreter is tfplan's too)."""
    if chief is not None and chief.command:
        python = chief.command[0]
        if shutil.which(python):
            return python
    return sys.executable


def _pythonpath(state: State, chief: _Chief | None) -> str:
    """The recipes first (``recipes.export`` exists in this version; a run's shipped copy may
    predate it), then the code as shipped to the chief (what trained), then the user's
    packages where they were planned from."""
    paths = [str(RECIPES_DIR.parent)]
    if chief is not None:
        paths += [p for p in chief.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    context = state.config.get("context") or {}
    for code in context.get("user_code") or ():
        source = Path(str(code.get("source", "")))
        paths.append(str(source.parent))
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [p for p in dict.fromkeys(paths) if Path(p).is_dir()]
    return os.pathsep.join(kept)


def _not_here(state: State, chief: _Chief | None, output_dir: Path) -> str:
    """Why this machine cannot read the checkpoints: per-host output, in one line."""
    host = chief.host if chief else "the chief's host"
    run_yaml = f"{chief.workdir}/run.yaml" if chief else "<chief workdir>/run.yaml"
    copied = Path(state.record_dir or state.output_dir) / "model.keras"
    also = f"; the final model was copied here: {copied}" if copied.is_file() else ""
    return (
        f"the checkpoints of experiment {state.experiment_id!r} are on {host} in {output_dir} "
        f"(per-host output), not on this machine: run `python -m recipes.export --config "
        f"{run_yaml} --checkpoint {output_dir} --out model.keras` there{also}"
    )


def plan_export(
    workspace: Workspace,
    experiment: str | None,
    step: int | None,
    out: str | None,
    join_bytes: int | None = None,
) -> ModelExport:
    """What ``tfplan export model`` will run, every refusal checked first.

    Raises:
        StateError: no such experiment, no run config here.
        TfplanError: a user's own program, a built-in model, per-host output, no checkpoint
            yet, no checkpoint of ``step``, an ``out`` that is not a ``.keras`` path.
    """
    state = _state(workspace, experiment)
    name = state.experiment_id
    plan = _saved_plan(state)
    chief = _chief(state, plan)
    if chief is not None and "recipes.train" not in chief.command:
        raise TfplanError(
            f"experiment {name!r} runs your own program (recipe=command): its checkpoints are "
            "its own; save your model from it (model.save) instead"
        )
    text, run_config = _run_config(state, plan, chief)
    model = run_config.get("model") or {}
    if not model.get("_target_"):
        raise TfplanError(
            f"experiment {name!r} trains the built-in model model.name={model.get('name')}, not "
            "a Keras model: nothing to export as .keras (train your own with "
            "model._target_=my_pkg.models.build)"
        )
    output_dir = Path(str(run_config.get("output_dir") or state.output_dir))
    if state.copy_back or not output_dir.is_dir():
        raise TfplanError(_not_here(state, chief, output_dir))
    steps = checkpoint_steps(output_dir)
    if not steps:
        raise TfplanError(f"no checkpoint in {output_dir} yet: train first (tfplan apply)")
    if step is None:
        step = max(steps)
    elif step not in steps:
        shown = list(steps)[-_SHOWN_STEPS:]
        raise TfplanError(
            f"no checkpoint of step {step} in {output_dir}: there are steps "
            f"{', '.join(map(str, shown))} (--step {shown[-1]})"
        )
    target = Path(out).absolute() if out else output_dir / f"model-{step}.keras"
    if target.suffix != ".keras":
        raise TfplanError(f"--out {out}: Keras saves a model as a .keras file: end it in .keras")
    env = {
        **os.environ,
        "PYTHONPATH": _pythonpath(state, chief),
        "CUDA_VISIBLE_DEVICES": "",  # reading a checkpoint and saving a model needs no GPU
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    if join_bytes is not None and join_bytes < 1:
        raise TfplanError(f"--join-bytes {join_bytes}: give a positive number of bytes")
    python = _interpreter(chief)
    return ModelExport(name, step, steps[step], target, text, python, env, join_bytes)


def run_export(job: ModelExport, timeout: float = EXPORT_TIMEOUT_SECS) -> Path:
    """Run the export; returns what it wrote: the ``.keras`` file, or the folder of parts of
    a model too large to join (recipes/export_parts.py).

    Raises:
        TfplanError: the export failed (its own one line, which names the fix).
    """
    with tempfile.TemporaryDirectory(prefix="tfplan-export-") as tmp:
        run_yaml = Path(tmp) / "run.yaml"
        run_yaml.write_text(job.run_yaml)
        try:
            proc = subprocess.run(
                job.command(str(run_yaml)),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=job.env,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise TfplanError(
                f"exporting step {job.step} of experiment {job.experiment!r} took over "
                f"{timeout:g}s: run `python -m recipes.export` by hand to see why"
            ) from None
        except OSError as error:
            raise TfplanError(
                f"cannot run {job.python} to export experiment {job.experiment!r}: {error}: "
                "set cluster.python to an interpreter with TensorFlow"
            ) from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error:")]
        why = (errors or lines or [f"exit status {proc.returncode}"])[-1]
        raise TfplanError(
            f"exporting step {job.step} of experiment {job.experiment!r} failed: "
            f"{why.removeprefix('error: ').strip()}"
        )
    said = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    return Path(said[-1]) if said and Path(said[-1]).exists() else job.out
