"""Fan-in of many tasks' logs: one stream per task into one queue, drained on the caller's thread.

Used by the supervisor (every task, for as long as the job runs) and by ``tfplan logs -f``
(the chosen tasks, until they end). Lines come out as ``(task name, line)`` in arrival order;
the last global step seen (``step=N``) and when each task last printed are tracked.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable

from tfplan.backends.api import Backend, LogStream
from tfplan.errors import TfplanError
from tfplan.planning.state import TaskRecord

__all__ = ["STEP_PATTERN", "Emit", "LogFanIn"]

STEP_PATTERN = re.compile(r"\bstep=(\d+)")

Emit = Callable[[str, str], None]  # (task name, line)


class LogFanIn:
    """Follows tasks' logs through a backend and hands their lines to ``emit``."""

    def __init__(
        self, backend: Backend, emit: Emit, on_step: Callable[[int], None] | None = None
    ) -> None:
        self.backend = backend
        self.emit = emit
        self.on_step = on_step or (lambda step: None)
        self.last_step: int | None = None
        self.step_lines = 0  # progress lines (step=N) seen, whatever their step
        self.last_line: dict[str, float] = {}  # task -> monotonic time of its last line
        self._lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self._streams: dict[str, LogStream] = {}
        # set when a followed stream ends, which it does once its task's process is gone: the
        # supervisor wakes on it instead of waiting for its next poll
        self.ended = threading.Event()

    def follow(self, task: TaskRecord) -> None:
        """Stream ``task``'s log (a stream it had before is stopped first)."""
        self.last_line.pop(task.name, None)
        self.stop(task.name)

        def on_line(line: str, name: str = task.name) -> None:
            self._lines.put((name, line))

        try:
            stream = self.backend.stream_log(task, on_line)
            self._streams[task.name] = stream
            stream.add_done_callback(self.ended.set)
        except TfplanError as error:
            self.emit("tfplan", f"{task.name}: cannot stream its log ({error})")

    def stop(self, name: str) -> None:
        stream = self._streams.pop(name, None)
        if stream is not None:
            stream.stop()

    def finish(self, name: str, timeout: float) -> None:
        """Let ``name``'s stream deliver the last lines of a life that has ended (it ends by
        itself once the process is gone), then stop it; at most ``timeout`` seconds."""
        stream = self._streams.pop(name, None)
        if stream is not None:
            stream.join(timeout)
            stream.stop()

    def wait_ended(self, names: list[str], timeout: float) -> None:
        """Wait until the streams of ``names`` (tasks whose processes are gone) have ended,
        which they do once they have delivered their last lines; at most ``timeout`` seconds
        in all. The streams are kept (:meth:`stop_all` ends what is left)."""
        deadline = time.monotonic() + timeout
        for name in names:
            stream = self._streams.get(name)
            if stream is not None:
                stream.join(max(0.0, deadline - time.monotonic()))

    def stop_all(self) -> None:
        for name in list(self._streams):
            try:
                self.stop(name)
            except Exception:  # noqa: BLE001 - a stream that fails to stop must not mask the outcome
                pass

    @property
    def streaming(self) -> bool:
        return any(not s.done for s in self._streams.values())

    def drain(self) -> None:
        """Hand every line that arrived to ``emit``, in order; track steps and liveness."""
        now = time.monotonic()
        while True:
            try:
                name, line = self._lines.get_nowait()
            except queue.Empty:
                return
            self.last_line[name] = now
            match = STEP_PATTERN.search(line)
            if match:
                self.step_lines += 1
                step = int(match.group(1))
                if self.last_step is None or step > self.last_step:
                    self.last_step = step
                    self.on_step(step)
            self.emit(name, line)
