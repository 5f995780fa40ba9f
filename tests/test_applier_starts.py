"""The apply's bookkeeping of the starts it makes (tfplan/engine/applier.py): a start still under
way when the apply gives up (its output closed, Ctrl-C, another start failed) is waited for, and
the task it started is stopped with the others, never left running unrecorded. Seen for real: a
benchmark killed mid-apply (the CLI's stdout pipe closed) left four tasks forked from the warm
seed running. The backend here is a stand-in whose starts end when the test says so (the order
of events is what is tested; the real backends' starts and stops have their own tests)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_render import _plan

from tfplan.backends.api import CancelResult, Capabilities, Launched, LaunchRequest
from tfplan.engine.applier import apply_plan
from tfplan.engine.store import StateStore
from tfplan.errors import ApplyError, BackendError
from tfplan.planning.state import Allocation


@dataclass
class StandInBackend:
    """Starts that end when ``release_start(name)`` is called; what was started and stopped."""

    capabilities: Capabilities = field(default_factory=lambda: Capabilities(launch_fanout=8))
    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    gates: dict[str, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())

    def preflight(self, plan: Any, tasks: Any) -> list[Any]:
        return []

    def free_bytes(self, host: str, folder: str) -> None:
        return None  # cannot look: nothing said

    def allocate(self, plan: Any, tasks: Any, current: Any, say: Any, submitted: Any) -> Any:
        return current or Allocation()

    def stage(self, plan: Any, tasks: Any, allocation: Any) -> None:
        return None

    def launch(self, request: LaunchRequest, allocation: Allocation) -> Launched:
        assert self.gate(request.name).wait(30), f"{request.name} never let start"
        with self.lock:
            self.started.append(request.name)
        return Launched(handle={"pid": 1}, host=request.host, address=None, started_at=0.0)

    def handle_text(self, record: Any) -> str:
        return "stand-in"

    def cancel(self, tasks: Any, grace: float) -> dict[str, CancelResult]:
        with self.lock:
            self.stopped.extend(t.name for t in tasks)
        return {t.name: CancelResult("terminated", 0.0) for t in tasks}

    def release(self, allocation: Any) -> None:
        return None


class OutputGone(BrokenPipeError):
    pass


def test_a_start_under_way_when_the_output_breaks_is_stopped_with_the_others(
    tmp_path: Path,
) -> None:
    """ps/0 starts first; its "started" line finds the output closed while the two workers
    are still starting. The apply waits for them and stops all three."""
    plan = _plan("cluster=local")
    names = sorted(t.name for t in plan.tasks)
    assert names == ["ps/0", "worker/0", "worker/1"], names
    backend = StandInBackend()
    store = StateStore(tmp_path / "state.json")
    backend.gate("ps/0").set()

    def say(line: str) -> None:
        if "started on" in line:
            # the workers' starts are under way; they end a moment after the output is gone
            threading.Timer(0.2, lambda: [backend.gate(n).set() for n in names]).start()
            raise OutputGone("stdout closed")

    with pytest.raises(OutputGone):
        apply_plan(plan, store, backend, say)  # type: ignore[arg-type]
    assert sorted(backend.started) == names
    assert sorted(backend.stopped) == names, backend.stopped  # none left running
    state = store.load()
    assert state is not None and state.tasks == ()


def test_a_failed_start_stops_what_started_and_what_was_under_way(tmp_path: Path) -> None:
    plan = _plan("cluster=local")
    backend = StandInBackend()
    store = StateStore(tmp_path / "state.json")

    def launch(request: LaunchRequest, allocation: Allocation) -> Launched:
        if request.name == "worker/1":
            time.sleep(0.1)
            raise BackendError("no room")
        return StandInBackend.launch(backend, request, allocation)

    backend.launch = launch  # type: ignore[method-assign]
    for name in ("ps/0", "worker/0"):
        backend.gate(name).set()
    with pytest.raises(ApplyError, match="worker/1 could not start"):
        apply_plan(plan, store, backend, lambda line: None)  # type: ignore[arg-type]
    assert sorted(backend.stopped) == sorted(backend.started) == ["ps/0", "worker/0"]
