"""Refresh: bring the recorded state up to date with the processes that really run."""

from __future__ import annotations

from dataclasses import replace

from tfplan.hosts import HostPool
from tfplan.state import State, StateStore
from tfplan.supervisor import collect_status, ended_status

__all__ = ["refresh", "refreshed_state"]


def refresh(state: State, pool: HostPool) -> State:
    """``state`` with each running task's status checked on its host: ended tasks become
    succeeded/failed (by exit code), tasks on unreachable hosts become ``unreachable``."""
    infos = collect_status(state, pool)
    for task in state.tasks:
        if task.status != "running":
            continue
        info = infos.get(task.name)
        if isinstance(info, BaseException):
            state = state.with_task(replace(task, status="unreachable"))
            continue
        ended = ended_status(info)
        if ended is not None:
            state = state.with_task(replace(task, status=ended[0], exit_code=ended[1]))
    return state


def refreshed_state(store: StateStore) -> State | None:
    """The stored state, refreshed in memory (the file is not rewritten), or None."""
    state = store.load()
    if state is None or not any(t.status == "running" for t in state.tasks):
        return state
    with HostPool(state.hosts) as pool:
        return refresh(state, pool)
