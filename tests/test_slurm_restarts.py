"""Restarts on the Slurm backend leave nothing behind, whichever process of a task dies first.

A task there is three processes: the local wrapper (the tracked process, leader of its group on
the submit host), the srun client under it, and the program on its node. A task of every role
(ps, chief, worker, evaluator) is killed at each of the three; before it is restarted (a new
step) every one of them is gone, so the new program can bind the port on the same node; then
the warm standby takes over on Slurm too (its own step, signalled with scancel --signal=USR1). The program is tests/test_kill_matrix.py's: it
binds its task's port, so a previous life left running would make the restart fail.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import alive, kill_groups, recorded_groups, state_of, wait_until
from chaos_helpers import ApplyRun
from slurm_testbed import SlurmTestbed
from test_kill_matrix import PROGRAM, Lives, _group, _up
from test_slurm import _args, _env, _squeue

pytestmark = [pytest.mark.slurm, pytest.mark.netns]
FULL = pytest.mark.full


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def _program(ws: Path, *extra: str) -> list[str]:
    """ps/0, chief/0, worker/0, worker/1 and evaluator/0 (two tasks per node)."""
    program = ws / "program.py"
    program.write_text(PROGRAM)
    return _args(
        "recipe=command",
        f"recipe.command='{sys.executable} {program} {ws / 'stop'}'",
        "cluster.chief=separate",
        "cluster.evaluator=true",
        "lifecycle.restart.backoff_secs=0.2",
        *extra,
    )


def _env2(ws: Path, bed: SlurmTestbed) -> dict[str, str]:
    return _env(ws, bed, tasks_per_node=2)


def _srun(wrapper: int) -> int:
    """The srun client: the wrapper's child (srun forks a helper of its own; the program runs
    under slurmstepd on its node)."""
    children = [p for p in _group(wrapper) if _ppid(p) == wrapper]
    assert len(children) == 1, children
    return children[0]


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


@pytest.mark.parametrize(
    ("task", "first"),
    [
        # the fast tier runs one (--tier=full: every role, killed at each of its processes)
        pytest.param(task, first, marks=() if (task, first) == ("ps/0", "tracked") else FULL)
        for task in ("ps/0", "chief/0", "worker/0", "evaluator/0")
        for first in ("tracked", "srun", "program")
    ],
)
def test_a_task_restarts_inside_the_allocation_after_every_process_of_it_is_gone(
    ws: Path, slurm_cluster: SlurmTestbed, task: str, first: str
) -> None:
    run = ApplyRun(ws, _program(ws, "lifecycle.ps_standby=false"), env=_env2(ws, slurm_cluster))
    lives = Lives(ws)
    up, program = _up(run, task)
    run.wait_for(r"^chief/0\s+\| step=", 90)
    lives.note()
    before = next(t for t in state_of(ws)["tasks"] if t["name"] == task)
    wrapper = int(before["handle"]["pid"])
    victim = {"tracked": wrapper, "srun": _srun(wrapper), "program": program}[first]
    os.kill(victim, signal.SIGKILL)
    run.wait_for(rf"{re.escape(task)}: restarted on n\d", 60, up)
    assert _group(wrapper) == [] and not alive(program), "a previous life outlived its restart"
    _, again = _up(run, task, up + 1)  # before or after 'restarted': two streams
    after = next(t for t in state_of(ws)["tasks"] if t["name"] == task)
    assert after["host"] == before["host"]
    assert after["handle"]["step"] == f"{task.replace('/', '-')}.1"
    assert again != program
    lives.note()
    (ws / "stop").touch()
    code = run.finish(timeout=120)
    assert code == 0, run.text()[-3000:]
    assert "cannot bind" not in run.text()
    lives.assert_nothing_left()
    assert _squeue(slurm_cluster) == []


def test_a_ps_standby_takes_over_inside_the_allocation(
    ws: Path, slurm_cluster: SlurmTestbed
) -> None:
    run = ApplyRun(ws, _program(ws, "lifecycle.ps_standby=true"), env=_env2(ws, slurm_cluster))
    lives = Lives(ws)
    up, program = _up(run, "ps/0")
    ready = run.wait_for(r"^ps/0~standby\s+\| standby for ps/0: ready", 90)
    standby = state_of(ws)["standbys"][0]
    assert standby["handle"]["step"] == "ps-0.1-standby"
    assert standby["host"] == next(t for t in state_of(ws)["tasks"] if t["name"] == "ps/0")["host"]
    lives.note()
    os.kill(program, signal.SIGKILL)
    taken = run.wait_for(r"ps/0: restarted on n\d by its warm standby", 60, max(up, ready))
    _, again = _up(run, "ps/0", taken)
    assert again != program and not alive(program)
    run.wait_for(r"ps/0: warm standby started on n\d", 60, taken)

    def steps() -> set[str]:
        return set(slurm_cluster.run("squeue", "-h", "-s", "-o", "%j").stdout.split())

    # the first standby's step is the ps now; the second standby is a step of its own (listed
    # once its srun has registered it)
    wait_until(lambda: "ps-0.2-standby" in steps(), 30, "the second standby's step")
    assert "ps-0.1-standby" in steps()
    ps = next(t for t in state_of(ws)["tasks"] if t["name"] == "ps/0")
    assert ps["handle"]["step"] == "ps-0.1-standby"
    lives.note()
    (ws / "stop").touch()
    code = run.finish(timeout=120)
    assert code == 0, run.text()[-3000:]
    assert re.search(r"Stopped ps/0~standby", run.text())
    lives.assert_nothing_left()
    assert _squeue(slurm_cluster) == []
