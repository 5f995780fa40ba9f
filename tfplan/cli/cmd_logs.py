"""`tfplan logs [TASK] [-f] [-n N]`: print (or follow) the tasks' logs, prefixed by task."""

from __future__ import annotations

import argparse
import time

from tfplan.backends.api import Backend
from tfplan.cli.cmd_status import task_order
from tfplan.cli.common import (
    add_experiment_arguments,
    backend_of,
    console,
    err_console,
    load_experiment,
)
from tfplan.cli.output import LogPrinter, add_all_lines_argument
from tfplan.engine.experiment import record_of
from tfplan.engine.lognoise import shows_tf_noise
from tfplan.engine.logs import LogFanIn
from tfplan.errors import StateError, TfplanError
from tfplan.planning.state import State, TaskRecord

__all__ = ["add_parsers", "run_logs"]

POLL_SECS = 0.3


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    logs = subparsers.add_parser("logs", help="print (or follow) the tasks' logs")
    logs.add_argument("task", nargs="?", help="one task, e.g. worker/1 (default: all)")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the tasks end")
    logs.add_argument("-n", "--lines", type=int, default=0, help="only the last N lines per task")
    add_all_lines_argument(logs)
    add_experiment_arguments(logs)
    logs.set_defaults(func=run_logs)


def run_logs(args: argparse.Namespace) -> int:
    store, state = load_experiment(args)
    tasks = [t for t in sorted(state.tasks, key=task_order) if args.task in (None, t.name)]
    if not tasks:
        names = ", ".join(t.name for t in state.tasks)
        raise StateError(
            f"no task {args.task!r} in experiment {state.experiment_id}: choose one of {names}"
        )
    printer = LogPrinter(console(), args.all_lines or shows_tf_noise(state.config))
    with backend_of(store, state) as backend:
        if args.follow and any(t.running for t in tasks):
            follow(backend, tasks, printer)
            return 0
        for task in tasks:
            lines = read_log(backend, state, task).decode(errors="replace").splitlines()
            printer.emit_log(task.name, lines, args.lines)
    return 0


def read_log(backend: Backend, state: State, task: TaskRecord) -> bytes:
    """The task's log from its host, or, for a task that has ended where its host cannot be
    read any more (an allocation given back: a Spark application's executors, a pod), the copy
    kept in the experiment's record (``tfplan/logs/``), said on stderr."""
    try:
        return backend.read_log(task)
    except TfplanError as error:
        kept = record_of(state).log_of(task.name)
        if task.running or not kept.is_file():
            raise
        err_console().print(
            f"tfplan | {task.name}: its host cannot be read ({error}); the copy kept at its "
            f"end: {kept}",
            highlight=False,
        )
        return kept.read_bytes()


def follow(backend: Backend, tasks: list[TaskRecord], printer: LogPrinter) -> None:
    """Stream the tasks' logs until every one of them has ended (or Ctrl-C)."""
    fan_in = LogFanIn(backend, printer.emit)
    running = [t for t in tasks if t.running]
    for task in running:
        fan_in.follow(task)
    try:
        while True:
            fan_in.drain()
            infos = backend.describe(running)
            if all(info.phase.ended for info in infos.values()) and not fan_in.streaming:
                break
            time.sleep(POLL_SECS)
    except KeyboardInterrupt:
        pass
    finally:
        fan_in.stop_all()
        fan_in.drain()
