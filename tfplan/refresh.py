"""Refresh: bring the recorded state up to date with the processes that really run."""

from __future__ import annotations

from tfplan.state import State, StateStore

__all__ = ["refreshed_state"]


def refreshed_state(store: StateStore) -> State | None:
    """The state with every task's status checked against its host (not yet: see applier)."""
    return store.load()
