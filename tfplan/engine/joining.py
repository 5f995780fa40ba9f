"""Did each task of a user's program join the cluster? Its planned port, listened on or not.

A program started with TF_CONFIG that never reads it trains alone, in every task: nothing fails,
the parameter servers end by themselves, and the job looks like it worked. From outside, the one
sure sign is that the task never listened on the port the plan gave it (every TensorFlow server
of the cluster does, ps and workers alike). :class:`JoinWatch` looks, once per host every
:data:`LOOK_EVERY_SECS`, at the tasks that have not been seen listening yet, and stops looking
once all have; a task is judged only when no task of the job was ever seen listening.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from tfplan.backends.api import Backend
from tfplan.errors import TfplanError
from tfplan.planning.state import TaskRecord

__all__ = ["LOOK_EVERY_SECS", "JoinWatch"]

LOOK_EVERY_SECS = 1.0


class JoinWatch:
    """Which tasks were seen listening on their port, and which were looked at while running.

    A look runs on a helper thread: a host slow to answer never holds up the supervisor's loop
    (a look still in flight is not doubled)."""

    def __init__(self, backend: Backend, enabled: bool) -> None:
        self.backend = backend
        self.enabled = enabled
        self.listened: set[str] = set()
        self.looked_at: set[str] = set()
        self._last = 0.0
        self._lock = threading.Lock()
        self._in_flight: threading.Thread | None = None

    def look(self, running: Sequence[TaskRecord]) -> None:
        """Start one look per host at the running tasks not yet seen listening (at most every
        :data:`LOOK_EVERY_SECS`); a backend that cannot tell turns the watch off."""
        if not self.enabled or time.monotonic() - self._last < LOOK_EVERY_SECS:
            return
        if self._in_flight is not None and self._in_flight.is_alive():
            return
        with self._lock:
            pending = [t for t in running if t.port is not None and t.name not in self.listened]
        if not pending:
            return
        self._last = time.monotonic()
        self._in_flight = threading.Thread(
            target=self._look, args=(pending,), name="join-watch", daemon=True
        )
        self._in_flight.start()

    def _look(self, pending: list[TaskRecord]) -> None:
        try:
            seen = self.backend.listening(pending)
        except TfplanError:
            return
        if seen is None:
            self.enabled = False
            return
        with self._lock:
            self.listened |= seen
            self.looked_at.update(t.name for t in pending)

    def never_listened(self, task: TaskRecord) -> bool:
        """True for a task that was looked at while it ran, when no task of the job has ever
        been seen on its port. A program that ignores TF_CONFIG does so in every task; one
        that reads it has its parameter servers listening all along, so one task seen is
        enough to judge none (a short-lived task can end between two looks)."""
        with self._lock:
            return task.name in self.looked_at and not self.listened
