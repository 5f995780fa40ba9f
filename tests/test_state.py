"""State files (tfplan.state): atomic writes, serial/lineage, stale plans, the lock."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tfplan.compose import compose_config, to_config
from tfplan.errors import StaleStateError, StateLockedError
from tfplan.planner import PlanContext, plan
from tfplan.state import State, StateStore, TaskState, check_plan_is_current

CONF = Path(__file__).resolve().parent.parent / "conf"
CTX = PlanContext(cwd="/tmp/project", local_python="/usr/bin/python3", tf_version="2.21.0")


def _task(name: str = "worker/0") -> TaskState:
    role, index = name.split("/")
    return TaskState(
        name=name,
        role=role,
        index=int(index),
        host="localhost",
        address="127.0.0.1",
        port=2223,
        pid=42,
        pgid=42,
        log_path="/tmp/l",
        workdir="/tmp/w",
        fingerprint="f",
        started_at=1.0,
        settings={"stop_grace_secs": "5.0"},
        spec={"role": role},
    )


def test_write_bumps_the_serial_and_round_trips(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "default")
    assert store.load() is None
    written = store.write(State.empty(lineage="L").with_task(_task()))
    assert written.serial == 1 and store.load() == written
    failed = dataclasses.replace(_task(), status="failed", exit_code=1)
    again = store.write(written.with_task(failed))
    assert again.serial == 2 and again.lineage == "L"
    loaded = store.load()
    assert loaded == again and loaded is not None and loaded.tasks[0].status == "failed"
    assert json.loads(store.path.read_text())["serial"] == 2
    assert [p.name for p in store.workspace.iterdir()] == ["state.json"]  # no temp file left


def test_with_and_without_task() -> None:
    state = State.empty(lineage="L").with_task(_task("ps/0")).with_task(_task("worker/0"))
    assert [t.name for t in state.tasks] == ["ps/0", "worker/0"]
    assert state.with_task(dataclasses.replace(_task("ps/0"), pid=7)).task("ps/0").pid == 7  # type: ignore[union-attr]
    assert state.without_task("ps/0").task("ps/0") is None


def test_a_plan_is_current_until_the_state_moves_on(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "default")
    state = store.write(State.empty(lineage="L"))
    p = plan(to_config(compose_config(["cluster=local"], CONF)), store.load(), CTX)
    assert (p.state_lineage, p.state_serial) == ("L", 1)
    check_plan_is_current(p.state_lineage, p.state_serial, store.load())  # current: no error
    store.write(state)  # someone applied since: serial 2
    with pytest.raises(StaleStateError, match="state serial 1, the state is now at serial 2"):
        check_plan_is_current(p.state_lineage, p.state_serial, store.load())


def test_a_plan_for_another_lineage_is_refused(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "default")
    store.write(State.empty(lineage="other"))
    with pytest.raises(StaleStateError, match="lineage L, but the workspace holds lineage other"):
        check_plan_is_current("L", 1, store.load())


def test_a_plan_made_without_state_is_refused_once_tasks_were_applied(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "default")
    p = plan(to_config(compose_config(["cluster=local"], CONF)), store.load(), CTX)
    assert (p.state_lineage, p.state_serial) == (None, 0)
    check_plan_is_current(p.state_lineage, p.state_serial, None)
    store.write(State.empty(lineage="new").with_task(_task()))
    with pytest.raises(StaleStateError, match="before any state existed"):
        check_plan_is_current(p.state_lineage, p.state_serial, store.load())


def test_the_lock_refuses_a_second_holder(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "default")
    with store.lock("apply"):
        with pytest.raises(StateLockedError, match=r"locked by tfplan apply \(pid \d+\)"):
            with StateStore(tmp_path / "default").lock("destroy"):
                pass
    with store.lock("destroy"):  # released: free again
        pass
