"""Real-process tests of the recipes: ps + 2 workers (+ evaluator) on loopback ports."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from recipe_cluster import RecipeCluster, run_config

pytestmark = [pytest.mark.cluster, pytest.mark.full]

ALGOS = {
    "hogwild": {"name": "hogwild"},
    "downpour": {"name": "downpour", "window": 4, "ps_optimizer": "sgd"},
    "sync": {
        "name": "sync",
        "lr": 0.2,
        "sync": True,
        "run_timeout_secs": 30,
        "stop_grace_secs": 2,
        "backup_workers": 0,
        "replicas_to_aggregate": None,
    },
}


def summary_tags(folder: Path) -> set[str]:
    import tensorflow as tf

    tags: set[str] = set()
    for path in glob.glob(str(folder / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    return tags


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_algorithm_trains_and_every_task_exits(algo: str, tmp_path: Path) -> None:
    max_steps = 200
    cfg = run_config(tmp_path / "out", ALGOS[algo], max_steps=max_steps)
    with RecipeCluster(tmp_path, cfg, evaluator=(algo != "downpour")) as c:
        c.start_all()
        codes = c.wait_all(timeout=150)
        assert codes == {name: 0 for name in c.tasks}, c.dump()
        result = c.result()
        first_loss = float(re.search(r"step=\d+ loss=([\d.]+)", c.tasks["worker/0"].text)[1])
        assert result["status"] == "succeeded" and result["algo"] == algo
        assert max_steps <= result["global_step"] <= max_steps + 8
        assert result["loss"] < 0.5 * first_loss, (result, first_loss)
        assert result["accuracy"] > 0.8, result
        assert result["examples_per_sec"] > 0 and result["wall_time_secs"] > 0
        out = c.output_dir
        assert (out / "checkpoint").is_file()
        assert glob.glob(str(out / f"model.ckpt-{result['global_step']}.index"))
        assert {"loss", "accuracy", "learning_rate", "global_step/sec"} <= summary_tags(out)
        assert "ps/0 done: 2 of 2 replicas finished" in c.tasks["ps/0"].text
        if "evaluator/0" in c.tasks:
            lines = [json.loads(s) for s in (out / "eval/metrics.jsonl").read_text().splitlines()]
            assert lines[-1]["global_step"] == result["global_step"]
            assert abs(lines[-1]["accuracy"] - result["accuracy"]) < 1e-4
            assert lines[0]["accuracy"] < lines[-1]["accuracy"]
            assert {"eval/accuracy", "eval/loss"} <= summary_tags(out / "eval")
        for t in c.tasks.values():  # nothing left running: every process exited by itself
            assert t.proc.poll() is not None


def _max_step(c: RecipeCluster) -> int:
    return max([0, *[s for t in c.tasks.values() for s in t.steps()]])


def test_chief_restart_does_not_roll_back(tmp_path: Path) -> None:
    cfg = run_config(
        tmp_path / "out",
        ALGOS["hogwild"],
        max_steps=1500,
        trainer={"checkpoint_steps": 100, "log_steps": 50},
    )
    with RecipeCluster(tmp_path, cfg) as c:
        c.start_all()
        c.wait_for("step 300", lambda: _max_step(c) >= 300, timeout=90)
        c.kill("worker/0")
        before = _max_step(c)
        restarted = c.start("worker", 0)
        c.wait_for("the restarted chief to log a step", lambda: bool(restarted.steps()), 60)
        assert restarted.steps()[0] >= before, (before, restarted.text)
        codes = c.wait_all(timeout=120)
        assert codes == {"ps/0": 0, "worker/0": 0, "worker/1": 0}, c.dump()
        assert c.result()["global_step"] >= 1500


def test_ps_killed_and_restarted_resumes_from_checkpoint(tmp_path: Path) -> None:
    cfg = run_config(
        tmp_path / "out",
        ALGOS["hogwild"],
        max_steps=1200,
        trainer={"checkpoint_steps": 100, "log_steps": 50},
    )
    with RecipeCluster(tmp_path, cfg) as c:
        c.start_all()
        ckpt = c.output_dir / "model.ckpt-{}.index"
        c.wait_for(
            "a checkpoint after step 100",
            lambda: any(os.path.exists(str(ckpt).format(s)) for s in range(100, 1200)),
            timeout=90,
        )
        c.kill("ps/0", signal.SIGKILL)
        killed_at = time.monotonic()
        import tensorflow as tf

        last_ckpt = int(tf.train.latest_checkpoint(str(c.output_dir)).rsplit("-", 1)[1])
        c.start("ps", 0)
        codes = c.wait_all(timeout=150)
        assert codes == {"ps/0": 0, "worker/0": 0, "worker/1": 0}, c.dump()
        assert c.result()["global_step"] >= 1200
        after = [
            int(m[1])
            for t, line in c.tasks["worker/0"].lines
            if t > killed_at
            for m in [re.search(r"\bstep=(\d+)", line)]
            if m
        ]
        assert after and after[0] >= last_ckpt, (last_ckpt, c.dump())
