"""State files (tfplan.engine.store, tfplan.planning.state): atomic writes, serial/lineage,
stale plans, the lock, the format version."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tfplan.config.compose import compose_config, to_config
from tfplan.engine.plans import make_plan as plan
from tfplan.engine.store import StateStore
from tfplan.errors import StaleStateError, StateError, StateLockedError
from tfplan.planning.context import PlanContext
from tfplan.planning.state import State, TaskRecord, TaskStatus, check_plan_is_current

CONF = Path(__file__).resolve().parent.parent / "conf"
CTX = PlanContext(cwd="/tmp/project", local_python="/usr/bin/python3", tf_version="2.21.0")


def _task(name: str = "worker/0") -> TaskRecord:
    role, index = name.split("/")
    return TaskRecord(
        name=name,
        role=role,
        index=int(index),
        planned_host="localhost",
        host="localhost",
        address="127.0.0.1",
        port=2223,
        handle={"pid": 42, "pgid": 42},
        workdir="/tmp/w",
        log_path="/tmp/l",
        command=("python", "train.py"),
        env={"A": "1"},
        devices=(),
        is_chief=False,
        fingerprint="f",
        config_digest="c",
        cluster_digest="d",
        started_at=1.0,
    )


def test_write_bumps_the_serial_and_round_trips(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "default")
    assert store.load() is None
    written = store.write(State.empty(lineage="L").with_task(_task()))
    assert written.serial == 1 and store.load() == written
    failed = dataclasses.replace(_task(), status=TaskStatus.FAILED, exit_code=1)
    again = store.write(written.with_task(failed))
    assert again.serial == 2 and again.lineage == "L"
    loaded = store.load()
    assert loaded == again and loaded is not None and loaded.tasks[0].status is TaskStatus.FAILED
    assert json.loads(store.path.read_text())["serial"] == 2
    assert [p.name for p in store.folder.iterdir()] == ["state.json"]  # no temp file left


def test_with_and_without_task() -> None:
    state = State.empty(lineage="L").with_task(_task("ps/0")).with_task(_task("worker/0"))
    assert [t.name for t in state.tasks] == ["ps/0", "worker/0"]
    moved = state.with_task(dataclasses.replace(_task("ps/0"), handle={"pid": 7, "pgid": 7}))
    assert moved.task("ps/0").handle["pid"] == 7  # type: ignore[union-attr]
    assert [t.name for t in moved.tasks] == ["ps/0", "worker/0"]  # replaced in place
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


def test_a_state_of_another_format_or_damaged_is_a_one_line_error(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "default")
    store.folder.mkdir(parents=True)
    store.path.write_text(json.dumps({"version": 1, "lineage": "L", "serial": 3, "tasks": []}))
    with pytest.raises(StateError, match="another tfplan \\(state format 1"):
        store.load()
    store.path.write_text("{not json")
    with pytest.raises(StateError, match="is damaged"):
        store.load()
