"""A followed log: whole lines to a callback, in order, until its task is gone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

__all__ = ["LogStream", "ThreadLogStream"]


class LogStream(Protocol):
    """What a backend's ``stream_log`` returns: a thread of its own
    (:class:`ThreadLogStream`) or a share of a host's watcher
    (:class:`~tfplan.backends.transports.hostwatch.WatchedStream`)."""

    error: BaseException | None
    lines: int

    @property
    def done(self) -> bool: ...

    def add_done_callback(self, callback: Callable[[], None]) -> None: ...

    def join(self, timeout: float | None = None) -> bool: ...

    def stop(self, timeout: float = 2.0) -> None: ...


class ThreadLogStream:
    """A thread delivering whole lines of a followed log to ``on_line``, in order.

    Ends by itself once the task is dead and the log fully read; :meth:`stop` ends it early.
    An exception raised by ``on_line`` ends the stream and is kept in :attr:`error`.
    """

    def __init__(
        self,
        name: str,
        read_chunk: Callable[[], bytes],
        end_input: Callable[[], None],
        force_close: Callable[[], None],
        on_line: Callable[[str], None],
    ) -> None:
        self._read_chunk = read_chunk
        self._end_input = end_input
        self._force_close = force_close
        self._on_line = on_line
        self.error: BaseException | None = None
        self.lines = 0
        self._lock = threading.Lock()
        self._ended = False
        self._callbacks: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._pump, name=f"log:{name}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self._read_chunk()
                if not chunk:
                    break
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    self._deliver(raw)
            if buffer:  # the task ended without a final newline: its last line is whole now
                self._deliver(buffer)
        except BaseException as exc:  # noqa: BLE001 - kept for the caller, the thread must end
            self.error = exc
        finally:
            self._end_input()
            self._force_close()
            with self._lock:
                self._ended = True
                callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                callback()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the stream's thread) once the stream has ended: the task is
        gone (or the stream was stopped); at once when it has ended already."""
        with self._lock:
            if not self._ended:
                self._callbacks.append(callback)
                return
        callback()

    def _deliver(self, raw: bytes) -> None:
        self.lines += 1
        self._on_line(raw.decode(errors="replace").rstrip("\r"))

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the stream to end; True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 2.0) -> None:
        """End the stream now (the follower on the host is ended too) and wait for the thread."""
        self._end_input()
        if not self.join(timeout):
            self._force_close()
            self.join(timeout)
