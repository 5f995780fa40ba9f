"""Warm standbys with the real recipes: a parameter server killed mid-training is replaced by its
standby (TensorFlow already imported) and training goes on from the last checkpoint at worst;
a ps whose wrapper dies while its program serves is re-adopted, never replaced.

One run, two faults: first the ps's program is killed (its wrapper lives on): the standby takes
over after every process of the previous life is gone, the workers train again, no step goes
back beyond the checkpoint taken before the fault, and a new standby starts. Then, once that
standby is ready, the ps's wrapper (its program lives on): tfplan says it re-adopted the ps,
the same program serves on, no restart, no takeover, and the workers train on without losing a
step. Ctrl-C then stops everything: no process of any life and no standby is left. Waits are on
log lines; the run has no step limit that could race them (training ends with the Ctrl-C).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    base_overrides,
    free_port_base,
    kill_groups,
    paced,
    recorded_groups,
    state_of,
)
from chaos_helpers import ApplyRun, checkpoint_steps
from test_kill_matrix import Lives, _group

pytestmark = [pytest.mark.cluster, pytest.mark.full]

READY = r"^ps/0~standby\s+\| standby for ps/0: ready"


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def _ps(ws: Path) -> tuple[int, int]:
    """(wrapper pid, program pid) of the live ps."""
    task = next(t for t in state_of(ws)["tasks"] if t["name"] == "ps/0")
    wrapper = int(task["handle"]["pid"])
    programs = [p for p in _group(wrapper) if p != wrapper]
    assert len(programs) == 1, programs
    return wrapper, programs[0]


@pytest.mark.timeout(900)
def test_a_killed_ps_is_replaced_by_its_standby_and_training_goes_on(ws: Path) -> None:
    run = ApplyRun(
        ws,
        [
            *base_overrides(ws, free_port_base()),
            "trainer.max_steps=100000000",
            *paced(0.05),  # trains on, paced, until the Ctrl-C
            "trainer.log_steps=25",
            "trainer.checkpoint_steps=100",
            "lifecycle.restart.backoff_secs=0.2",
            "cluster.warm=false",  # standbys are the cold start's (a forked restart needs none)
        ],
    )
    lives = Lives(ws)
    mark = run.wait_for(r"^worker/0\s+\| step=", 300)
    # the program first: the standby takes over
    mark = run.wait_for(READY, 300, mark)
    lives.note()
    last_ckpt = max(checkpoint_steps(ws / "out"), default=0)
    wrapper, program = _ps(ws)
    os.kill(program, signal.SIGKILL)
    taken = run.wait_for(r"ps/0: restarted on localhost by its warm standby", 60, mark)
    assert _group(wrapper) == [], "the previous life outlived the takeover"
    serving = run.wait_for(r"^ps/0\s+\| ps/0 serving on", 60, taken)
    for worker in ("worker/0", "worker/1"):
        run.wait_for(rf"^{worker}\s+\| step=", 120, serving)
    after = [step for _, step in run.steps(serving + 1)]
    assert min(after) >= last_ckpt, (min(after), last_ckpt)
    mark = run.wait_for(r"ps/0: warm standby started on localhost", 300, taken)
    # then the wrapper: the program, serving, is re-adopted
    mark = run.wait_for(READY, 300, mark)
    lives.note()
    wrapper, program = _ps(ws)
    before = max(step for _, step in run.steps(0))
    os.kill(wrapper, signal.SIGKILL)
    adopted = run.wait_for(rf"ps/0: its wrapper \(pid {wrapper}\) is gone .* re-adopted", 60, mark)
    for worker in ("worker/0", "worker/1"):
        run.wait_for(rf"^{worker}\s+\| step=", 120, adopted)
    after = [step for _, step in run.steps(adopted + 1)]
    assert min(after) >= before - 25, (min(after), before)  # lines in flight: one log_steps
    assert not [x for _, x in run.lines[adopted:] if "back from global step" in x]
    ps = next(t for t in state_of(ws)["tasks"] if t["name"] == "ps/0")
    assert ps["status"] == "running" and program in _group(int(ps["handle"]["pgid"]))
    assert "restart 2" not in run.text() and run.text().count("by its warm standby") == 1
    lives.note()
    run.proc.send_signal(signal.SIGINT)
    run.finish(timeout=120)
    assert "interrupted: stopping" in run.text()
    state = state_of(ws)
    assert state["standbys"] == [] and all(t["status"] != "running" for t in state["tasks"])
    lives.assert_nothing_left()
