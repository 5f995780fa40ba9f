"""Refresh (what plan and apply see of a running job) asks a silent host again before its tasks
count as unreachable: one slow status answer of a busy host must not plan a restart."""

from __future__ import annotations

from collections.abc import Sequence

from state_helpers import state_from
from test_costs import planned

from tfplan.backends.api import TaskInfo, TaskPhase
from tfplan.engine.refresh import LOOKS, refresh
from tfplan.planning.state import TaskRecord, TaskStatus


class Host:
    """Answers as a host whose first ``silent`` status reads time out, then as it runs."""

    def __init__(self, silent: int) -> None:
        self.silent, self.looks = silent, 0

    def describe(self, tasks: Sequence[TaskRecord]) -> dict[str, TaskInfo]:
        self.looks += 1
        if self.looks <= self.silent:
            phase, error = TaskPhase.UNREACHABLE, "a command timed out after 5s"
            return {t.name: TaskInfo(phase, host=t.host, error=error) for t in tasks}
        return {t.name: TaskInfo(TaskPhase.RUNNING, host=t.host) for t in tasks}


def test_a_host_slow_to_answer_once_is_asked_again() -> None:
    state = state_from(planned("algo=downpour"))
    host = Host(silent=LOOKS - 1)
    seen = refresh(state, host)  # type: ignore[arg-type]
    assert host.looks == LOOKS
    assert {t.status for t in seen.tasks} == {TaskStatus.RUNNING}


def test_a_host_that_never_answers_is_unreachable() -> None:
    state = state_from(planned("algo=downpour"))
    host = Host(silent=LOOKS)
    seen = refresh(state, host)  # type: ignore[arg-type]
    assert host.looks == LOOKS
    assert {t.status for t in seen.tasks} == {TaskStatus.UNREACHABLE}
