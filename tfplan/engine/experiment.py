"""An experiment's folder, its record, and whether applying it again resumes it.

Every run has an experiment id (``experiment.id``) and an output folder (``cluster.output_dir``,
by default ``outputs/<experiment id>``)::

    <output_dir>/
      checkpoint, model.ckpt-*          the chief's checkpoints (a new apply restores the last)
      events.out.tfevents.*             the chief's TensorBoard summaries
      result.json                       the chief's final figures
      eval/metrics.jsonl, eval/events*  the evaluator's, one line per checkpoint
      tfplan/
        experiment.json                 the id, and one entry per apply (resumed from, outcome)
        config.yaml                     the resolved config of the last apply
        plan.json                       the plan applied last
        state.json                      the state when the last apply ended
        logs/<role>-<index>.log         every task's log of the last apply

and the workspace remembers where that folder is (``tfplan tensorboard ID``, ``tfplan report``)::

    .tfplan/<experiment id>/output.json  {"kind": "experiment" | "sweep", "output_dir": ...}

Resume: the chief restores the last checkpoint in ``output_dir`` whenever the parameter servers
start uninitialised, so applying an existing id again continues from that checkpoint's step; a
new id has a new folder and starts fresh. tfplan never deletes a checkpoint. What it refuses
(before starting anything) is a folder whose checkpoints cannot be the ones meant: another
experiment's, or one made with another model, data shape or algorithm.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfplan.engine.workspace import Workspace
from tfplan.errors import ConfigError, StateError, TfplanError
from tfplan.files import read_json_object, write_atomic

if TYPE_CHECKING:
    from tfplan.backends.api import Backend
    from tfplan.planning.state import State

__all__ = [
    "RECORD_DIR",
    "ExperimentFolder",
    "checkpoint_step",
    "check_resumable",
    "find_output",
    "index_output",
]

RECORD_DIR = "tfplan"
_INDEX = "output.json"
_CKPT_LINE = re.compile(r'^model_checkpoint_path:\s*"([^"]+)"', re.MULTILINE)
_CKPT_STEP = re.compile(r"-(\d+)$")

# What the variables in a checkpoint depend on: restoring into another model, data shape,
# algorithm or optimizer fails inside TensorFlow, after the whole cluster has started.
_CHECKPOINT_KEYS = (
    ("model", None),
    ("data", ("name", "image_size", "channels", "num_classes")),
    ("algo", ("name", "optimizer", "ps_optimizer")),
)


def checkpoint_step(text: str) -> int | None:
    """The global step of the last checkpoint named in a TensorFlow ``checkpoint`` file."""
    match = _CKPT_LINE.search(text)
    if not match:
        return None
    step = _CKPT_STEP.search(match.group(1))
    return int(step.group(1)) if step else None


class ExperimentFolder:
    """The ``tfplan/`` record inside an experiment's output folder (on the launcher's side)."""

    def __init__(self, output_dir: str | Path) -> None:
        self.output_dir = Path(output_dir)
        self.root = self.output_dir / RECORD_DIR

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def record(self) -> dict[str, Any] | None:
        """experiment.json, or None when this folder has none yet."""
        return read_json_object(self.root / "experiment.json")

    def saved_plan(self) -> dict[str, Any] | None:
        return read_json_object(self.root / "plan.json")

    def begin(
        self, experiment_id: str, plan_json: str, config_yaml: str, resumed_from: int | None
    ) -> None:
        """Record the start of an apply: config, plan, and a new entry in experiment.json."""
        record = self.record() or {
            "id": experiment_id,
            "output_dir": str(self.output_dir),
            "runs": [],
        }
        record["id"] = experiment_id
        record.setdefault("runs", []).append(
            {
                "started_at": round(time.time(), 3),
                "resumed_from_step": resumed_from,
                "status": "running",
            }
        )
        write_atomic(self.root / "config.yaml", config_yaml)
        write_atomic(self.root / "plan.json", plan_json)
        write_atomic(self.root / "experiment.json", json.dumps(record, indent=2) + "\n")

    def end(self, status: str, reason: str, last_step: int | None, state_json: str | None) -> None:
        """Close the last entry of experiment.json; keep the final state beside it."""
        record = self.record()
        if record is None or not record.get("runs"):
            return
        run = record["runs"][-1]
        run.update(
            {
                "ended_at": round(time.time(), 3),
                "status": status,
                "reason": reason,
                "last_step": last_step,
            }
        )
        if state_json is not None:
            write_atomic(self.root / "state.json", state_json)
        write_atomic(self.root / "experiment.json", json.dumps(record, indent=2) + "\n")

    def log_of(self, task_name: str) -> Path:
        """Where the copy of a task's log is kept (``logs/<role>-<index>.log``)."""
        return self.logs / f"{task_name.replace('/', '-')}.log"

    def save_log(self, task_name: str, data: bytes) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        write_atomic(self.log_of(task_name), data)


def record_of(state: State) -> ExperimentFolder:
    """The experiment's record on the launcher's side (the workspace's copy where the
    launcher does not see ``output_dir``)."""
    return ExperimentFolder(state.record_dir or state.output_dir)


def keep_logs(state: State, backend: Backend, folder: ExperimentFolder | None = None) -> int:
    """Copy each task's log into the experiment's record (``tfplan/logs/``), where `tfplan
    logs` still finds it once the task's host is gone: an allocation given back takes its
    hosts with it (a Spark application's executors, a pod). How many were kept; a log that
    cannot be read is left out (its earlier copy, if any, stays). ``folder``: the record's
    folder when the caller holds it (default: :func:`record_of`)."""
    folder = folder or record_of(state)
    kept = 0
    for task in state.tasks:
        try:
            folder.save_log(task.name, backend.read_log(task))
        except (TfplanError, OSError):
            continue
        kept += 1
    return kept


def check_resumable(
    folder: ExperimentFolder, experiment_id: str, run_config: dict[str, Any], step: int
) -> None:
    """Refuse to resume from checkpoints that belong to something else.

    Args:
        folder: the output folder holding a checkpoint at ``step``.
        experiment_id: the experiment being applied.
        run_config: the plan's run config (model, data, algo as the tasks will read them).
        step: the checkpoint's global step (for the message).

    Raises:
        ConfigError: the folder's checkpoints are another experiment's, or were made with another
            model, data shape or algorithm.
    """
    record = folder.record()
    if record is not None and record.get("id") not in (None, experiment_id):
        raise ConfigError(
            "cluster.output_dir",
            f"{folder.output_dir} holds the checkpoints (step {step}) of experiment "
            f"{record['id']!r}",
            f"resume it with experiment.id={record['id']}, or give this experiment its own "
            "cluster.output_dir (tfplan never deletes checkpoints)",
        )
    saved = (folder.saved_plan() or {}).get("run_config")
    if not isinstance(saved, dict):
        return
    for section, keys in _CHECKPOINT_KEYS:
        before, now = saved.get(section) or {}, run_config.get(section) or {}
        for key in keys or sorted(set(before) | set(now)):
            if before.get(key) != now.get(key):
                raise ConfigError(
                    "experiment.id",
                    f"experiment {experiment_id!r} has checkpoints (step {step}) made with "
                    f"{section}.{key}={before.get(key)!r}, not {now.get(key)!r}",
                    "use a new experiment.id to start fresh, or set it back to resume",
                )


def index_output(workspace: Workspace, key: str, output_dir: str, kind: str) -> None:
    """Remember in the workspace where experiment (or sweep) ``key`` keeps its folder."""
    data = {"kind": kind, "id": key, "output_dir": output_dir, "updated_at": round(time.time(), 3)}
    write_atomic(workspace.root / key / _INDEX, json.dumps(data, indent=2) + "\n")


def find_output(workspace: Workspace, key: str | None) -> tuple[str, Path]:
    """(kind, folder) of an experiment or sweep id; with no id, the latest one applied.

    Raises:
        StateError: no such id in the workspace (the message lists the known ones).
    """
    entries = []
    for path in workspace.root.glob(f"*/{_INDEX}") if workspace.root.is_dir() else []:
        data = read_json_object(path)
        if data is not None:
            entries.append(data)
    if key is not None:
        for data in entries:
            if data.get("id") == key:
                return str(data["kind"]), Path(data["output_dir"])
        known = ", ".join(sorted(str(d.get("id")) for d in entries)) or "none yet"
        raise StateError(
            f"no experiment or sweep {key!r} in {workspace.root} (known: {known}); "
            "give its id or its folder"
        )
    if not entries:
        raise StateError(
            f"nothing has been applied from {workspace.root}: run `tfplan apply` "
            "first, or give a folder"
        )
    latest = max(entries, key=lambda d: float(d.get("updated_at") or 0))
    return str(latest["kind"]), Path(latest["output_dir"])
