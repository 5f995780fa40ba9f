"""An algorithm end to end as a real cluster on the built-in model: ``tfplan apply`` of 1 ps + 2
workers on loopback, the synchronous ps algorithm (40 minibatches: 20 rounds of 2), with its
shipped defaults: the chief reaches the last step and writes its result, every task ends by
itself or is stopped, nothing is left running. Convergence is the bench's job
(docs/algorithms.md).

Every other algorithm runs the same checks through apply on the user's Keras model instead
(tests/test_user_model_apply.py, ``--tier=full``: all fourteen, the TF2 strategies in the
topology the registry says they need), where each also trains the user's layers: one cluster
per algorithm rather than two (the suite's budget, issue 33).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from apply_helpers import (
    alive,
    base_overrides,
    free_port_base,
    kill_groups,
    minibatches_per_step,
    recorded_groups,
    state_of,
    tfplan,
    topology,
)

from tfplan.config.algorithms import ALGORITHMS

MINIBATCHES = 40


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


@pytest.mark.cluster
@pytest.mark.parametrize("algo", ["sync"])
def test_algorithm_trains_as_a_real_cluster_through_apply(algo: str, ws: Path) -> None:
    steps = math.ceil(MINIBATCHES / minibatches_per_step(algo))
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, free_port_base()),
        f"algo={algo}",
        *topology(algo),
        f"trainer.max_steps={steps}",
        "trainer.log_steps=10",
        f"trainer.checkpoint_steps={steps}",
        timeout=180,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    needs = ALGORITHMS[algo]
    n_ps = 1 if needs.needs_ps else 0
    chief = "chief/0" if needs.chief else "worker/0"
    assert f"Apply complete! Tasks: {2 + n_ps + int(needs.chief)} started" in proc.stdout
    run_yaml = yaml.safe_load((ws / "work" / "worker-0" / "run.yaml").read_text())
    assert run_yaml["algo"]["name"] == algo
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["status"] == "succeeded" and result["algo"] == algo
    assert result["global_step"] >= steps
    assert math.isfinite(result["loss"]) and 0.0 < result["accuracy"] <= 1.0
    assert result["replicas"] == 2 and result["ps"] == n_ps
    state = state_of(ws)
    statuses = {t["name"]: t["status"] for t in state["tasks"]}
    assert statuses[chief] == "succeeded", statuses
    assert set(statuses.values()) <= {"succeeded", "stopped"}, statuses
    assert not [t["handle"]["pid"] for t in state["tasks"] if alive(int(t["handle"]["pid"]))]
