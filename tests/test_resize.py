"""Workers join and leave a running job in place, and a running job is told a new step budget.

Real processes throughout: a detached downpour job (``data.shard=none``: every worker reads all
of the data in its own order) grows from 2 to 4 workers and back while it trains, then is told
where to stop and ends by itself. Nothing that kept running restarts: the parameter server's
process is the same one from the first apply to its own exit, and no step is rolled back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    alive,
    base_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
)

ELASTIC = ["algo=downpour", "data.shard=none", "trainer.log_steps=50"]
FOREVER_STEPS = "trainer.max_steps=100000000"


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    if (tmp_path / ".tfplan").exists():
        tfplan(tmp_path, "destroy", "--auto-approve", timeout=120)
    kill_groups(recorded_groups(tmp_path))


def tasks(ws: Path) -> dict[str, dict[str, object]]:
    return {t["name"]: t for t in state_of(ws)["tasks"]}


def status(ws: Path) -> dict[str, dict[str, object]]:
    data = json.loads(tfplan(ws, "status", "--json", check=True).stdout)
    return {row["task"]: row for row in data["tasks"]}


def wait_for(what: str, check: object, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def log_of(ws: Path, task: str) -> str:
    return (ws / "work" / task.replace("/", "-") / "task.log").read_text(errors="replace")


def training(ws: Path, names: list[str], past: int = 0) -> bool:
    rows = status(ws)
    return all(int(rows.get(n, {}).get("step") or 0) > past for n in names)


def first_step(ws: Path, task: str) -> int | None:
    for line in log_of(ws, task).splitlines():
        if "first step" in line and line.startswith("step="):
            return int(line.split()[0].removeprefix("step="))
    return None


@pytest.mark.full
def test_workers_join_and_leave_a_running_downpour_job_without_a_restart(ws: Path) -> None:
    base = [*base_overrides(ws, free_port_base(12)), *ELASTIC]
    started = tfplan(ws, "apply", "--auto-approve", "--detach", *base, FOREVER_STEPS)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr
    wait_for("both workers to train", lambda: training(ws, ["worker/0", "worker/1"]))
    ps_pid = tasks(ws)["ps/0"]["handle"]["pid"]  # type: ignore[index]

    # Scale out: the plan adds two workers and touches nothing that runs.
    four = [*base, FOREVER_STEPS, "cluster.workers=4"]
    planned = json.loads(tfplan(ws, "plan", "--json", "--no-save", *four, check=True).stdout)
    actions = {c["task"]: c["action"] for c in planned["changes"]}
    assert actions == {
        "ps/0": "no-op",
        "worker/0": "no-op",
        "worker/1": "no-op",
        "worker/2": "create",
        "worker/3": "create",
    }
    before = max(int(r.get("step") or 0) for r in status(ws).values())
    grown = tfplan(ws, "apply", "--auto-approve", "--detach", *four)
    assert grown.returncode == 0, grown.stdout[-3000:] + grown.stderr
    assert "the job has 4 training replica(s) taking part now" in grown.stdout
    assert "resuming" not in grown.stdout  # nothing resumes: the job goes on
    wait_for(
        "the new workers' first steps",
        lambda: first_step(ws, "worker/2") is not None and first_step(ws, "worker/3") is not None,
    )
    # They joined at the job's step, not at a checkpoint's, and the ps is the same process.
    assert min(first_step(ws, "worker/2") or 0, first_step(ws, "worker/3") or 0) >= before
    assert tasks(ws)["ps/0"]["handle"]["pid"] == ps_pid  # type: ignore[index]
    assert "the job has 4 replicas now" in log_of(ws, "ps/0")
    wait_for("all four to train", lambda: training(ws, [f"worker/{i}" for i in range(4)]))

    # Scale in: the two newest workers leave after a push, with their done tokens.
    shrunk = tfplan(ws, "apply", "--auto-approve", "--detach", *base, FOREVER_STEPS)
    assert shrunk.returncode == 0, shrunk.stdout[-3000:] + shrunk.stderr
    for task in ("worker/2", "worker/3"):
        assert f"{task} left the job (exit code 0)" in shrunk.stdout, shrunk.stdout[-3000:]
        assert f"{task} leaves the job at step=" in log_of(ws, task)
    assert set(tasks(ws)) == {"ps/0", "worker/0", "worker/1"}
    assert tasks(ws)["ps/0"]["handle"]["pid"] == ps_pid  # type: ignore[index]

    # A new step budget, told: the job ends by itself there, the ps after 4 done tokens.
    now = max(int(r.get("step") or 0) for r in status(ws).values())
    stop_at = now + 2000
    planned = tfplan(ws, "plan", "--no-save", *base, f"trainer.max_steps={stop_at}", check=True)
    assert "told to the running task (no restart, no rollback)" in planned.stdout
    assert "Plan: 0 to add, 3 to change, 0 to destroy." in planned.stdout
    ended = tfplan(ws, "apply", "--auto-approve", *base, f"trainer.max_steps={stop_at}")
    assert ended.returncode == 0, ended.stdout[-3000:] + ended.stderr
    assert f"trainer.max_steps is {stop_at} now (told)" in ended.stdout
    assert "ps/0 done: 4 of 4 replicas finished" in ended.stdout
    assert "Training complete" in ended.stdout
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["global_step"] >= stop_at
    for task in ("ps/0", "worker/0", "worker/1", "worker/2", "worker/3"):
        assert "back from global step" not in log_of(ws, task)  # never rolled back
    assert not [g for g in recorded_groups(ws) if alive(g)]


def test_what_cannot_be_resized_is_refused_or_planned_as_a_restart(ws: Path) -> None:
    base = [*base_overrides(ws, free_port_base(12)), *ELASTIC]
    none_left = tfplan(ws, "plan", "--no-save", *base, "cluster.workers=0")
    assert none_left.returncode == 1 and "cluster.workers" in none_left.stderr
    assert len(none_left.stderr.strip().splitlines()) == 1
    too_many = tfplan(ws, "plan", "--no-save", *base, "cluster.workers=40")
    assert too_many.returncode == 1 and "cpu_slots" in too_many.stderr, too_many.stderr
    assert len(too_many.stderr.strip().splitlines()) == 1
