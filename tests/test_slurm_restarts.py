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
from apply_helpers import (
    alive,
    paced,
    state_of,
    tfplan,
    wait_until,
)
from chaos_helpers import ApplyRun
from slurm_testbed import SlurmTestbed
from test_kill_matrix import PROGRAM, Lives, _group, _up
from test_slurm import _args, _env, _forked_programs, _squeue, cleanup
from test_snapshots import FIRST, RESTORED, _number

pytestmark = [pytest.mark.slurm, pytest.mark.netns]
FULL = pytest.mark.full


@pytest.fixture
def ws(tmp_path: Path, slurm_cluster: SlurmTestbed) -> Iterator[Path]:
    yield tmp_path
    cleanup(tmp_path, slurm_cluster)


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


@FULL
def test_a_killed_ps_comes_back_from_its_snapshot_inside_the_allocation(
    ws: Path, slurm_cluster: SlurmTestbed
) -> None:
    """Issue 36 on Slurm: the built-in recipes, snapshots every 0.5 s into a folder on the ps's
    node; the ps's program (forked by its node's warm seed inside its step) SIGKILLed: tfplan
    restarts it in a new step and the chief brings it back from its snapshot, not from the
    checkpoint of step 0; the stream and ``status`` say so and the steps lost."""
    args = _args(
        *paced(0.02),  # trains on, paced, until the Ctrl-C
        "trainer.max_steps=100000000",
        "trainer.log_steps=25",
        "trainer.checkpoint_steps=1000000",  # one checkpoint: the first
        "lifecycle.restart.backoff_secs=0.2",
        "lifecycle.ps_standby=false",
        "lifecycle.snapshot_secs=0.5",
        f"lifecycle.snapshot_dir={ws / 'shm'}",
    )
    env = _env(ws, slurm_cluster)
    run = ApplyRun(ws, args, env=env)
    first = run.wait_for(FIRST, 300)
    first_step = _number(re.search(FIRST, run.lines[first][1])[2])  # type: ignore[index]
    before = run.wait_step(first_step + 50, 300, task="worker/0")
    (program,) = _forked_programs(ws, "ps/0")
    os.kill(program, signal.SIGKILL)
    run.wait_for(r"ps/0: restarted on n\d", 60, before)
    restored = run.wait_for(RESTORED, 120, before)
    step, lost, seen = (_number(v) for v in re.search(RESTORED, run.lines[restored][1]).groups())  # type: ignore[union-attr]
    assert step >= first_step and seen - step == lost, run.lines[restored][1]
    assert "restoring model.ckpt" not in run.text()
    # from the restore on: a line from before the kill can be past step + 25 already
    after = run.wait_step(step + 25, 120, task="worker/0", after=restored + 1)
    assert min(s for name, s in run.steps(restored + 1, after + 1) if name == "worker/0") >= step
    ps = next(t for t in state_of(ws)["tasks"] if t["name"] == "ps/0")
    assert ps["handle"]["step"] == "ps-0.1"  # its second step in the allocation
    shown = tfplan(ws, "status", env=env, check=True).stdout
    assert f"ps/0 from its snapshot of step {step:,}, {lost:,} steps lost" in shown, shown
    run.proc.send_signal(signal.SIGINT)
    run.finish(timeout=120)
    assert _squeue(slurm_cluster) == []
