"""`tfplan destroy`: stop every task of an experiment (and its supervisor), clear the state."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace

from tfplan.backends.api import Backend, TaskPhase
from tfplan.cli.common import (
    add_experiment_arguments,
    approved,
    backend_of,
    console,
    load_experiment,
)
from tfplan.engine.applier import release_if_idle, stop_tasks
from tfplan.engine.background import stop_supervisor
from tfplan.engine.store import StateStore
from tfplan.errors import ApplyError
from tfplan.planning.state import State, TaskRecord, TaskStatus

__all__ = ["add_parsers", "run_destroy"]


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    destroy = subparsers.add_parser("destroy", help="stop every task of an experiment")
    destroy.add_argument(
        "--auto-approve",
        "-auto-approve",
        action="store_true",
        help="do not ask (only asked on a terminal)",
    )
    add_experiment_arguments(destroy)
    destroy.set_defaults(func=run_destroy)


def run_destroy(args: argparse.Namespace) -> int:
    store, state = load_experiment(args)
    out = console()
    running = state.running
    if running and not approved(
        out,
        f"tfplan will stop {len(running)} task(s) of experiment {state.experiment_id}.",
        args.auto_approve or not _interactive(),
    ):
        out.print("Destroy cancelled.")
        return 1
    started = time.monotonic()
    say = lambda line: out.print(f"tfplan | {line}", highlight=False)  # noqa: E731
    if state.supervisor is not None and state.supervisor.detached:
        stop_supervisor(state.supervisor, say)  # else an attached apply holds the lock: refused
    with store.lock("destroy"), backend_of(store, state) as backend:
        state = store.load() or state
        state = stop_tasks(state, list(state.tasks), store, backend, say, forget=True)
        _check_gone(backend, running)
        unreachable = _stop_lost(state, store, backend, say)
        state = release_if_idle(store.load() or state, store, backend, say)
        store.write(replace(state, supervisor=None))
        if unreachable:
            raise ApplyError(
                f"{len(unreachable)} task(s) left on unreachable hosts "
                f"({', '.join(f'{t.name} on {t.host}' for t in unreachable)}): "
                "run `tfplan destroy` again once the host answers"
            )
    out.print(
        f"Destroy complete! {len(running)} task(s) stopped, state cleared "
        f"({time.monotonic() - started:.1f}s)."
    )
    return 0


def _interactive() -> bool:
    import sys

    return sys.stdin.isatty()


def _check_gone(backend: Backend, tasks: list[TaskRecord]) -> None:
    if not tasks:
        return
    infos = backend.describe([replace(t, status=TaskStatus.RUNNING) for t in tasks])
    left = [name for name, info in infos.items() if info.phase is TaskPhase.RUNNING]
    if left:
        raise ApplyError(
            f"still running after destroy: {', '.join(left)}; run `tfplan destroy` again"
        )


def _stop_lost(
    state: State, store: StateStore, backend: Backend, say: Callable[[str], None]
) -> list[TaskRecord]:
    """Stop the tasks left on hosts that were unreachable; return those still out of reach."""
    if not state.lost:
        return []
    results = backend.cancel(
        [replace(t, status=TaskStatus.RUNNING) for t in state.lost], state.policy.stop_grace_secs
    )
    remaining = []
    for task in state.lost:
        result = results.get(task.name)
        if isinstance(result, Exception):
            say(f"{task.name} on {task.host}: {result}")
            remaining.append(task)
        else:
            say(f"Stopped {task.name} left on {task.host} ({backend.handle_text(task)})")
    store.write(replace(state, lost=tuple(remaining)))
    return remaining
