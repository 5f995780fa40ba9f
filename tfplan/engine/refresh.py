"""Refresh: bring the recorded state up to date with what really runs (in memory only)."""

from __future__ import annotations

from dataclasses import replace

from tfplan.backends import open_backend
from tfplan.backends.api import Backend, TaskInfo, TaskPhase
from tfplan.engine.store import StateStore
from tfplan.engine.supervisor import ended_status
from tfplan.planning.state import State, TaskStatus

__all__ = ["LOOKS", "refresh", "refreshed_state"]

LOOKS = 3  # a host that does not answer is asked again before its tasks count as unreachable


def refresh(state: State, backend: Backend) -> State:
    """``state`` with each running task observed: ended tasks become succeeded/failed (by exit
    code), tasks that cannot be observed become ``unreachable``.

    A task is unreachable only after :data:`LOOKS` looks: one slow answer of a busy host (the
    status read is kept short for the supervisor) must not make a plan restart its tasks."""
    running = state.running
    if not running:
        return state
    infos = dict(backend.describe(running))
    for _ in range(LOOKS - 1):
        silent = [t for t in running if _unreachable(infos.get(t.name))]
        if not silent:
            break
        infos.update(backend.describe(silent))
    for task in running:
        info = infos.get(task.name)
        if _unreachable(info):
            state = state.with_task(replace(task, status=TaskStatus.UNREACHABLE))
            continue
        ended = ended_status(info)
        if ended is not None:
            state = state.with_task(replace(task, status=ended[0], exit_code=ended[1]))
    return state


def _unreachable(info: TaskInfo | None) -> bool:
    return info is not None and info.phase is TaskPhase.UNREACHABLE


def refreshed_state(store: StateStore) -> State | None:
    """The stored state, refreshed in memory (the file is not rewritten), or None."""
    state = store.load()
    if state is None or state.backend is None or not state.running:
        return state
    with open_backend(state.backend, store.scratch) as backend:
        return refresh(state, backend)
