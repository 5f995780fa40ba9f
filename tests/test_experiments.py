"""Experiment ids and folders: what an apply records, resume by id from the last checkpoint (real
TensorFlow), and the checkpoints tfplan refuses to resume from (before starting anything)."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    base_overrides,
    fake_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    tfplan,
    wait_until,
)

from tfplan.engine.experiment import checkpoint_step


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def test_checkpoint_step_reads_tensorflows_checkpoint_file() -> None:
    text = (
        'model_checkpoint_path: "model.ckpt-60"\n'
        'all_model_checkpoint_paths: "model.ckpt-40"\n'
        'all_model_checkpoint_paths: "model.ckpt-60"\n'
    )
    assert checkpoint_step(text) == 60
    assert checkpoint_step('model_checkpoint_path: "/abs/dir/model.ckpt-7"') == 7
    assert checkpoint_step("") is None


def test_an_apply_records_config_plan_state_and_logs_in_the_output_folder(ws: Path) -> None:
    port = free_port_base()
    tfplan(
        ws, "apply", "--auto-approve", *base_overrides(ws, port), *fake_overrides(ws), check=True
    )
    record = ws / "out" / "tfplan"
    config = (record / "config.yaml").read_text()
    assert "id: t" in config and f"port_base: {port}" in config  # resolved, every group
    plan = json.loads((record / "plan.json").read_text())
    assert plan["experiment_id"] == "t" and len(plan["tasks"]) == 3
    state = json.loads((record / "state.json").read_text())
    assert {t["name"]: t["status"] for t in state["tasks"]}["worker/0"] == "succeeded"
    assert "step=3" in (record / "logs" / "worker-0.log").read_text()
    runs = json.loads((record / "experiment.json").read_text())["runs"]
    assert [(r["status"], r["resumed_from_step"]) for r in runs] == [("succeeded", None)]
    index = json.loads((ws / ".tfplan" / "t" / "output.json").read_text())
    assert index["output_dir"] == str(ws / "out") and index["kind"] == "experiment"


def test_checkpoints_of_another_experiment_are_refused(ws: Path) -> None:
    port = free_port_base()
    (ws / "out" / "tfplan").mkdir(parents=True)
    (ws / "out" / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-60"\n')
    (ws / "out" / "tfplan" / "experiment.json").write_text(json.dumps({"id": "other", "runs": []}))
    proc = tfplan(ws, "apply", "--auto-approve", *base_overrides(ws, port), *fake_overrides(ws))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "holds the checkpoints (step 60) of experiment 'other'" in proc.stderr
    assert "experiment.id=other" in proc.stderr
    assert not (ws / ".tfplan" / "t" / "state.json").exists()  # nothing was started
    assert (ws / "out" / "checkpoint").exists()  # and nothing deleted


def test_checkpoints_of_another_model_are_refused(ws: Path) -> None:
    port = free_port_base()
    tfplan(
        ws, "apply", "--auto-approve", *base_overrides(ws, port), *fake_overrides(ws), check=True
    )
    (ws / "out" / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-30"\n')
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, port),
        *fake_overrides(ws),
        "model.hidden=[16]",
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "experiment 't' has checkpoints (step 30) made with model.hidden=[128]" in proc.stderr
    assert "use a new experiment.id to start fresh" in proc.stderr


@pytest.mark.cluster
def test_applying_an_existing_id_resumes_from_its_last_checkpoint(ws: Path) -> None:
    port = free_port_base()
    common = [
        *base_overrides(ws, port, experiment="r"),
        "trainer.log_steps=20",
        "trainer.checkpoint_steps=20",
    ]
    first = tfplan(ws, "apply", "--auto-approve", *common, "trainer.max_steps=40", check=True)
    assert "resuming" not in first.stdout  # a new id starts fresh
    assert _first_step(first.stdout) < 20
    assert json.loads((ws / "out" / "result.json").read_text())["global_step"] >= 40
    # tfplan names the step of the checkpoint the `checkpoint` file points at: read it there.
    step = checkpoint_step((ws / "out" / "checkpoint").read_text())
    assert step is not None and step >= 40

    second = tfplan(ws, "apply", "--auto-approve", *common, "trainer.max_steps=80", check=True)
    resumed = f"resuming experiment r from its checkpoint at step {step} in {ws / 'out'}"
    assert resumed in second.stdout
    assert _first_step(second.stdout) >= step  # no step was trained twice
    assert json.loads((ws / "out" / "result.json").read_text())["global_step"] >= 80
    runs = json.loads((ws / "out" / "tfplan" / "experiment.json").read_text())["runs"]
    assert [r["resumed_from_step"] for r in runs] == [None, step]
    assert (ws / "out" / f"model.ckpt-{step}.index").exists()
    _tensorboard_shows_the_experiment(ws)


def _first_step(out: str) -> int:
    match = re.search(r"worker/\d\s+\| step=(\d+) loss=\S+ first step", out)
    assert match, out
    return int(match.group(1))


def _tensorboard_shows_the_experiment(ws: Path) -> None:
    proc = tfplan(ws, "tensorboard", "r", "--detach", "--port", str(free_port_base(1)), check=True)
    line = next(ln for ln in proc.stdout.splitlines() if "http://127.0.0.1:" in ln)
    url = line.split(": ", 1)[1].split()[0]
    pid = int(line.rsplit("pid ", 1)[1].rstrip(")"))
    try:

        def has_run() -> bool:
            with urllib.request.urlopen(url + "data/runs", timeout=5) as response:
                return "." in json.loads(response.read())

        wait_until(has_run, 60, "TensorBoard to list the experiment's summaries")
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_until(
        lambda: (
            not Path(f"/proc/{pid}").exists()
            or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        ),
        10,
        "TensorBoard to stop",
    )
