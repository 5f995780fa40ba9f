"""Real-process tests of the TF2 strategies: ``algo=allreduce`` (MultiWorkerMirroredStrategy)
and ``algo=pss`` (ParameterServerStrategy), with TF_CONFIG written as the launcher writes it.

Every wait watches an event (a log line, a file, an exit) under a deadline. Timings of the
fault-tolerance tests are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from recipe_cluster import RecipeCluster, run_config
from test_recipes_cluster import summary_tags

pytestmark = pytest.mark.cluster
# The recipe-level scenarios; tests/test_strategies_apply.py runs both strategies end to end in
# the fast tier. The one-line topology errors start no TensorFlow and stay there too.
FULL = pytest.mark.full

ALLREDUCE = {"name": "allreduce", "lr": 0.1, "collective_timeout_secs": 30}
PSS = {"name": "pss", "lr": 0.1}
# The keys of recipes/replica.py's result.json (_write_result).
RESULT_KEYS = {
    "status",
    "global_step",
    "loss",
    "last_batch_loss",
    "accuracy",
    "eval_loss",
    "examples_per_sec",
    "wall_time_secs",
    "algo",
    "replicas",
    "ps",
    "checkpoint",
}
TOPOLOGY = {
    "allreduce-2workers": dict(n_ps=0, n_workers=2, chief=False),
    "allreduce-chief+worker": dict(n_ps=0, n_workers=1, chief=True),
    "pss": dict(n_ps=1, n_workers=2, chief=True),
}


def _chief(c: RecipeCluster) -> str:
    return "chief/0" if "chief" in c.cluster else "worker/0"


def _latest_step(c: RecipeCluster) -> int:
    state = c.output_dir / "checkpoint"
    if not state.is_file():
        return 0
    m = re.search(r'^model_checkpoint_path: ".*model\.ckpt-(\d+)"', state.read_text(), re.M)
    return int(m[1]) if m else 0


def _first_loss(text: str) -> float:
    return float(re.search(r"step=\d+ loss=([\d.]+) first step", text)[1])


def _check_outputs(c: RecipeCluster, algo: str, max_steps: int, replicas: int, ps: int) -> None:
    result = c.result()
    assert set(result) == RESULT_KEYS, result
    assert result["status"] == "succeeded" and result["algo"] == algo
    assert result["global_step"] == max_steps, result  # exactly: no overshoot
    assert result["replicas"] == replicas and result["ps"] == ps
    chief_text = c.tasks[_chief(c)].text
    assert result["loss"] < 0.5 * _first_loss(chief_text), (result, chief_text)
    assert result["accuracy"] > 0.8, result
    assert result["examples_per_sec"] > 0 and result["wall_time_secs"] > 0
    assert re.search(r"step=\d+ loss=[\d.]+ examples_per_sec=[\d.]+", chief_text)
    out = c.output_dir
    assert _latest_step(c) == max_steps
    assert result["checkpoint"] == f"model.ckpt-{max_steps}"  # the final one describes it
    assert glob.glob(str(out / f"model.ckpt-{max_steps}.index"))
    assert glob.glob(str(out / "model.ckpt-50.index"))  # checkpoint_steps=50 in run_config
    assert {"loss", "accuracy", "learning_rate", "global_step/sec"} <= summary_tags(out)
    if "evaluator/0" in c.tasks:
        lines = [json.loads(s) for s in (out / "eval/metrics.jsonl").read_text().splitlines()]
        assert lines[-1]["global_step"] == max_steps
        # The evaluator restored the same checkpoint on its own: the same figures.
        assert abs(lines[-1]["accuracy"] - result["accuracy"]) < 1e-6, (lines[-1], result)
        assert abs(lines[-1]["loss"] - result["eval_loss"]) < 1e-5, (lines[-1], result)
        # Learning is checked above (the loss); an evaluator that started after the last
        # checkpoint (a fast run on a busy machine) has only that one to compare.
        if lines[0]["global_step"] < max_steps // 2:
            assert lines[0]["accuracy"] < lines[-1]["accuracy"], lines
        assert {"eval/accuracy", "eval/loss"} <= summary_tags(out / "eval")


@FULL
@pytest.mark.parametrize("topology", ["allreduce-2workers", "allreduce-chief+worker"])
def test_allreduce_trains_to_max_steps(topology: str, tmp_path: Path) -> None:
    cfg = run_config(tmp_path / "out", ALLREDUCE, max_steps=200)
    with RecipeCluster(tmp_path, cfg, evaluator=True, **TOPOLOGY[topology]) as c:
        c.start_all()
        codes = c.wait_all(timeout=180)
        assert codes == {name: 0 for name in c.tasks}, c.dump()
        _check_outputs(c, "allreduce", 200, replicas=2, ps=0)
        for name in ("worker/0", "worker/1", "chief/0"):
            if name in c.tasks:  # every replica ran every step, in lockstep
                assert f"{name} finished after 200 steps" in c.tasks[name].text, c.dump()
        # autograph's module files (a tf.function's each) are in the task's own scratch folder,
        # which recipes/scratch.py bounds to one life, not in the system's temporary folder:
        # os._exit skips autograph's own clean-up
        scratch = glob.glob(
            str(tmp_path / "**" / ".tmp-worker-0" / "__autograph_*"), recursive=True
        )
        assert scratch, sorted(str(p) for p in tmp_path.rglob(".tmp-*"))


@FULL
def test_pss_trains_and_every_server_exits_by_itself(tmp_path: Path) -> None:
    cfg = run_config(tmp_path / "out", PSS, max_steps=200)
    with RecipeCluster(tmp_path, cfg, evaluator=True, **TOPOLOGY["pss"]) as c:
        c.start_all()
        assert c.wait_exit("chief/0", timeout=180) == 0, c.dump()
        chief_done = time.monotonic()
        servers = ["ps/0", "worker/0", "worker/1"]
        codes = {name: c.wait_exit(name, timeout=30) for name in servers}
        waited = time.monotonic() - chief_done
        assert codes == {name: 0 for name in servers}, c.dump()
        for name in servers:
            assert f"{name} done: the coordinator finished" in c.tasks[name].text
        print(f"\npss: every server exited {waited:.2f}s after the coordinator")
        assert c.wait_exit("evaluator/0", timeout=60) == 0, c.dump()
        _check_outputs(c, "pss", 200, replicas=2, ps=1)


@FULL
@pytest.mark.parametrize("topology", ["allreduce-2workers", "pss"])
def test_resume_continues_from_the_last_checkpoint(topology: str, tmp_path: Path) -> None:
    algo = ALLREDUCE if topology.startswith("allreduce") else PSS
    out = tmp_path / "out"

    def run(max_steps: int, name: str, evaluator: bool = False) -> RecipeCluster:
        cfg = run_config(out, algo, max_steps=max_steps)
        with RecipeCluster(tmp_path / name, cfg, evaluator=evaluator, **TOPOLOGY[topology]) as c:
            c.start_all()
            codes = c.wait_all(timeout=180)
            assert codes == {n: 0 for n in c.tasks}, c.dump()
            return c

    first = run(60, "first")
    assert first.result()["global_step"] == 60 and _latest_step(first) == 60
    # With an evaluator: the first run's result.json must not make it stop at step 60.
    second = run(120, "second", evaluator=True)
    text = second.tasks[_chief(second)].text
    assert "resuming from the checkpoint of step=60" in text, text
    assert re.search(r"step=61 loss=[\d.]+ first step", text), text
    assert min(second.tasks[_chief(second)].steps()) == 60, text  # nothing below the checkpoint
    assert second.result()["global_step"] == 120 and _latest_step(second) == 120
    metrics = [json.loads(x) for x in (out / "eval/metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["global_step"] == 120, metrics
    third = run(120, "third")  # already at max_steps: nothing more to do, same outputs
    text = third.tasks[_chief(third)].text
    assert "first step" not in text and "finished after 0 steps" in text, text
    assert third.result()["global_step"] == 120
    assert not glob.glob(str(out / "model.ckpt-121*"))


def _kill_and_restart(c: RecipeCluster, victim: str, min_ckpt: int, more: int) -> dict[str, Any]:
    """Kill ``victim`` once a checkpoint >= min_ckpt exists; the others must exit with 5 on
    their own; then restart every task of the group with the same TF_CONFIG, to train ``more``
    steps past the last checkpoint (the first run cannot end: the kill lands in training
    whatever the machine's speed, and the restart trains only what the test needs)."""
    c.wait_for(f"checkpoint >= {min_ckpt}", lambda: _latest_step(c) >= min_ckpt, timeout=150)
    killed_at = time.monotonic()
    c.kill(victim, signal.SIGKILL)
    survivors = [n for n in c.tasks if n != victim]
    codes = {n: c.wait_exit(n, timeout=60) for n in survivors}
    exited = time.monotonic() - killed_at
    assert codes == {n: 5 for n in survivors}, c.dump()
    for n in survivors:
        assert "lost the collective group" in c.tasks[n].text, c.tasks[n].text
    last = _latest_step(c)
    c.write_config({**c.cfg, "trainer": {**c.cfg["trainer"], "max_steps": last + more}})
    restart_at = time.monotonic()
    for name in [*survivors, victim]:
        role, index = name.split("/")
        c.start(role, int(index))
    chief = c.tasks[_chief(c)]
    c.wait_for("the restarted chief's first step", lambda: bool(chief.steps()), timeout=120)
    c.wait_for("a first-step line", lambda: chief.first_line_time("first step") is not None, 60)
    first_step_t = chief.first_line_time("first step")
    assert first_step_t is not None
    return {
        "last": last,
        "exit_secs": exited,
        "restart_to_step_secs": first_step_t - restart_at,
    }


@FULL
@pytest.mark.parametrize("victim", ["worker/0"])  # worker/1: test_strategies_apply.py's story
def test_allreduce_killed_worker_the_group_restarts_from_the_checkpoint(
    victim: str, tmp_path: Path
) -> None:
    trainer = {"checkpoint_steps": 100, "log_steps": 50}
    cfg = run_config(tmp_path / "out", ALLREDUCE, max_steps=10**9, trainer=trainer)
    with RecipeCluster(tmp_path, cfg, **TOPOLOGY["allreduce-2workers"]) as c:
        c.start_all()
        t = _kill_and_restart(c, victim, min_ckpt=200, more=300)
        max_steps = t["last"] + 300
        # Bounded: a reset gRPC connection fails the next all-reduce at once.
        assert t["exit_secs"] < 30, t
        codes = c.wait_all(timeout=180)
        assert codes == {"worker/0": 0, "worker/1": 0}, c.dump()
        text = c.tasks["worker/0"].text
        assert f"resuming from the checkpoint of step={t['last']}" in text, text
        assert re.search(rf"step={t['last'] + 1} loss=[\d.]+ first step", text), text
        for name in ("worker/0", "worker/1"):  # no step counter below the checkpoint
            assert min(c.tasks[name].steps()) >= t["last"], c.dump()
        assert c.result()["global_step"] == max_steps
        print(
            f"\nallreduce, {victim} killed: the other exited {t['exit_secs']:.2f}s later "
            f"(code 5); restarted group's first step {t['restart_to_step_secs']:.2f}s after "
            f"the restart, at step={t['last'] + 1} (last checkpoint {t['last']})"
        )


@FULL
def test_allreduce_frozen_peer_fails_the_group_in_bounded_time(tmp_path: Path) -> None:
    """A frozen peer is caught by TF's coordination-service heartbeat (~10 s), before the
    default collective_timeout_secs=30. (A timeout below the heartbeat fires first and then TF
    2.21 aborted the process with SIGABRT in 2 of 10 runs: see docs/runtime.md.)"""
    cfg = run_config(
        tmp_path / "out",
        ALLREDUCE,
        max_steps=100000,
        trainer={"checkpoint_steps": 100, "log_steps": 100},
    )
    with RecipeCluster(tmp_path, cfg, **TOPOLOGY["allreduce-2workers"]) as c:
        c.start_all()
        c.wait_for("step 200", lambda: max([0, *c.tasks["worker/0"].steps()]) >= 200, 150)
        stopped_at = time.monotonic()
        # Alive but silent: no connection reset. (Not c.kill: it waits for an exit.)
        os.killpg(c.tasks["worker/1"].proc.pid, signal.SIGSTOP)
        try:
            assert c.wait_exit("worker/0", timeout=60) == 5, c.dump()
        finally:
            c.kill("worker/1", signal.SIGKILL)
        waited = time.monotonic() - stopped_at
        assert waited < 30, waited  # the heartbeat, not the collective timeout
        assert "lost the collective group" in c.tasks["worker/0"].text, c.dump()
        print(f"\nallreduce, worker/1 frozen: worker/0 exited {waited:.2f}s later (code 5)")


@FULL
def test_allreduce_peer_that_never_starts_ends_the_leader(tmp_path: Path) -> None:
    cfg = run_config(tmp_path / "out", {**ALLREDUCE, "startup_timeout_secs": 8})
    with RecipeCluster(tmp_path, cfg, **TOPOLOGY["allreduce-2workers"]) as c:
        c.start("worker", 0)  # the coordination leader; worker/1 never comes
        assert c.wait_exit("worker/0", timeout=90) == 5, c.dump()
        assert "did not form" in c.tasks["worker/0"].text, c.dump()


@FULL
def test_pss_lost_ps_fails_the_coordinator_and_restart_resumes(tmp_path: Path) -> None:
    """ps/0 is killed mid-run: the coordinator exits 5; ps and chief restarted resume from the
    last checkpoint and finish.

    The first run cannot end (max_steps out of reach), so the kill always lands in training,
    whatever the machine's speed. With max_steps=1000 and the kill after checkpoint 200, the
    800 steps left took about 3 s here; a coordinator that got through them before the kill
    landed had already written result.json and exits 0 (a ps killed at step 1000: 0 in 1 of 3
    runs, after its done token to the dead ps timed out): CI's failure, wait_exit(...) == 5
    false (its log was cut off before the exit code). The restart resumes with a reachable
    max_steps, as a relaunch with a changed config would."""
    trainer = {"checkpoint_steps": 100, "log_steps": 50}
    cfg = run_config(tmp_path / "out", PSS, max_steps=10**9, trainer=trainer)
    with RecipeCluster(tmp_path, cfg, **TOPOLOGY["pss"]) as c:
        c.start_all()
        c.wait_for("checkpoint >= 200", lambda: _latest_step(c) >= 200, timeout=150)
        killed_at = time.monotonic()
        c.kill("ps/0", signal.SIGKILL)
        assert c.wait_exit("chief/0", timeout=60) == 5, c.dump()
        exited = time.monotonic() - killed_at
        assert "lost a parameter server" in c.tasks["chief/0"].text, c.dump()
        last = _latest_step(c)
        max_steps = last + 300
        c.write_config(run_config(tmp_path / "out", PSS, max_steps=max_steps, trainer=trainer))
        c.start("ps", 0)
        chief = c.start("chief", 0)  # the workers keep running: only ps and chief restart
        # A coordinator whose first steps come within about a second of the ps being back can
        # exit 5 once more: a worker's gRPC connection to the restarted ps is still in reconnect
        # backoff and fails fast with the old "Connection refused" (1 of 8 runs that started the
        # chief before the ps; in CI once at step 201, the first closure worker/1 ran after the
        # resume). Exit 5 means "restart me", and the launcher does (tfplan: retry_exit_codes);
        # so does this test, a few times, as long as the failed attempt wrote no checkpoint past
        # the one it resumed from (so every attempt resumes from the same step).
        again = 0
        while c.wait_exit("chief/0", timeout=180) == 5 and again < 4:
            assert "lost a parameter server" in chief.text, c.dump()
            assert max(chief.steps(), default=last) < last + trainer["checkpoint_steps"], c.dump()
            assert _latest_step(c) == last, c.dump()
            again += 1
            chief = c.start("chief", 0)
        codes = c.wait_all(timeout=60)
        assert codes == {name: 0 for name in c.tasks}, c.dump()
        assert f"resuming from the checkpoint of step={last}" in chief.text, chief.text
        assert min(chief.steps()) >= last, chief.text
        assert c.result()["global_step"] == max_steps
        print(
            f"\npss, ps/0 killed: the coordinator exited {exited:.2f}s later (code 5); "
            f"restarted chief exited 5 again {again} time(s) while workers reconnected"
        )


@FULL
def test_pss_lost_worker_the_coordinator_carries_on(tmp_path: Path) -> None:
    max_steps = 1500
    cfg = run_config(
        tmp_path / "out",
        PSS,
        max_steps=max_steps,
        trainer={"checkpoint_steps": 100, "log_steps": 50},
    )
    with RecipeCluster(tmp_path, cfg, **TOPOLOGY["pss"]) as c:
        c.start_all()
        chief = c.tasks["chief/0"]
        c.wait_for("step 200", lambda: max([0, *chief.steps()]) >= 200, timeout=150)
        c.kill("worker/1", signal.SIGKILL)
        at_kill = max(chief.steps())
        # The coordinator reschedules on worker/0 and keeps going without worker/1.
        c.wait_for(
            "100 more steps without worker/1",
            lambda: max(chief.steps()) >= at_kill + 100 or chief.proc.poll() is not None,
            timeout=90,
        )
        assert chief.proc.poll() is None or chief.proc.returncode == 0, c.dump()
        c.start("worker", 1)  # a restarted worker is taken back and told to stop at the end
        codes = c.wait_all(timeout=180)
        assert codes == {name: 0 for name in c.tasks}, c.dump()
        assert c.result()["global_step"] == max_steps


@pytest.mark.parametrize(
    "algo,topology,message",
    [
        (ALLREDUCE, dict(n_ps=1, n_workers=2), "plan with cluster.ps=0"),
        (PSS, dict(n_ps=1, n_workers=2, chief=False), "cluster.chief=separate"),
    ],
)
def test_wrong_topology_is_a_one_line_error(
    algo: dict[str, Any], topology: dict[str, Any], message: str, tmp_path: Path
) -> None:
    cfg = run_config(tmp_path / "out", algo)
    with RecipeCluster(tmp_path, cfg, **topology) as c:
        task = c.start("worker", 0)
        assert c.wait_exit("worker/0", timeout=60) == 2, c.dump()
        errors = [line for _, line in task.lines if line.startswith("error:")]
        assert len(errors) == 1 and message in errors[0], task.text


@FULL
@pytest.mark.parametrize("topology", ["allreduce-2workers", "pss"])
def test_sigterm_stops_every_task(topology: str, tmp_path: Path) -> None:
    """TF's coordination agent swallows SIGTERM; the recipes restore it: a launcher's SIGTERM
    ends a training task (-15) and a pss server (exit 0)."""
    algo = ALLREDUCE if topology.startswith("allreduce") else PSS
    cfg = run_config(tmp_path / "out", algo, max_steps=100000, trainer={"log_steps": 100})
    with RecipeCluster(tmp_path, cfg, **TOPOLOGY[topology]) as c:
        c.start_all()
        chief = c.tasks[_chief(c)]
        c.wait_for("step 200", lambda: max([0, *chief.steps()]) >= 200, timeout=150)
        for t in c.tasks.values():  # all at once, as a launcher's teardown
            os.killpg(t.proc.pid, signal.SIGTERM)
        codes = {name: c.wait_exit(name, timeout=30) for name in list(c.tasks)}
        servers = {n: code for n, code in codes.items() if topology == "pss" and n != "chief/0"}
        training = {n: code for n, code in codes.items() if n not in servers}
        assert all(code == 0 for code in servers.values()), c.dump()
        # Killed by SIGTERM (-15), or (a member that saw its peer go first) lost the group (5).
        assert set(training.values()) <= {-15, 5} and -15 in training.values(), c.dump()


@FULL
def test_evaluator_ignores_an_earlier_runs_result_until_it_is_rewritten(tmp_path: Path) -> None:
    """A resumed run's evaluator may start before the chief deletes the old result.json."""
    import tensorflow as tf

    from recipes.config import ModelConf
    from recipes.models import Model
    from recipes.strategies.checkpoints import Checkpoints
    from recipes.strategies.optimizer import Optimizer

    cfg = run_config(tmp_path / "out", ALLREDUCE, max_steps=120)
    out = Path(cfg["output_dir"])
    model = Model(ModelConf(name="mlp", hidden=(32,)), 8, 1, 10)
    params = model.create_variables()
    step = tf.Variable(60, dtype=tf.int64)
    Checkpoints(str(out), step, params, Optimizer("sgd", 0.1).create_slots(params)).write(60)
    result = out / "result.json"
    result.write_text(json.dumps({"status": "succeeded", "global_step": 60}))
    with RecipeCluster(tmp_path, cfg, n_ps=0, n_workers=2, evaluator=True) as c:
        ev = c.start("evaluator", 0)
        c.wait_for("step 60 evaluated", lambda: "eval step=60" in ev.text, timeout=90)
        assert ev.proc.poll() is None, ev.text  # did not stop on the earlier run's result
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps({"status": "succeeded", "global_step": 60}))
        os.replace(tmp, result)  # as the chief writes it: a new file
        assert c.wait_exit("evaluator/0", timeout=30) == 0, ev.text
        assert "evaluator done at step=60" in ev.text
