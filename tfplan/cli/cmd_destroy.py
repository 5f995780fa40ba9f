"""`tfplan destroy`: stop every task of an experiment (and its supervisor), clear the state."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace

from tfplan.backends.api import Backend, TaskPhase
from tfplan.cli.common import (
    add_experiment_arguments,
    add_target_argument,
    approved,
    backend_of,
    console,
    load_experiment,
    workspace_from,
)
from tfplan.engine.applier import release_if_idle, stop_standbys, stop_tasks
from tfplan.engine.background import (
    start_background_supervisor,
    stop_supervisor,
    supervisor_alive,
)
from tfplan.engine.store import StateStore
from tfplan.errors import ApplyError
from tfplan.planning.state import State, TaskRecord, TaskStatus, standby_name
from tfplan.planning.targets import resolve_targets

__all__ = ["add_parsers", "run_destroy"]

# A supervisor that has just ended the run still holds the lock while it writes the record.
LOCK_WAIT_SECS = 15.0


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    destroy = subparsers.add_parser("destroy", help="stop every task of an experiment")
    destroy.add_argument(
        "--auto-approve",
        "-auto-approve",
        action="store_true",
        help="do not ask (only asked on a terminal)",
    )
    add_experiment_arguments(destroy)
    add_target_argument(destroy, "stop")
    destroy.set_defaults(func=run_destroy)


def run_destroy(args: argparse.Namespace) -> int:
    store, state = load_experiment(args)
    if args.targets:
        return _destroy_targets(args, store, state)
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
    with store.lock("destroy", wait_secs=LOCK_WAIT_SECS), backend_of(store, state) as backend:
        state = store.load() or state
        state = stop_standbys(state, store, backend, say)
        state = stop_tasks(state, list(state.tasks), store, backend, say, forget=True)
        _check_gone(backend, running)
        _check_no_standby(state)
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


def _check_no_standby(state: State) -> None:
    if state.standbys:
        raise ApplyError(
            f"could not stop {', '.join(s.name for s in state.standbys)}; "
            "run `tfplan destroy` again"
        )


def _stop_lost(
    state: State,
    store: StateStore,
    backend: Backend,
    say: Callable[[str], None],
    only: frozenset[str] | None = None,
) -> list[TaskRecord]:
    """Stop the tasks left on hosts that were unreachable (those named in ``only``, when
    given); return those still out of reach."""
    chosen = [t for t in state.lost if only is None or t.name in only]
    if not chosen:
        return []
    results = backend.cancel(
        [replace(t, status=TaskStatus.RUNNING) for t in chosen], state.policy.stop_grace_secs
    )
    remaining = [t for t in state.lost if t not in chosen]
    unreachable = []
    for task in chosen:
        result = results.get(task.name)
        if isinstance(result, Exception):
            say(f"{task.name} on {task.host}: {result}")
            unreachable.append(task)
        else:
            say(f"Stopped {task.name} left on {task.host} ({backend.handle_text(task)})")
    store.write(replace(state, lost=(*remaining, *unreachable)))
    return unreachable


def _destroy_targets(args: argparse.Namespace, store: StateStore, state: State) -> int:
    """``destroy -target``: stop only the targeted tasks and forget them; the others run on,
    supervised again by a background supervisor when one was watching them."""
    names = resolve_targets(args.targets, [t.name for t in (*state.tasks, *state.lost)])
    running = [t for t in state.tasks if t.name in names and t.running]
    out = console()
    if running and not approved(
        out,
        f"tfplan will stop {len(running)} task(s) of experiment {state.experiment_id}: "
        f"{', '.join(t.name for t in running)}.",
        args.auto_approve or not _interactive(),
    ):
        out.print("Destroy cancelled.")
        return 1
    started = time.monotonic()
    say = lambda line: out.print(f"tfplan | {line}", highlight=False)  # noqa: E731
    watched = (
        state.supervisor is not None
        and state.supervisor.detached
        and supervisor_alive(state.supervisor)
    )
    if watched:
        stop_supervisor(state.supervisor, say)
    with store.lock("destroy", wait_secs=LOCK_WAIT_SECS), backend_of(store, state) as backend:
        state = store.load() or state
        state = stop_standbys(state, store, backend, say, {standby_name(n) for n in names})
        chosen = [t for t in state.tasks if t.name in names]
        state = stop_tasks(state, chosen, store, backend, say, forget=True)
        _check_gone(backend, [t for t in chosen if t.running])
        unreachable = _stop_lost(state, store, backend, say, only=names)
        state = release_if_idle(store.load() or state, store, backend, say)
    out.print(
        f"Destroy complete! {len(running)} targeted task(s) stopped, {len(state.running)} "
        f"left running ({time.monotonic() - started:.1f}s)."
    )
    if watched and state.running:
        log = store.folder / "supervisor.log"
        pid = start_background_supervisor(
            store, workspace_from(args.workspace).root, state.experiment_id, log
        )
        out.print(f"A background supervisor (pid {pid}) watches the other tasks again.")
    if unreachable:
        raise ApplyError(
            f"{len(unreachable)} targeted task(s) left on unreachable hosts "
            f"({', '.join(f'{t.name} on {t.host}' for t in unreachable)}): "
            "run `tfplan destroy -target ...` again once the host answers"
        )
    return 0
