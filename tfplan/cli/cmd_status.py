"""`tfplan status [--json]`: every task of an experiment as it is now."""

from __future__ import annotations

import argparse
import json
import posixpath
import time
from dataclasses import replace
from typing import Any

from rich.table import Table

from recipes.snapshot_paths import RECOVERIES_FILE
from tfplan.backends.api import Backend, TaskInfo, TaskPhase
from tfplan.cli.common import add_experiment_arguments, backend_of, console, load_experiment
from tfplan.cli.output import recoveries_line
from tfplan.engine.diagnose import diagnose, diagnose_output, oom_of
from tfplan.engine.lognoise import is_noise
from tfplan.engine.logs import STEP_PATTERN
from tfplan.planning.memory import limit_text
from tfplan.planning.plan import ROLE_ORDER
from tfplan.planning.state import State, TaskRecord, standby_task

__all__ = ["add_parsers", "run_status", "task_order"]

_TAIL_BYTES = 8192


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = subparsers.add_parser(
        "status",
        help="every task: host, handle, state, CPU, memory, step; its standby; the supervisor",
    )
    status.add_argument("--json", action="store_true", help="machine-readable, for scripts")
    add_experiment_arguments(status)
    status.set_defaults(func=run_status)


def task_order(task: TaskRecord) -> tuple[int, int]:
    role = ROLE_ORDER.index(task.role) if task.role in ROLE_ORDER else len(ROLE_ORDER)
    return role, task.index


def run_status(args: argparse.Namespace) -> int:
    store, state = load_experiment(args)
    with backend_of(store, state) as backend:
        observed = [*state.running, *state.standbys]
        infos = backend.describe(observed) if observed else {}
        tails = backend.read_log_tails([*state.tasks, *state.standbys], _TAIL_BYTES)
        rows = [
            _row(backend, task, infos.get(task.name), tails.get(task.name))
            for task in sorted(state.tasks, key=task_order)
        ]
        for row, task in zip(rows, sorted(state.tasks, key=task_order), strict=True):
            row.update(_diagnosis(backend, task, row, tails.get(task.name), state))
        standbys = [
            _row(backend, standby, infos.get(standby.name), tails.get(standby.name), True)
            for standby in sorted(state.standbys, key=task_order)
        ]
        held = backend.allocation_text(state.allocation) if state.allocation else None
        recoveries = _recoveries(backend, state)
    supervisor = _supervisor(state)
    if args.json:
        data = {
            "experiment": state.experiment_id,
            "cluster": state.cluster_name,
            "backend": state.backend.name if state.backend else None,
            "serial": state.serial,
            "allocation": state.allocation.to_dict() if state.allocation else None,
            "supervisor": supervisor,
            "tasks": rows,
            "standbys": standbys,
            "lost": [t.to_dict() for t in state.lost],
            "ps_recoveries": recoveries,
        }
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    out = console()
    title = (
        f"experiment {state.experiment_id} · cluster {state.cluster_name} · "
        f"{state.backend.name if state.backend else '?'} · serial {state.serial}"
    )
    table = Table(title=title)
    for column in (
        "task",
        "host",
        "handle",
        "state",
        "uptime",
        "cpu %",
        "rss",
        "step",
        "last line",
    ):
        table.add_column(column, overflow="fold")
    by_task = {standby_task(row["task"]): row for row in standbys}
    shown = []
    for row in rows:
        shown.append(row)
        if row["task"] in by_task:
            shown.append(by_task.pop(row["task"]))
    for row in shown + list(by_task.values()):
        restarts = f" ↻{row['restarts']}" if row["restarts"] and not row["standby"] else ""
        table.add_row(
            row["task"],
            row["host"],
            row["handle_text"],
            row["state"] + restarts,
            f"{row['uptime_secs']:.0f}s" if row["uptime_secs"] is not None else "",
            f"{row['cpu_percent']:.0f}" if row["cpu_percent"] is not None else "",
            _rss_text(row),
            str(row["step"]) if row["step"] is not None else "",
            row.get("explanation") or row["last_line"],
        )
    out.print(table)
    for line in _frame_lines(rows):
        out.print(line, highlight=False, soft_wrap=True)
    running = any(row["state"] in _RUNNING for row in rows)
    out.print(_supervisor_line(supervisor, running))
    if held:
        out.print(f"allocation: {held}")
    recovered = recoveries_line(recoveries)
    if recovered:
        out.print(recovered, highlight=False, soft_wrap=True)
    return 0


def _recoveries(backend: Backend, state: State) -> list[dict[str, Any]]:
    """Each ps recovery the chief made (``output_dir/ps_recoveries.jsonl``, appended as it
    restores a ps: docs/contract.md), read where the chief wrote it; only once a ps has come
    back (restarted, or its host lost), as nothing else makes one: a read is a round trip, a
    pod of its own on Kubernetes."""
    if not state.output_dir or not (
        state.lost or any(t.role == "ps" and t.restarts for t in state.tasks)
    ):
        return []
    chief = next((t for t in state.tasks if t.is_chief), None)
    data = backend.read_file(
        posixpath.join(state.output_dir, RECOVERIES_FILE), chief.host if chief else None
    )
    found = []
    for line in (data or b"").decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(record, dict):
            found.append(record)
    return found


def _row(
    backend: Backend,
    task: TaskRecord,
    info: TaskInfo | None,
    tail: bytes | Exception | None,
    standby: bool = False,
) -> dict[str, Any]:
    """One task (or a warm standby: state ``standby`` while it waits) as status shows it."""
    status, exit_code = task.status.value, task.exit_code
    cpu = rss = None
    if info is not None:
        if info.phase is TaskPhase.RUNNING:
            cpu, rss = info.cpu_percent, info.rss_bytes
            if standby:
                status = "standby"
        elif info.phase is TaskPhase.PENDING:
            status = "pending"
        elif info.phase is TaskPhase.UNREACHABLE:
            status = "unreachable"
        else:
            status, exit_code = info.phase.value, info.exit_code
    step, last = _tail(tail)
    if standby:
        step = None
    return {
        "task": task.name,
        "role": task.role,
        "index": task.index,
        "host": task.host,
        "address": task.address,
        "port": task.port,
        "handle": task.handle,
        "handle_text": backend.handle_text(task),
        "state": status,
        "exit_code": exit_code,
        "restarts": task.restarts,
        "started_at": task.started_at,
        "uptime_secs": (
            time.time() - task.started_at if status in ("running", "standby") else None
        ),
        "cpu_percent": cpu,
        "rss_bytes": rss,
        "memory_limit": task.memory_limit,  # its cgroup's (cluster.memory); None: none of its own
        "step": step,
        "last_line": last,
        "detail": (info.detail or info.error or "") if info is not None else "",
        "standby": standby,
    }


def _rss_text(row: dict[str, Any]) -> str:
    """``300 MiB``, and ``of 1.0 GiB`` for a task with a memory limit of its own."""
    limit = f"of {limit_text(row['memory_limit'])}" if row.get("memory_limit") else ""
    rss = f"{row['rss_bytes'] / 2**20:.0f} MiB" if row["rss_bytes"] is not None else ""
    return " ".join(part for part in (rss, limit) if part)


def _diagnosis(
    backend: Backend,
    task: TaskRecord,
    row: dict[str, Any],
    tail: bytes | Exception | None,
    state: State,
) -> dict[str, Any]:
    """``explanation``: why a failed task failed (or why one that ended never joined the
    cluster), in one line, when the cause is a known one or its log says its error; else "".
    ``frames``: the innermost frames of the user's own files behind that error."""
    if row["state"] != "failed" and not task.never_listened:
        return {"explanation": "", "frames": []}
    record = replace(task, exit_code=row["exit_code"])
    if isinstance(tail, bytes):
        found = diagnose_output(
            record,
            tail.decode(errors="replace"),
            state.output_dir or "",
            oom_of(backend, record),
            backend,
        )
    else:
        found = diagnose(backend, record, state.output_dir or "")
    said = found.explanation is not None or found.error is not None
    return {"explanation": found.line if said else "", "frames": list(found.frames)}


def _frame_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Under the table: each failed task's frames of the user's own code (the table's cell
    holds one line)."""
    lines = []
    for row in rows:
        if row.get("frames"):
            lines.append(f"{row['task']}: in your code (innermost last):")
            lines += [f"  {frame}" for frame in row["frames"]]
    return lines


def _tail(data: bytes | Exception | None) -> tuple[int | None, str]:
    """(last global step seen, last line) of the task's log; TensorFlow's start-up messages
    are never its last line (a task that has just imported TensorFlow shows what it printed
    before them)."""
    if data is None or isinstance(data, Exception):
        return None, "(log unreadable)"
    lines = [
        line
        for line in data.decode(errors="replace").splitlines()
        if line.strip() and not is_noise(line)
    ]
    steps = [int(m.group(1)) for line in lines if (m := STEP_PATTERN.search(line))]
    last = lines[-1] if lines else ""
    return (steps[-1] if steps else None), (last if len(last) <= 80 else last[:77] + "...")


def _supervisor(state: State) -> dict[str, Any] | None:
    from tfplan.engine.background import supervisor_status

    return supervisor_status(state)


# a task in these states may still need a supervisor
_RUNNING = ("running", "pending", "unreachable")


def _supervisor_line(info: dict[str, Any] | None, running: bool = True) -> str:
    """Who supervises the tasks; ``running``: whether any task may still run (with none, there
    is nothing to watch: the line says so instead of asking for ``tfplan watch``)."""
    if info is None:
        if not running:
            return "supervisor: none (no task is running)"
        return "supervisor: none (run `tfplan watch` to supervise the running tasks)"
    kind = "background" if info["detached"] else "attached"
    if info["alive"]:
        return f"supervisor: {kind}, pid {info['pid']} on {info['host']}"
    if not running:
        return (
            f"supervisor: {kind} pid {info['pid']} on {info['host']} has ended (no task is running)"
        )
    return (
        f"supervisor: {kind} pid {info['pid']} on {info['host']} is GONE: "
        "run `tfplan watch` to take over"
    )
