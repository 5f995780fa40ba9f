"""Refresh: bring the recorded state up to date with what really runs (in memory only)."""

from __future__ import annotations

from dataclasses import replace

from tfplan.backends import open_backend
from tfplan.backends.api import Backend, TaskPhase
from tfplan.engine.store import StateStore
from tfplan.engine.supervisor import ended_status
from tfplan.planning.state import State, TaskStatus

__all__ = ["refresh", "refreshed_state"]


def refresh(state: State, backend: Backend) -> State:
    """``state`` with each running task observed: ended tasks become succeeded/failed (by exit
    code), tasks that cannot be observed become ``unreachable``."""
    running = state.running
    if not running:
        return state
    infos = backend.describe(running)
    for task in running:
        info = infos.get(task.name)
        if info is not None and info.phase is TaskPhase.UNREACHABLE:
            state = state.with_task(replace(task, status=TaskStatus.UNREACHABLE))
            continue
        ended = ended_status(info)
        if ended is not None:
            state = state.with_task(replace(task, status=ended[0], exit_code=ended[1]))
    return state


def refreshed_state(store: StateStore) -> State | None:
    """The stored state, refreshed in memory (the file is not rewritten), or None."""
    state = store.load()
    if state is None or state.backend is None or not state.running:
        return state
    with open_backend(state.backend, store.scratch) as backend:
        return refresh(state, backend)
