"""Real-process tests of the recipes: ps + 2 workers (+ evaluator) on loopback ports."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
from pathlib import Path

import pytest
from chaos_helpers import final_checkpoint_step
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
        if "evaluator/0" in c.roles_names():
            _start_with_an_early_evaluation(c)
        else:
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
        assert final_checkpoint_step(out) == result["global_step"]
        assert {"loss", "accuracy", "learning_rate", "global_step/sec"} <= summary_tags(out)
        assert "ps/0 done: 2 of 2 replicas finished" in c.tasks["ps/0"].text
        # the chief took in-memory snapshots of the ps, which removed them once done
        assert "snapshots: every 1s, each ps into" in c.tasks["worker/0"].text or (
            c.result()["wall_time_secs"] < 1.0  # (none due in a run shorter than a second)
        )
        taken = result["snapshots"]  # how many, how long: in result.json (one ps: no copies)
        assert taken["copies"] is False and taken["taken"] >= 0, taken
        if taken["taken"]:
            assert taken["first_secs"] > 0, taken
        if taken["taken"] > 1:  # the others, apart from the first (it sets up their graphs)
            assert 0 < taken["median_secs"] <= taken["max_secs"], taken
        assert list((tmp_path / "shm").glob("tfplan-snapshots-*/ps0")) == []
        # the ps sees this output folder: it saved its own variables (recipes/ps_saving.py)
        assert "checkpoints: each ps saves its own variables into" in c.tasks["worker/0"].text
        if "evaluator/0" in c.tasks:
            lines = [json.loads(s) for s in (out / "eval/metrics.jsonl").read_text().splitlines()]
            assert lines[-1]["global_step"] == result["global_step"]
            assert abs(lines[-1]["accuracy"] - result["accuracy"]) < 1e-4
            assert lines[0]["accuracy"] < lines[-1]["accuracy"]
            assert {"eval/accuracy", "eval/loss"} <= summary_tags(out / "eval")
        for t in c.tasks.values():  # nothing left running: every process exited by itself
            assert t.proc.poll() is not None


def _start_with_an_early_evaluation(c: RecipeCluster) -> None:
    """Start the cluster so that the evaluator scores an early checkpoint on any machine: it
    starts first, and the chief is held (SIGSTOP) from its first step until the evaluator has
    evaluated one (the checkpoint the chief saved at session creation, as nothing else checkpoints
    while it is held). Otherwise 200 steps can be over before the evaluator's first poll."""
    c.start("ps", 0)
    evaluator = c.start("evaluator", 0)
    c.wait_for("the evaluator to watch", lambda: "evaluator watching" in evaluator.text, 120)
    chief = c.start("worker", 0)
    c.start("worker", 1)
    c.wait_for("the chief's first step", lambda: bool(chief.steps()), timeout=120)
    c.signal("worker/0", signal.SIGSTOP)
    try:
        c.wait_for("an evaluation", lambda: "eval step=" in evaluator.text, timeout=120)
    finally:
        c.signal("worker/0", signal.SIGCONT)


def _max_step(c: RecipeCluster) -> int:
    return max([0, *[s for t in c.tasks.values() for s in t.steps()]])


def test_chief_restart_does_not_roll_back(tmp_path: Path) -> None:
    """worker/1 is held (SIGSTOP) from the chief's death until the restarted chief has logged a
    step, so the job cannot reach its last step first however fast the machine is (it needed
    1,500 steps of margin when it raced)."""
    cfg = run_config(
        tmp_path / "out",
        ALGOS["hogwild"],
        max_steps=600,
        trainer={"checkpoint_steps": 100, "log_steps": 50},
    )
    with RecipeCluster(tmp_path, cfg) as c:
        c.start_all()
        c.wait_for("step 300", lambda: _max_step(c) >= 300, timeout=90)
        c.kill("worker/0")
        c.signal("worker/1", signal.SIGSTOP)
        try:
            before = _max_step(c)
            restarted = c.start("worker", 0)
            c.wait_for("the restarted chief to log a step", lambda: bool(restarted.steps()), 60)
        finally:
            c.signal("worker/1", signal.SIGCONT)
        assert restarted.steps()[0] >= before, (before, restarted.text)
        codes = c.wait_all(timeout=120)
        assert codes == {"ps/0": 0, "worker/0": 0, "worker/1": 0}, c.dump()
        assert c.result()["global_step"] >= 600
        assert final_checkpoint_step(c.output_dir) == c.result()["global_step"]


def test_ps_killed_and_restarted_resumes_from_checkpoint(tmp_path: Path) -> None:
    """Without in-memory snapshots (they have their own tests: test_snapshots.py), a restarted
    ps gets the last checkpoint, as every ps does."""
    cfg = run_config(
        tmp_path / "out",
        ALGOS["hogwild"],
        max_steps=1200,
        trainer={"checkpoint_steps": 100, "log_steps": 50},
        snapshots={"secs": 0},
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
        import tensorflow as tf

        last_ckpt = int(tf.train.latest_checkpoint(str(c.output_dir)).rsplit("-", 1)[1])
        c.start("ps", 0)
        codes = c.wait_all(timeout=150)
        assert codes == {"ps/0": 0, "worker/0": 0, "worker/1": 0}, c.dump()
        assert c.result()["global_step"] >= 1200
        # The chief's own lines after it restored the restarted ps (the first such line is at
        # its start): ordered in one pipe, unlike arrival times against the moment of the kill.
        lines = [line for _, line in c.tasks["worker/0"].lines]
        restores = [i for i, line in enumerate(lines) if "parameter servers uninitialised" in line]
        assert len(restores) >= 2 and "restoring model.ckpt-" in lines[restores[-1]], c.dump()
        after = [
            int(m[1]) for line in lines[restores[-1] :] if (m := re.search(r"\bstep=(\d+)", line))
        ]
        assert after and after[0] >= last_ckpt, (last_ckpt, c.dump())


def _eval_lines(c: RecipeCluster) -> list[dict[str, float]]:
    text = (c.output_dir / "eval" / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_chief_waits_for_a_straggler_and_result_describes_the_final_checkpoint(
    tmp_path: Path,
) -> None:
    """worker/1 is held (SIGSTOP) mid-run while the chief reaches max_steps: its next step can
    land after the chief's last checkpoint hook (once result.json said 1501 while that checkpoint
    held 1500). The chief must wait for worker/1's done token before it reads the final step, and
    result.json must describe the final checkpoint: the same global step, the same weights."""
    cfg = run_config(tmp_path / "out", ALGOS["hogwild"], max_steps=200)
    env = {"TFPLAN_DONE_WAIT_SECS": "300"}  # the hold, not this bound, decides the order here
    with RecipeCluster(tmp_path, cfg, evaluator=True, env=env) as c:
        c.start_all()
        c.wait_for("worker/1 to train", lambda: bool(c.tasks["worker/1"].steps()), timeout=120)
        c.signal("worker/1", signal.SIGSTOP)
        c.wait_for(
            "the chief to wait for worker/1",
            lambda: "waiting for 1 more replica(s) to finish" in c.tasks["worker/0"].text,
            timeout=120,
        )
        assert not (c.output_dir / "result.json").exists(), "result.json before worker/1 stopped"
        c.signal("worker/1", signal.SIGCONT)
        codes = c.wait_all(timeout=150)
        assert codes == {name: 0 for name in c.tasks}, c.dump()
        result = c.result()
        assert result["global_step"] >= 200
        assert result["global_step"] >= max(c.tasks["worker/1"].steps())
        assert final_checkpoint_step(c.output_dir) == result["global_step"]
        assert result["checkpoint"] == f"model.ckpt-{result['global_step']}"
        last = _eval_lines(c)[-1]  # the evaluator restored the same checkpoint on its own
        assert last["global_step"] == result["global_step"]
        assert abs(last["accuracy"] - result["accuracy"]) < 1e-6
        assert abs(last["loss"] - result["eval_loss"]) < 1e-5


def test_chief_gives_up_on_a_replica_that_never_finishes_and_still_agrees_with_its_checkpoint(
    tmp_path: Path,
) -> None:
    """A replica that never sends its done token (frozen for good here) delays the chief by
    the bound only; result.json still describes the final checkpoint, and the chief says why it
    went on. The ps waits for that token forever: the launcher stops it (here, the test)."""
    cfg = run_config(tmp_path / "out", ALGOS["hogwild"], max_steps=200)
    with RecipeCluster(tmp_path, cfg, env={"TFPLAN_DONE_WAIT_SECS": "1"}) as c:
        c.start_all()
        c.wait_for("worker/1 to train", lambda: bool(c.tasks["worker/1"].steps()), timeout=120)
        c.signal("worker/1", signal.SIGSTOP)
        assert c.wait_exit("worker/0", timeout=150) == 0, c.dump()
        assert "warning: not every replica finished within 1s" in c.tasks["worker/0"].text
        result = c.result()
        assert result["global_step"] >= 200
        assert final_checkpoint_step(c.output_dir) == result["global_step"]
        assert c.tasks["ps/0"].proc.poll() is None, "the ps cannot have got every token"
