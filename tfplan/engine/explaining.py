"""Explain failed tasks while the supervisor goes on: the evidence is read on a helper thread.

A task that fails is explained as soon as it is seen: its log's end (and, for a killed task, its
host's out-of-memory record) is read and matched against the known failures
(:mod:`tfplan.engine.diagnose`); a known one is said in one line, cause and fix, right after the
task's own last lines. Reading it may take a round trip to a slow host: a restart due meanwhile
does not wait for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait

from tfplan.backends.api import Backend
from tfplan.engine.diagnose import Diagnosis, diagnose
from tfplan.planning.state import TaskRecord

__all__ = ["EXPLAIN_WAIT_SECS", "Explainer"]

EXPLAIN_WAIT_SECS = 5.0  # at the end, how long the explanations still being read may take


class Explainer:
    """Failed tasks' explanations, read in the background and said on the caller's thread.

    Args:
        backend: what ran the tasks (their logs and hosts are read through it).
        say: receives each explanation's line.
        wake: set when an explanation is ready (the supervisor's loop waits on it).
    """

    def __init__(self, backend: Backend, say: Callable[[str], None], wake: threading.Event) -> None:
        self.backend = backend
        self._say = say
        self._wake = wake
        self._pool: ThreadPoolExecutor | None = None  # started with the first failure
        self._reading: list[Future[Diagnosis]] = []

    def later(self, task: TaskRecord, output_dir: str) -> None:
        """Read the failed task's evidence on a helper thread (a restart due meanwhile is not
        delayed); :meth:`say_ready` says the explanation as soon as it is there."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="explain")

        def work() -> Diagnosis:
            try:
                return diagnose(self.backend, task, output_dir)
            finally:
                self._wake.set()  # wake the loop to say it

        self._reading.append(self._pool.submit(work))

    def say_ready(self, wait: float = 0.0) -> None:
        """Say the explanations read so far (waiting at most ``wait`` seconds for the others);
        a failure that is not known is not said."""
        if wait and self._reading:
            futures_wait(self._reading, timeout=wait)
        for future in [f for f in self._reading if f.done()]:
            self._reading.remove(future)
            try:
                diagnosis = future.result()
            except Exception:  # noqa: BLE001 - an explanation must never break supervision
                continue
            if diagnosis.explanation is not None:
                self._say(diagnosis.line)

    def close(self) -> None:
        """The end of supervision: say what is read within :data:`EXPLAIN_WAIT_SECS`, and let
        the rest go."""
        self.say_ready(wait=EXPLAIN_WAIT_SECS)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
