"""`tfplan explain [TASK]`: why the experiment's failed tasks failed, and how to fix it.

Reads the state and the failed tasks' logs (any experiment of the workspace: ``-e`` names a
detached run or a sweep's point); a known failure is one line with its cause and fix
(tfplan/diagnosis/catalogue.py, docs/troubleshooting.md), an unknown one its exit status and the
last lines of its log. Below either, the innermost frames of the user's own files behind the
task's error (never TensorFlow's or tfplan's). An apply that failed before any task did (a
preflight, a launch) is told from the experiment's record, where the apply wrote its reason.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tfplan.cli.cmd_status import task_order
from tfplan.cli.common import (
    add_experiment_arguments,
    backend_of,
    console,
    load_experiment,
    workspace_from,
)
from tfplan.engine.diagnose import Diagnosis, diagnose
from tfplan.engine.experiment import ExperimentFolder, find_output
from tfplan.engine.runner import REFUSED_FILE, read_refusal
from tfplan.engine.store import StateStore
from tfplan.errors import StateError
from tfplan.planning.state import State, TaskStatus

# An unknown failure of the built-in recipes: what shows the rest (recipes/train.py ``_fail``
# prints the traceback under it; a local task inherits apply's environment, others need it set)
DEBUG_HINT = (
    "(TFPLAN_DEBUG=1 in tfplan apply's environment makes the tasks print their whole "
    "traceback; +recipe.env.TFPLAN_DEBUG=1 for tasks on other hosts)"
)

__all__ = ["add_parsers", "run_explain"]


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = subparsers.add_parser(
        "explain", help="why the failed tasks failed, and what to change"
    )
    explain.add_argument("task", nargs="?", help="one task, e.g. worker/1 (default: every failed)")
    explain.add_argument("--json", action="store_true", help="machine-readable, for scripts")
    add_experiment_arguments(explain)
    explain.set_defaults(func=run_explain)


def run_explain(args: argparse.Namespace) -> int:
    try:
        store, state = load_experiment(args)
    except StateError:
        refused = _refused_before_any_state(args)
        if refused is None:
            raise
        experiment, reason = refused
        _say_apply_failure(args, experiment, reason)
        return 0
    known = sorted([*state.tasks, *state.lost], key=task_order)
    if args.task is not None:
        chosen = [t for t in known if t.name == args.task]
        if not chosen:
            names = ", ".join(t.name for t in known)
            raise StateError(
                f"no task {args.task!r} in experiment {state.experiment_id}: choose one of {names}"
            )
    else:
        chosen = [t for t in known if t.status is TaskStatus.FAILED or t.never_listened]
    out = console()
    if not chosen:
        _say_apply_failure(args, state.experiment_id, _apply_failure(args, store, state))
        return 0
    with backend_of(store, state) as backend:
        found = [diagnose(backend, task, state.output_dir or "") for task in chosen]
    if args.json:
        print(json.dumps([_row(d) for d in found], indent=2))
        return 0
    for diagnosis in found:
        out.print(diagnosis.line, highlight=False, soft_wrap=True)
        if diagnosis.frames:
            out.print("  in your code (innermost last):", highlight=False)
            for frame in diagnosis.frames:
                out.print(f"    {frame}", highlight=False, soft_wrap=True)
        if diagnosis.explanation is None:
            for line in diagnosis.last_lines:
                out.print(f"  {diagnosis.task} | {line}", highlight=False, soft_wrap=True)
    if _builtin_recipes(state) and any(d.explanation is None for d in found):
        out.print(DEBUG_HINT, highlight=False, soft_wrap=True)
    return 0


def _row(d: Diagnosis) -> dict[str, Any]:
    return {
        "task": d.task,
        "host": d.host,
        "exit_code": d.exit_code,
        "known": d.explanation.id if d.explanation else None,
        "cause": d.explanation.cause if d.explanation else None,
        "fix": d.explanation.fix if d.explanation else None,
        "line": d.line,
        "error": d.error,
        "frames": list(d.frames),
        "last_lines": list(d.last_lines),
    }


def _say_apply_failure(args: argparse.Namespace, experiment: str, reason: str | None) -> None:
    """No task failed: say so, and why the last apply failed when it did."""
    line = f"No task of experiment {experiment} failed" + (
        f"; its last apply did: {reason}" if reason else "."
    )
    if args.json:
        print(json.dumps([_apply_row(line, reason)] if reason else [], indent=2))
    else:
        console().print(line, highlight=False, soft_wrap=True)


def _apply_row(line: str, reason: str) -> dict[str, Any]:
    """The row of an apply that failed before any task did: no task, the apply's reason."""
    return {
        "task": None,
        "host": None,
        "exit_code": None,
        "known": None,
        "cause": reason,
        "fix": None,
        "line": line,
        "error": None,
        "frames": [],
        "last_lines": [],
    }


def _apply_failure(args: argparse.Namespace, store: StateStore, state: State) -> str | None:
    """Why the experiment's last apply failed, when it did: a preflight, staging or launch
    that failed starts no task, so no task can tell it. An apply that began wrote its reason in
    the experiment's record (experiment.json, where the workspace's index says it is); one
    refused before it began (a host it could not reach while looking for output_dir) left it in
    the workspace (engine/runner.py ``record_refusal``). The later of the two counts."""
    last = _last_run(args, state)
    started = float(last.get("started_at") or 0) if last else 0.0
    refused = read_refusal(store.folder)
    if refused is not None and refused[0] >= started:
        return refused[1]
    if last is None or last.get("status") != "failed":
        return None
    return str(last.get("reason") or "") or None


def _last_run(args: argparse.Namespace, state: State) -> dict[str, Any] | None:
    try:
        _, folder = find_output(workspace_from(args.workspace), state.experiment_id)
    except StateError:
        where = state.record_dir or state.output_dir
        if not where:
            return None
        folder = Path(where)
    runs = (ExperimentFolder(folder).record() or {}).get("runs") or []
    last = runs[-1] if isinstance(runs, list) and runs else None
    return last if isinstance(last, dict) else None


def _refused_before_any_state(args: argparse.Namespace) -> tuple[str, str] | None:
    """(experiment, reason) of an apply refused before it wrote any state (its first apply),
    for the experiment named, or the only one refused in a workspace without states."""
    workspace = workspace_from(args.workspace)
    if args.experiment:
        candidates = [args.experiment]
    elif not workspace.experiments():
        candidates = sorted(p.parent.name for p in workspace.root.glob(f"*/{REFUSED_FILE}"))
    else:
        return None
    if len(candidates) != 1:
        return None
    refused = read_refusal(workspace.root / candidates[0])
    return (candidates[0], refused[1]) if refused is not None else None


def _builtin_recipes(state: State) -> bool:
    recipe = (state.config or {}).get("config", {}).get("recipe", {})
    return isinstance(recipe, dict) and recipe.get("kind") != "command"
