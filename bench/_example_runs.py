"""One `tfplan apply` of an example project with a given checkout of tfplan, for the benchmarks
that compare checkouts side by side (bench_embeddings.py, bench_table_rules.py): the checkout's
own conf/ and code (``PYTHONPATH``), the run's own folders under ``runs/<run>``, its result.json
back, whatever it left running killed by the process groups its state records.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import free_port_base, kill_groups, recorded_groups  # noqa: E402

__all__ = ["apply_example", "click_run", "make_ctr_data"]


def click_run(batch: int, steps: int) -> list[str]:
    """The overrides every click example's run shares: its TFRecord shards (``clicked`` the
    label, a logit out), ``batch``, ``steps`` and one checkpoint at the end, no model exported."""
    return [
        "model.loss=binary_crossentropy",
        "data=tfrecord",
        "data.train=data/train-*.tfrecord",
        "data.eval=data/eval.tfrecord",
        "data.label=clicked",
        f"data.batch_size={batch}",
        f"trainer.max_steps={steps}",
        f"trainer.checkpoint_steps={steps}",
        "trainer.log_steps=1000",
        "trainer.export_model=false",
    ]


def apply_example(
    project: Path, checkout: Path, run: str, overrides: list[str], timeout: float = 1800
) -> dict[str, Any]:
    """``tfplan apply --auto-approve OVERRIDES`` in ``project`` with ``checkout``'s tfplan and
    recipes, on the embedded local cluster; the chief's result.json."""
    ws = project / "runs" / run
    ws.mkdir(parents=True, exist_ok=True)  # a resumed job: the same run again
    env = {**os.environ, "TFPLAN_CONF": str(checkout / "conf"), "PYTHONPATH": str(checkout)}
    env.pop("TFPLAN_MAX_STEPS_CAP", None)
    args = [
        "apply",
        "--auto-approve",
        f"experiment.id={run}",
        f"cluster.port_base={free_port_base()}",
        f"cluster.workdir={ws}/work",
        f"cluster.output_dir={ws}/out",
        *overrides,
    ]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tfplan", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{run}: {proc.stdout[-2000:]}\n{proc.stderr[-1000:]}")
        result: dict[str, Any] = json.loads((ws / "out" / "result.json").read_text())
    finally:
        kill_groups(recorded_groups(project))
    return result


def make_ctr_data(project: Path, examples: int, vocab_scale: float) -> str:
    """examples/ctr's ``make_data.py data EXAMPLES --vocab-scale S`` in ``project`` (a copy of
    the example); what it printed."""
    made = subprocess.run(
        [sys.executable, "make_data.py", "data", str(examples), "--vocab-scale", str(vocab_scale)],
        cwd=project,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return made.stdout


def wide_deep_with_data(folder: Path) -> Path:
    """examples/wide_deep copied into ``folder``, its click logs written by its make_data.py."""
    project = folder / "wide_deep"
    shutil.copytree(REPO / "examples" / "wide_deep", project)
    subprocess.run(
        [sys.executable, "make_data.py", "data"],
        cwd=project,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"},
        check=True,
        timeout=600,
    )
    return project
