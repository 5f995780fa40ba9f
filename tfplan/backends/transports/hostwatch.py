"""The tfplan side of a host's watcher (:mod:`.watch_agent`): one agent, one reader thread.

Every log followed on a host goes through the one agent there: its lines arrive task-prefixed
on one stream and are handed to each task's callback; a task's end (its wrapper gone, its log
read to the end) arrives as an event, so the supervisor learns of an exit at once and can answer
"is it still running?" from what it heard, without a ``ps`` per poll. The agent beats every
second; a watch that has not been heard from for :data:`STALE_SECS` answers nothing, so a host
that went silent is asked the ordinary way (and found unreachable).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tfplan.backends.transports.scripts import q
from tfplan.backends.transports.specs import READOPTED, ProcessInfo, StreamPipe

__all__ = ["AGENT_SOURCE", "STALE_SECS", "HostWatch", "WatchedStream", "agent_command"]

AGENT_SOURCE = (Path(__file__).with_name("watch_agent.py")).read_text()
# What the host runs: a few lines that read the agent's source (its length in bytes is the
# argument) from stdin and run it, so `ps` on the host shows a short, recognisable command.
BOOTSTRAP = (
    "import os,sys\n"
    "n=int(sys.argv[2]);d=b''\n"
    "while len(d)<n:\n"
    " c=os.read(0,n-len(d))\n"
    " if not c: sys.exit(1)\n"
    " d+=c\n"
    "exec(compile(d,'tfplan-watch','exec'),{'__name__':'__main__'})\n"
)


def agent_command(python: str) -> tuple[str, bytes]:
    """(the sh command that starts the agent with ``python``, what to write to its stdin
    first: the agent's source)."""
    source = AGENT_SOURCE.encode()
    return f"exec {q(python)} -u -c {q(BOOTSTRAP)} tfplan-watch {len(source)}", source


STALE_SECS = 3.0  # the agent beats every second
READY_SECS = 15.0  # how long the agent may take to start and say its first word


class WatchedStream:
    """One task's log through its host's watch; the interface of :class:`LogStream`."""

    def __init__(self, watch: HostWatch, key: str, pid: int, on_line: Callable[[str], None]):
        self._watch = watch
        self.key = key
        self.pid = pid
        self._on_line = on_line
        self.error: BaseException | None = None
        self.lines = 0
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    # called by the watch's reader thread
    def _deliver(self, raw: bytes) -> None:
        if self._ended.is_set():
            return
        self.lines += 1
        try:
            self._on_line(raw.decode(errors="replace").rstrip("\r"))
        except BaseException as exc:  # noqa: BLE001 - kept for the caller, like LogStream
            self.error = exc
            self._watch.drop(self)

    def _end(self) -> None:
        with self._lock:
            if self._ended.is_set():
                return
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self._ended.is_set():
                self._callbacks.append(callback)
                return
        callback()

    @property
    def done(self) -> bool:
        return self._ended.is_set()

    def join(self, timeout: float | None = None) -> bool:
        return self._ended.wait(timeout)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop following now (the agent forgets the task; the task is not touched)."""
        self._watch.drop(self)


class HostWatch:
    """The agent on one host, reached through ``pipe``; see the module docstring.

    Raises (from the constructor):
        OSError: the agent did not start (no Python on the host, the pipe broke).
    """

    def __init__(self, host: str, pipe: StreamPipe, source: bytes = b"") -> None:
        self.host = host
        self._pipe = pipe
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._streams: dict[str, WatchedStream] = {}
        self._pids: dict[int, str] = {}  # followed pid -> key
        self._exit_files: dict[int, str | None] = {}  # pid -> where its exit code is read
        # followed pid (a wrapper gone) -> (its program's pid, live processes of its group)
        self._adopted: dict[int, tuple[int, int]] = {}
        self._keys = itertools.count(1)
        self._heard = 0.0
        self._ready = threading.Event()
        self.closed = False
        self._thread = threading.Thread(target=self._read, name=f"watch:{host}", daemon=True)
        self._thread.start()
        try:
            if source:
                pipe.write(source)
        except (OSError, EOFError, ValueError):
            pass
        if not self._ready.wait(READY_SECS) or self.closed:
            self.close()
            raise OSError(f"the watcher on host {host} did not start")

    # ---- following ------------------------------------------------------------------
    def follow(
        self,
        path: str,
        pid: int,
        pgid: int,
        exit_file: str | None,
        on_line: Callable[[str], None],
        adopt: bool = False,
    ) -> WatchedStream:
        """Follow one task; ``adopt``: its program outliving its wrapper (``pid``) is
        re-adopted, followed on until its whole group is gone (see the agent's protocol)."""
        key = str(next(self._keys))
        stream = WatchedStream(self, key, pid, on_line)
        with self._lock:
            self._streams[key] = stream
            self._pids[pid] = key
            self._exit_files[pid] = exit_file
            self._adopted.pop(pid, None)
        command = {"op": "follow", "id": key, "log": path, "pid": pid, "pgid": pgid}
        command["exit"] = exit_file
        command["adopt"] = adopt
        if not self._send(command):
            stream._end()
        return stream

    def drop(self, stream: WatchedStream) -> None:
        with self._lock:
            known = self._streams.pop(stream.key, None) is not None
            if self._pids.get(stream.pid) == stream.key:
                del self._pids[stream.pid]
        if known:
            self._send({"op": "drop", "id": stream.key})
        stream._end()

    def _send(self, command: dict[str, object]) -> bool:
        data = (json.dumps(command) + "\n").encode()
        try:
            with self._write_lock:
                self._pipe.write(data)
            return True
        except (OSError, EOFError, ValueError):
            return False

    # ---- what was heard ---------------------------------------------------------------
    @property
    def fresh(self) -> bool:
        return not self.closed and time.monotonic() - self._heard < STALE_SECS

    def status(
        self, pids: Sequence[int], exit_files: Sequence[str | None]
    ) -> dict[int, ProcessInfo] | None:
        """pid -> info for running tasks this watch follows, from the agent's events; None
        when it cannot answer for all of them: one ended (its end is read the ordinary way,
        once, for its exit code and what its group left), one is not followed here, or the
        agent was not heard lately."""
        with self._lock:
            if not self.fresh:
                return None
            out: dict[int, ProcessInfo] = {}
            for pid, exit_file in zip(pids, exit_files, strict=True):
                if exit_file is not None and self._exit_files.get(pid) != exit_file:
                    return None
                if pid not in self._pids:
                    return None
                if pid in self._adopted:
                    program, left = self._adopted[pid]
                    state = f"{READOPTED}: program pid {program}"
                    out[pid] = ProcessInfo(pid, True, state, None, None, None, left)
                    continue
                out[pid] = ProcessInfo(pid, True, "running", None, None, None, 1)
            return out

    # ---- the reader thread ------------------------------------------------------------
    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self._pipe.read()
                if not chunk:
                    break
                self._heard = time.monotonic()
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._event(line)
        except (OSError, EOFError, ValueError):
            pass
        finally:
            self._gone()

    def _event(self, line: bytes) -> None:
        kind, _, rest = line.partition(b" ")
        if kind == b"L":
            key, _, text = rest.partition(b" ")
            stream = self._streams.get(key.decode())
            if stream is not None:
                stream._deliver(text)
        elif kind == b"A":
            adopted, program, left = rest.decode().split(" ")[:3]
            with self._lock:
                followed = self._streams.get(adopted)
                if followed is not None:
                    self._adopted[followed.pid] = (int(program), int(left))
        elif kind == b"X":
            ended = rest.split(b" ", 1)[0].decode()
            with self._lock:
                stream = self._streams.pop(ended, None)
                if stream is not None and self._pids.get(stream.pid) == ended:
                    del self._pids[stream.pid]
                    self._adopted.pop(stream.pid, None)
            if stream is not None:
                stream._end()
        elif kind == b"H":
            self._ready.set()

    def _gone(self) -> None:
        """The agent or its connection ended: every stream ends, as a broken stream did."""
        self.closed = True
        self._ready.set()
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
            self._pids.clear()
        for stream in streams:
            stream._end()

    def close(self) -> None:
        """End the agent (its stdin closes) and the reader; the tasks are not touched."""
        self.closed = True
        self._pipe.end_input()
        self._thread.join(2.0)
        self._pipe.force_close()
        self._thread.join(2.0)
