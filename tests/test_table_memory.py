"""A table larger than every task that is not a parameter server (issue 35), through apply.

examples/wide_deep with an 800 MiB table split over 2 ps, trained by real processes on the
embedded local cluster, where the chief, both workers and the evaluator each have a memory
limit of their own (``cluster.memory``: a cgroup per task, tfplan/backends/transports/cgroups.py)
smaller than the table: the parts are born on their ps, the ps save them, the evaluator and the
chief's final scores read each batch's rows from the checkpoint (recipes/checkpoint_rows.py),
and the chief's export writes the model as its parts, range by range. Nothing is OOM-killed;
with the table loaded (``trainer.score_rows_bytes=null``, what scoring did before) the chief is
killed at its limit when it scores (checked when this was written, left out of the suite for
its minute of CPU).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from apply_helpers import (
    base_overrides,
    example_with_data,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
)

pytestmark = [pytest.mark.full, pytest.mark.cluster]

ROWS, DIM = 3_200_000, 64  # 3.2M x 64 float32: 781 MiB, plus the one-column table's 12 MiB
LIMIT = 600 << 20


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return example_with_data("wide_deep", tmp_path / "wide_deep", "4000")


def test_a_table_larger_than_the_chief_workers_and_evaluator_trains_scores_and_exports(
    project: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("a memory cgroup per task needs root (CI runs as root)")
    args = [
        *base_overrides(project, free_port_base()),
        "cluster.ps=2",
        "cluster.evaluator=true",
        "algo=hogwild",
        "model._target_=wide_deep.models.build",
        f"model.vocab={ROWS}",
        f"model.embed={DIM}",
        "model.loss=binary_crossentropy",
        "data=tfrecord",
        "data.train=data/train-*.tfrecord",
        "data.eval=data/eval.tfrecord",
        "data.label=clicked",
        "trainer.max_steps=60",
        "trainer.checkpoint_steps=30",
        "trainer.keep_checkpoints=1",
        "trainer.eval_secs=0.5",
        "lifecycle.snapshot_secs=0",  # 800 MiB snapshots in memory: not the point here
        *(f"+cluster.memory.{role}={LIMIT}" for role in ("chief", "worker", "evaluator")),
    ]
    try:
        proc = tfplan(project, "apply", "--auto-approve", *args, timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        out = project / "out"
        result = json.loads((out / "result.json").read_text())
        assert result["global_step"] >= 60 and 0 < result["accuracy"] <= 1, result
        chief_log = (project / "work" / "worker-0" / "task.log").read_text()
        assert "read from each checkpoint row by row, not loaded" in chief_log, chief_log[-3000:]
        assert "checkpoints: each ps saves its own variables" in chief_log, chief_log[-3000:]
        evaluated = (out / "eval" / "metrics.jsonl").read_text().splitlines()
        assert evaluated and json.loads(evaluated[-1])["global_step"] >= 60, evaluated
        # the model back, as parts: it could not be joined under the chief's limit
        manifest = json.loads((out / "model.parts" / "model.json").read_text())
        table = next(w for w in manifest["weights"] if w["path"] == "item_embedding/embeddings")
        assert table["shape"] == [ROWS, DIM] and len(table["files"]) >= 13, table["files"][:3]
        assert not (out / "model.keras").exists()
        # every task ended once, by itself: none was killed at its limit and restarted
        tasks = state_of(project)["tasks"]
        assert len(tasks) == 5, [t["name"] for t in tasks]  # 2 ps, 2 workers, the evaluator
        for task in tasks:
            assert (task["restarts"], task["exit_code"]) == (0, 0), task
            if task["role"] != "ps":
                assert task["memory_limit"] == LIMIT, task
    finally:
        kill_groups(recorded_groups(project))
