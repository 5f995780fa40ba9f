"""The Slurm backend on a real Slurm (slurmctld + three slurmd in network namespaces).

Through the real CLI, as a user on a submit host would run it: plan shows the request with
addresses "known after apply"; apply submits one job, binds the tasks to its nodes, starts each
as a step, streams their logs, supervises, and cancels the job when training is done; a ps
killed mid-run is restarted inside the allocation; destroy leaves squeue empty; bad inputs are
one-line errors that leave nothing queued; a job cancelled from outside ends the run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    FAKE_TASK,
    example_with_data,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
    wait_until,
)
from chaos_helpers import ApplyRun
from slurm_testbed import SlurmTestbed
from test_apply_ssh import _conf_with_cluster

from recipes.snapshot_paths import snapshot_folder

pytestmark = [pytest.mark.slurm, pytest.mark.netns]


@pytest.fixture
def ws(tmp_path: Path, slurm_cluster: SlurmTestbed) -> Iterator[Path]:
    yield tmp_path
    cleanup(tmp_path, slurm_cluster)


def cleanup(ws: Path, bed: SlurmTestbed) -> None:
    """What a failed test left behind: its supervisor first (it would restart what is cleaned
    up), the srun clients by group, then its jobs by id, from the states (a SIGKILLed apply
    cancels nothing: its allocation, ``sleep infinity``, would keep the nodes for the next tests)."""
    ApplyRun.kill_all(ws)
    kill_groups(recorded_groups(ws))
    jobs = []
    for path in (ws / ".tfplan").glob("*/state.json"):
        job = (json.loads(path.read_text()).get("allocation") or {}).get("id")
        if job:
            bed.run("scancel", str(job), check=False)
            jobs.append(str(job))
    # gone from the queue, its nodes idle again, before the next test asks for them
    wait_until(
        lambda: (
            not {line.split()[0] for line in _squeue(bed)} & set(jobs)
            and "idle" == " ".join(sorted(set(bed.run("sinfo", "-h", "-o", "%T").stdout.split())))
        ),
        60,
        f"jobs {jobs} cancelled and the nodes idle",
    )


def _squeue(bed: SlurmTestbed) -> list[str]:
    return [line for line in bed.run("squeue", "-h", "-o", "%i %j %T").stdout.splitlines() if line]


def _env(ws: Path, bed: SlurmTestbed, **options: object) -> dict[str, str]:
    cluster = {
        "backend": "slurm",
        "ps": 1,
        "workers": 2,
        "python": sys.executable,  # the nodes share this machine's file system
        "workdir": str(ws / "work"),
        "output_dir": str(ws / "out"),
        "options": {"nodes": 3, "tasks_per_node": 1, "partition": bed.partition, **options},
    }
    env = _conf_with_cluster(ws, "slurmtest", cluster)
    return {**bed.env(), **env}


def _args(*extra: str) -> list[str]:
    return ["cluster=slurmtest", "experiment.id=t", "lifecycle.stop_grace_secs=2", *extra]


def _forked_programs(ws: Path, task: str) -> list[int]:
    """The program of ``task``, forked by its node's warm seed: the seed's children there (one
    task per node in these tests)."""
    record = next(t for t in state_of(ws)["tasks"] if t["name"] == task)
    ready = (ws / "work" / "_seed" / record["host"] / "ready").read_text()
    seed = int(ready.split()[0])
    children = Path(f"/proc/{seed}/task/{seed}/children").read_text().split()
    return [int(c) for c in children]


def _fake(ws: Path, **args: str) -> list[str]:
    script = ws / "fake_task.py"
    script.write_text(FAKE_TASK)
    extra = " ".join(f"{k}={v}" for k, v in args.items())
    return ["recipe=command", f"recipe.command='{sys.executable} {script} {extra}'"]


def test_plan_shows_the_request_and_addresses_known_after_apply(
    ws: Path, slurm_cluster: SlurmTestbed
) -> None:
    env = _env(ws, slurm_cluster, time_limit="00:30:00")
    planned = tfplan(ws, "plan", *_args(), env=env, check=True)
    out = planned.stdout
    assert "sbatch --job-name=tfplan-t --nodes=3 --ntasks-per-node=1 --partition=debug" in out
    assert "--time=00:30:00" in out
    assert '+ host       = "node-0" (known after apply)' in out
    assert "+ TF_CONFIG  = (known after apply)" in out
    assert _squeue(slurm_cluster) == []  # planning queues nothing


@pytest.mark.cluster
def test_downpour_across_three_nodes_trains_and_the_job_is_gone_after(
    ws: Path, slurm_cluster: SlurmTestbed
) -> None:
    env = _env(ws, slurm_cluster)
    args = _args(
        "algo=downpour",
        "trainer.max_steps=200",
        "trainer.log_steps=50",
        "trainer.checkpoint_steps=100",
    )
    proc = tfplan(ws, "apply", "--auto-approve", *args, env=env, timeout=400)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr
    job = re.search(r"submitted Slurm job (\d+)", out)
    assert job, out
    nodes = dict(re.findall(r"(ps/0|worker/0|worker/1): started on (n\d)", out))
    assert sorted(nodes.values()) == ["n1", "n2", "n3"]  # one task per node
    assert "worker/0     | step=" in out and "Training complete" in out
    assert f"released allocation {job.group(1)}" in out
    assert _squeue(slurm_cluster) == []  # nothing stays queued or held
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["global_step"] >= 200 and result["algo"] == "downpour"
    state = state_of(ws)
    assert state["allocation"] is None
    tf_config = {t["name"]: t["address"] for t in state["tasks"]}
    assert set(tf_config.values()) == set(slurm_cluster.addresses.values())
    # warm starts (the default): a seed step per node imported TensorFlow once, and each task's
    # own step had it fork the program
    assert all(t["handle"].get("forked") for t in state["tasks"]), state["tasks"]
    for node in ("n1", "n2", "n3"):
        seed_log = (ws / "work" / "_seed" / node / "seed.log").read_text()
        assert "seed ready in" in seed_log, seed_log


@pytest.mark.full
@pytest.mark.cluster
def test_the_users_keras_model_trains_on_slurm(ws: Path, slurm_cluster: SlurmTestbed) -> None:
    """examples/tabular from its own folder on a real Slurm: its package is staged into the
    shared code folder, each step reads the shards by path, the job is gone after."""
    project = example_with_data("tabular", ws / "project")
    env = _env(ws, slurm_cluster)
    args = _args(
        "algo=hogwild",
        "model._target_=tabular.models.build",
        "data=tfrecord",
        "data.train=data/train-*.tfrecord",
        "data.eval=data/eval.tfrecord",
        "trainer.max_steps=100",
        "trainer.checkpoint_steps=100",
    )
    try:
        proc = tfplan(project, "apply", "--auto-approve", *args, env=env, timeout=400)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
        result = json.loads((ws / "out" / "result.json").read_text())
        assert result["status"] == "succeeded" and result["global_step"] >= 100
        assert (ws / "work" / "_code" / "tabular" / "models.py").is_file()
        assert _squeue(slurm_cluster) == []
    finally:
        cleanup(project, slurm_cluster)


def test_status_logs_and_destroy_leave_squeue_empty(ws: Path, slurm_cluster: SlurmTestbed) -> None:
    env = _env(ws, slurm_cluster)
    args = _args(*_fake(ws, steps="2000", step_secs="0.05", worker_secs="600"))
    tfplan(ws, "apply", "--auto-approve", "--detach", *args, env=env, check=True)
    wait_until(lambda: "step=" in (ws / "work" / "worker-0" / "task.log").read_text(), 60, "a step")
    status = tfplan(ws, "status", "--json", env=env, check=True)
    data = json.loads(status.stdout)
    assert data["backend"] == "slurm" and data["allocation"]["id"]
    rows = {r["task"]: r for r in data["tasks"]}
    assert {r["state"] for r in rows.values()} == {"running"}
    assert {r["host"] for r in rows.values()} == {"n1", "n2", "n3"}
    assert rows["worker/0"]["handle"]["step"] == "worker-0.0"
    assert data["supervisor"]["detached"] and data["supervisor"]["alive"]
    table = tfplan(ws, "status", env=env, check=True)
    assert f"job {data['allocation']['id']} step ps-0.0" in table.stdout
    logs = tfplan(ws, "logs", "worker/0", env=env, check=True)
    assert "worker/0" in logs.stdout and "step=" in logs.stdout
    assert len(_squeue(slurm_cluster)) == 1
    destroyed = tfplan(ws, "destroy", env=env, check=True)
    assert "Destroy complete! 3 task(s) stopped" in destroyed.stdout
    assert _squeue(slurm_cluster) == []


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {"partition": "nosuch"},
            "cluster.options.partition: no partition 'nosuch'; available: debug",
        ),
        ({"nodes": 5}, "sbatch refuses the request"),
        ({"sbatch_args": ["--bogus-option"]}, "sbatch refuses the request"),
        ({"partiton": "debug"}, "cluster.options.partiton: no such Slurm option"),
    ],
    ids=["unknown-partition", "larger-than-the-cluster", "bad-sbatch-option", "typo"],
)
def test_bad_input_is_one_line_and_queues_nothing(
    ws: Path, slurm_cluster: SlurmTestbed, options: dict[str, object], expected: str
) -> None:
    env = _env(ws, slurm_cluster, **options)
    proc = tfplan(ws, "apply", "--auto-approve", *_args(*_fake(ws)), env=env)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert _squeue(slurm_cluster) == []


def test_unreachable_slurm_is_one_line(ws: Path, slurm_cluster: SlurmTestbed) -> None:
    env = _env(ws, slurm_cluster)
    bad_conf = ws / "elsewhere.conf"
    bad_conf.write_text(
        slurm_cluster.conf.read_text().replace(
            f"SlurmctldPort={slurm_cluster.ctld_port}", "SlurmctldPort=1"
        )
    )
    env["SLURM_CONF"] = str(bad_conf)
    proc = tfplan(ws, "apply", "--auto-approve", *_args(*_fake(ws)), env=env, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "Slurm is not reachable" in proc.stderr or "did not answer" in proc.stderr
    assert _squeue(slurm_cluster) == []


@pytest.mark.full
def test_a_job_cancelled_from_outside_ends_the_run(ws: Path, slurm_cluster: SlurmTestbed) -> None:
    env = _env(ws, slurm_cluster)
    run = ApplyRun(
        ws, _args(*_fake(ws, steps="5000", step_secs="0.05", worker_secs="600")), env=env
    )
    run.wait_for(r"worker/0\s+\| step=", timeout=90)
    job = state_of(ws)["allocation"]["id"]
    slurm_cluster.run("scancel", job)
    code = run.finish(timeout=120)
    assert code == 1
    assert f"Slurm job {job} ended outside tfplan" in run.text()
    assert _squeue(slurm_cluster) == []
    assert all(t["status"] != "running" for t in state_of(ws)["tasks"])


@pytest.mark.full
@pytest.mark.cluster
def test_a_killed_ps_is_restarted_inside_the_allocation(
    ws: Path, slurm_cluster: SlurmTestbed
) -> None:
    env = _env(ws, slurm_cluster)
    args = _args(
        "trainer.max_steps=1200",
        "trainer.log_steps=50",
        "trainer.checkpoint_steps=100",
        "lifecycle.restart.backoff_secs=0.2",
    )
    run = ApplyRun(ws, args, env=env)
    fault = run.wait_step(300, timeout=300, task="worker/0")
    ps = next(t for t in state_of(ws)["tasks"] if t["name"] == "ps/0")
    steps = dict(
        line.split()[::-1]
        for line in slurm_cluster.run("squeue", "-h", "-s", "-o", "%i %j").stdout.splitlines()
    )
    # Both workers are frozen while the ps dies and comes back, so the 900 steps left cannot
    # end the job before the restart: an order of events, not a race against the machine's
    # speed (the async default trains them in a few seconds). Their programs are frozen where
    # they run, as children of their nodes' warm seeds: a SIGSTOP through Slurm stops a forked
    # task's step client only (docs/slurm_notes.md). The frozen chief shows it landed.
    workers = [p for t in ("worker/0", "worker/1") for p in _forked_programs(ws, t)]
    assert len(workers) == 2, workers
    for pid in workers:
        os.killpg(pid, signal.SIGSTOP)
    try:
        slurm_cluster.run("scancel", "--signal=KILL", steps["ps-0.0"])
        run.wait_for(r"ps/0 failed \(exit code 137\): restarting", timeout=60, after=fault)
        # forked again from n1's warm seed (no standby: a forked restart is as quick), in a
        # step of its own whose client the seed's child never outlives
        run.wait_for(r"ps/0: restarted on n\d \(restart 1;", timeout=120, after=fault)
        chief_steps = [step for task, step in run.steps(after=fault) if task == "worker/0"]
        assert max(chief_steps, default=0) < 1200, "the chief trained to the end while frozen"
    finally:
        for pid in workers:
            os.killpg(pid, signal.SIGCONT)
    # something left in the job's snapshot folder on n1 (as a ps killed for good leaves its
    # snapshots): the restarted ps removes only its own when it ends, the release the rest
    root = Path(os.path.dirname(snapshot_folder("/dev/shm", str(ws / "out"), 0)))
    assert (root / "ps0").is_dir()
    (root / "left-by-a-killed-ps").mkdir()
    code = run.finish(timeout=400)
    assert code == 0, run.text()[-4000:]
    assert not root.exists(), sorted(root.rglob("*"))
    restarted = next(t for t in state_of(ws)["tasks"] if t["name"] == "ps/0")
    assert restarted["host"] == ps["host"] and restarted["port"] == ps["port"]
    assert restarted["handle"]["step"] == "ps-0.1" and restarted["restarts"] == 1
    assert restarted["handle"].get("forked") and not state_of(ws)["standbys"]
    # the chief recovered (a step cancelled by the restarted ps is a lost peer: it once exited 1
    # here) and restored that ps alone, from its snapshot on n1's memory or the checkpoint,
    # whichever is newer
    restored = re.search(
        r"^worker/0\s+\| ps/0 restored from its (snapshot|checkpoint) of step", run.text(), re.M
    )
    assert restored, run.text()[-4000:]
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["global_step"] >= 1200
    assert [r["ps"] for r in result["ps_recoveries"]] == [0], result["ps_recoveries"]
    assert "Parameter servers recovered while training: ps/0 from its " in run.text()
    assert _squeue(slurm_cluster) == []


@pytest.mark.full
def test_a_sweep_runs_one_slurm_job_per_point(ws: Path, slurm_cluster: SlurmTestbed) -> None:
    env = _env(ws, slurm_cluster)
    script = ws / "fake_task.py"
    script.write_text(FAKE_TASK)
    proc = tfplan(
        ws,
        "apply",
        "-m",
        "--auto-approve",
        "--concurrency",
        "2",
        "cluster=slurmtest",
        "experiment.id=sw",
        "lifecycle.stop_grace_secs=2",
        "recipe=command",
        f"recipe.command='{sys.executable} {script} steps=3 step_secs=0.05'",
        "trainer.max_steps=10,20",
        env=env,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr
    jobs = set(re.findall(r"submitted Slurm job (\d+)", out))
    assert len(jobs) == 2, out[-3000:]  # one job per point
    assert "Sweep complete! 2 succeeded, 0 failed." in out
    assert _squeue(slurm_cluster) == []
