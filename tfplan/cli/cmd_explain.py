"""`tfplan explain [TASK]`: why the experiment's failed tasks failed, and how to fix it.

Reads the state and the failed tasks' logs (any experiment of the workspace: ``-e`` names a
detached run or a sweep's point); a known failure is one line with its cause and fix
(tfplan/diagnosis/catalogue.py, docs/troubleshooting.md), an unknown one its exit status and the
last lines of its log.
"""

from __future__ import annotations

import argparse
import json

from tfplan.cli.cmd_status import task_order
from tfplan.cli.common import add_experiment_arguments, backend_of, console, load_experiment
from tfplan.engine.diagnose import diagnose
from tfplan.errors import StateError
from tfplan.planning.state import TaskStatus

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
    store, state = load_experiment(args)
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
        if args.json:
            print("[]")
        else:
            out.print(f"No task of experiment {state.experiment_id} failed.")
        return 0
    with backend_of(store, state) as backend:
        found = [diagnose(backend, task, state.output_dir or "") for task in chosen]
    if args.json:
        rows = [
            {
                "task": d.task,
                "host": d.host,
                "exit_code": d.exit_code,
                "known": d.explanation.id if d.explanation else None,
                "cause": d.explanation.cause if d.explanation else None,
                "fix": d.explanation.fix if d.explanation else None,
                "line": d.line,
                "last_lines": list(d.last_lines),
            }
            for d in found
        ]
        print(json.dumps(rows, indent=2))
        return 0
    for diagnosis in found:
        out.print(diagnosis.line, highlight=False, soft_wrap=True)
        if diagnosis.explanation is None:
            for line in diagnosis.last_lines:
                out.print(f"  {diagnosis.task} | {line}", highlight=False, soft_wrap=True)
    return 0
