"""The TF2 strategies through `tfplan apply`: all-reduce without a parameter server (with the
evaluator), the group restarting together after a real kill, and ParameterServerStrategy with
the chief as coordinator and servers that end by themselves."""

from __future__ import annotations

import json
import signal
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
from chaos_helpers import ApplyRun, checkpoint_steps, kill_task

pytestmark = pytest.mark.cluster


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def _nothing_left(ws: Path) -> None:
    tasks = state_of(ws)["tasks"]
    assert not [t["name"] for t in tasks if alive(int(t["handle"]["pid"]))]


def test_allreduce_trains_without_a_ps_and_the_evaluator_scores_it(ws: Path) -> None:
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, free_port_base()),
        "cluster=local_allreduce",
        "algo=allreduce",
        "cluster.evaluator=true",
        "trainer.max_steps=150",
        "trainer.log_steps=50",
        "trainer.checkpoint_steps=50",
        "trainer.eval_secs=0.5",
        timeout=400,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr
    assert "ps/0" not in out and "Training complete" in out
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["algo"] == "allreduce" and result["global_step"] == 150
    assert result["ps"] == 0 and result["replicas"] == 2
    metrics = (ws / "out" / "eval" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["global_step"] == 150
    _nothing_left(ws)


def test_a_killed_allreduce_worker_restarts_the_group_from_the_checkpoint(ws: Path) -> None:
    run = ApplyRun(
        ws,
        [
            *base_overrides(ws, free_port_base()),
            "cluster=local_allreduce",
            "algo=allreduce",
            "trainer.max_steps=500",
            "trainer.log_steps=25",
            "trainer.checkpoint_steps=50",
            "lifecycle.restart.backoff_secs=0.2",
        ],
    )
    fault = run.wait_step(150, timeout=300, task="worker/0")
    last_ckpt = max(checkpoint_steps(ws / "out"), default=0)
    kill_task(ws, "worker/1", signal.SIGKILL)
    run.wait_for(r"worker/1 failed \(.*\): restarting", timeout=60, after=fault)
    run.wait_for(
        r"holds part of every all-reduce step|worker/0 failed \(exit code 5\)",
        timeout=60,
        after=fault,
    )
    # the survivor either exits 5 by itself or is stopped with the group: both come back
    for name in ("worker/0", "worker/1"):
        run.wait_for(rf"{name}: restarted on localhost", timeout=90, after=fault)
    code = run.finish(timeout=400)
    assert code == 0, run.text()[-4000:]
    restarted = max(i for i, (_, line) in enumerate(run.lines) if "restarted on" in line)
    after = [step for _, step in run.steps(restarted + 1)]
    assert after and min(after) >= last_ckpt, (after[:5], last_ckpt)
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["global_step"] == 500
    tasks = {t["name"]: t for t in state_of(ws)["tasks"]}
    assert tasks["worker/0"]["restarts"] >= 1 and tasks["worker/1"]["restarts"] == 1
    _nothing_left(ws)


def test_pss_coordinates_from_the_chief_and_the_servers_end_by_themselves(ws: Path) -> None:
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, free_port_base()),
        "cluster=local_chief",
        "algo=pss",
        "cluster.evaluator=false",
        "trainer.max_steps=160",
        "trainer.log_steps=40",
        "trainer.checkpoint_steps=80",
        "lifecycle.ps_grace_secs=30",
        timeout=400,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr
    assert "Training complete" in out
    assert "which did not exit by themselves" not in out  # the servers ended on their own
    statuses = {t["name"]: t["status"] for t in state_of(ws)["tasks"]}
    assert statuses == {n: "succeeded" for n in ("ps/0", "chief/0", "worker/0", "worker/1")}
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["algo"] == "pss" and result["global_step"] >= 160
    _nothing_left(ws)
