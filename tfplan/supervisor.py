"""Watch a running cluster: stream prefixed logs, track the global step, apply the role-aware
lifecycle, and return once training is over.

Lifecycle (PEERS.md: what TFJob, TonY and RiseML users expect):
- chief exits 0: training is done; parameter servers and the evaluator get ``ps_grace_secs`` to
  exit by themselves (they normally do), then they are stopped.
- chief fails: with ``on_chief_failure=teardown`` (default) every task is stopped.
- a non-chief worker fails: reported; asynchronous training goes on (a synchronous chief
  turns the missing replica into an error after its run timeout, and then the rule above acts).
- Ctrl-C: every task is stopped and the state records it.
"""

from __future__ import annotations

import posixpath
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tfplan.applier import stop_tasks
from tfplan.errors import TfplanError
from tfplan.hosts import HostPool
from tfplan.state import State, StateStore, TaskState

__all__ = ["Outcome", "Supervisor", "STEP_PATTERN", "collect_status"]

STEP_PATTERN = re.compile(r"\bstep=(\d+)")

Emit = Callable[[str, str], None]  # (task name, line)


@dataclass(frozen=True)
class Outcome:
    succeeded: bool
    reason: str
    state: State
    last_step: int | None


def collect_status(state: State, pool: HostPool) -> dict[str, Any]:
    """ProcessInfo (or the exception of its host) for every running task, by task name."""
    running = [t for t in state.tasks if t.status == "running"]
    out: dict[str, Any] = {}
    for host in sorted({t.host for t in running}):
        mine = [t for t in running if t.host == host]
        try:
            infos = pool[host].status([t.pid for t in mine], [t.workdir for t in mine])
        except TfplanError as error:
            for task in mine:
                out[task.name] = error
            continue
        for task in mine:
            out[task.name] = infos.get(task.pid)
    return out


def ended_status(info: Any) -> tuple[str, int | None] | None:
    """(new status, exit code) when the process has ended, else None."""
    if info is None or isinstance(info, BaseException) or info.alive:
        return None
    code = info.exit_code
    return ("succeeded" if code == 0 else "failed"), code


class Supervisor:
    def __init__(
        self,
        store: StateStore,
        pool: HostPool,
        emit: Emit,
        on_step: Callable[[int], None] | None = None,
        poll_secs: float = 0.5,
    ) -> None:
        self.store = store
        self.pool = pool
        self.emit = emit
        self.on_step = on_step or (lambda step: None)
        self.poll_secs = poll_secs
        self.last_step: int | None = None
        self._lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self._streams: list[Any] = []

    def run(self, state: State) -> Outcome:
        """Supervise until every task has ended; Ctrl-C stops them all and re-raises."""
        self._start_streams(state)
        try:
            return self._loop(state)
        except KeyboardInterrupt:
            self._drain()
            current = self.store.load() or state
            running = [t for t in current.tasks if t.status == "running"]
            self.emit("tfplan", f"interrupted: stopping {len(running)} task(s)")
            stop_tasks(current, running, self.store, self.pool, self._say, forget=False)
            raise
        finally:
            self._stop_streams()
            self._drain()

    def _say(self, line: str) -> None:
        self.emit("tfplan", line)

    def _start_streams(self, state: State) -> None:
        for task in state.tasks:
            if task.status != "running":
                continue
            name = task.name

            def on_line(line: str, name: str = name) -> None:
                self._lines.put((name, line))

            try:
                self._streams.append(self.pool[task.host].stream_log(task.log_path, task.pid, on_line))
            except TfplanError as error:
                self._say(f"{name}: cannot stream its log ({error})")

    def _stop_streams(self) -> None:
        for stream in self._streams:
            try:
                stream.stop()
            except Exception:  # noqa: BLE001 - a stream that fails to stop must not mask the outcome
                pass
        self._streams.clear()

    def _drain(self) -> None:
        while True:
            try:
                name, line = self._lines.get_nowait()
            except queue.Empty:
                return
            match = STEP_PATTERN.search(line)
            if match:
                step = int(match.group(1))
                if self.last_step is None or step > self.last_step:
                    self.last_step = step
                    self.on_step(step)
            self.emit(name, line)

    def _loop(self, state: State) -> Outcome:
        chief_done_at: float | None = None
        chief_result: tuple[bool, str] | None = None
        while True:
            self._drain()
            state = self._refresh(state)
            chief = next((t for t in state.tasks if _is_chief(t)), None)
            running = [t for t in state.tasks if t.status == "running"]
            if chief is not None and chief.status != "running" and chief_result is None:
                ok = chief.status == "succeeded"
                chief_result = (ok, f"{chief.name} {chief.status} (exit code {chief.exit_code})")
                chief_done_at = time.monotonic()
                if not ok and chief.settings.get("on_chief_failure", "teardown") == "teardown":
                    self._say(f"{chief.name} failed: tearing down the cluster")
                    state = stop_tasks(state, running, self.store, self.pool, self._say, forget=False)
                    running = []
            if chief_result is not None and running and chief_done_at is not None:
                grace = float(chief.settings.get("ps_grace_secs", "5")) if chief else 5.0
                if chief_result[0] and time.monotonic() - chief_done_at >= grace:
                    names = ", ".join(t.name for t in running)
                    self._say(f"training is over; stopping {names}, which did not exit by themselves")
                    state = stop_tasks(state, running, self.store, self.pool, self._say, forget=False)
                    running = []
            if not running:
                time.sleep(0.2)  # the last lines of the logs
                self._drain()
                if chief_result is None:
                    return Outcome(False, "no chief task ran", state, self.last_step)
                return Outcome(chief_result[0], chief_result[1], state, self.last_step)
            time.sleep(self.poll_secs)

    def _refresh(self, state: State) -> State:
        infos = collect_status(state, self.pool)
        changed = False
        for task in state.tasks:
            ended = ended_status(infos.get(task.name)) if task.status == "running" else None
            if ended is None:
                continue
            status, code = ended
            state = state.with_task(replace(task, status=status, exit_code=code))
            changed = True
            role_note = "" if status == "succeeded" else self._failure_note(task)
            self._say(f"{task.name} {status} (exit code {code}){role_note}")
        if changed:
            state = self.store.write(state)
        return state

    @staticmethod
    def _failure_note(task: TaskState) -> str:
        if task.role == "worker" and not _is_chief(task):
            return "; the other workers go on"
        return ""


def _is_chief(task: TaskState) -> bool:
    return bool(task.spec.get("is_chief", False))


def result_path(output_dir: str) -> str:
    return posixpath.join(output_dir, "result.json")


# Threads that stream logs call back from other threads; the queue above hands their lines to
# the supervising thread, which alone prints, so the output never interleaves mid-line.
_ = threading
