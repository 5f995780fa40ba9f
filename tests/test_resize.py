"""Workers join and leave a running job in place, and a running job is told a new step budget.

Real processes throughout: a detached downpour job (``data.shard=none``: every worker reads all
of the data in its own order) grows from 2 to 4 workers and back while it trains, then is told
where to stop and ends by itself. Nothing that kept running restarts: the parameter server's
process is the same one from the first apply to its own exit, and no step is rolled back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    alive,
    base_overrides,
    free_port_base,
    kill_groups,
    paced,
    recorded_groups,
    state_of,
    tfplan,
)
from slurm_testbed import SlurmTestbed
from test_apply_ssh import _conf_with_cluster, _host
from test_slurm import _env as slurm_env
from testbed import NetnsTestbed

# ps_grace_secs: the ps must have time to end by itself after the chief (it is checked)
ELASTIC = [
    "algo=downpour",
    "data.shard=none",
    "trainer.log_steps=50",
    "lifecycle.ps_grace_secs=30",
    # the chief waits for every done token however slow the machine (the told end asserts 4 of 4)
    "+recipe.env.TFPLAN_DONE_WAIT_SECS=600",
    # the job trains without end until the story tells it where to stop: paced, so that it
    # waits for the joiners' start (TensorFlow's import) without taking every core from them
    *paced(0.05),
]
FOREVER_STEPS = "trainer.max_steps=100000000"
STEP = re.compile(r"\bstep=(\d+)")


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    if (tmp_path / ".tfplan").exists():
        tfplan(tmp_path, "destroy", "--auto-approve", timeout=120)
    kill_groups(recorded_groups(tmp_path))


def tasks(ws: Path) -> dict[str, dict[str, object]]:
    return {t["name"]: t for t in state_of(ws)["tasks"]}


class Job:
    """The CLI on one experiment, as a user runs it (``env`` selects a copied conf/).

    The waits read each task's log file where the state says it is (every host of these test
    beds shares this machine's files) rather than polling ``tfplan status`` in a loop: each CLI
    call costs a second of CPU, taken from the job whose events the test waits for. The CLI
    itself is checked where the story asks (:meth:`status`, :meth:`log`).
    """

    def __init__(self, ws: Path, env: dict[str, str] | None = None) -> None:
        self.ws, self.env = ws, env
        self.run_hook: Callable[[], None] | None = None  # after each command (a check)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = tfplan(self.ws, *args, timeout=timeout, env=self.env)
        if self.run_hook is not None:
            self.run_hook()
        return done

    def status(self) -> dict[str, dict[str, object]]:
        done = self.run("status", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return {row["task"]: row for row in json.loads(done.stdout)["tasks"]}

    def lines(self, task: str) -> list[str]:
        """The task's log as it is now (its current life), read from its file."""
        record = tasks(self.ws).get(task)
        if record is None:
            return []
        try:
            return Path(str(record["log_path"])).read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def steps(self, task: str) -> list[int]:
        return [int(m.group(1)) for line in self.lines(task) if (m := STEP.search(line))]

    def step(self) -> int:
        """The highest global step any running task has logged."""
        return max((max(self.steps(t), default=0) for t in tasks(self.ws)), default=0)

    def training(self, names: list[str]) -> bool:
        return all(self.steps(n) for n in names)

    def log(self, task: str) -> list[str]:
        """The task's own lines, read where it runs (``tfplan logs``)."""
        done = self.run("logs", task, "--all-lines")
        return [line.split(" | ", 1)[-1] for line in done.stdout.splitlines()]

    def first_step(self, task: str) -> int | None:
        for line in self.lines(task):
            if line.startswith("step=") and "first step" in line:
                return int(line.split()[0].removeprefix("step="))
        return None


def wait_for(what: str, check: Callable[[], bool], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _left_running(ws: Path) -> list[str]:
    """What the state records that still runs: each task's and warm seed's name and group."""
    state = json.loads(next((ws / ".tfplan").glob("*/state.json")).read_text())
    handles = [(t["name"], t.get("handle") or {}) for t in state["tasks"]]
    named = {int(h["pgid"]): name for name, h in handles if "pgid" in h}
    for seed in ((state.get("allocation") or {}).get("data") or {}).get("seeds") or []:
        named[int(seed["pgid"])] = f"warm seed on {seed['host']}"
    return [f"{named.get(g, '?')} (group {g})" for g in recorded_groups(ws) if alive(g)]


def _nothing_left_soon(ws: Path) -> None:
    """Every process the state records is gone: at once, or within a few seconds for one whose
    exit the end of the job has already seen begin (a task's interpreter finishing; CI saw a
    group still there as apply returned, once in four runs); named if one stays."""
    deadline = time.monotonic() + 20
    while (left := _left_running(ws)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running after the job's end: {left}"


def grow_shrink_and_end(job: Job, base: list[str]) -> None:
    """2 -> 4 -> 2 workers on a running detached downpour job, then a told step budget: the
    whole story, checked at each step; nothing that runs restarts, nothing rolls back."""
    started = job.run("apply", "--auto-approve", "--detach", *base, FOREVER_STEPS)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr
    wait_for("both workers to train", lambda: job.training(["worker/0", "worker/1"]))
    ps_pid = tasks(job.ws)["ps/0"]["handle"]["pid"]  # type: ignore[index]

    # Scale out: the plan adds two workers and touches nothing that runs.
    four = [*base, FOREVER_STEPS, "cluster.workers=4"]
    planned = job.run("plan", "--json", "--no-save", *four)
    assert planned.returncode == 0, planned.stderr
    actions = {c["task"]: c["action"] for c in json.loads(planned.stdout)["changes"]}
    assert actions == {
        "ps/0": "no-op",
        "worker/0": "no-op",
        "worker/1": "no-op",
        "worker/2": "create",
        "worker/3": "create",
    }
    before = job.step()
    grown = job.run("apply", "--auto-approve", "--detach", *four)
    assert grown.returncode == 0, grown.stdout[-3000:] + grown.stderr
    assert "the job has 4 training replica(s) taking part now" in grown.stdout
    assert "resuming" not in grown.stdout  # nothing resumes: the job goes on
    wait_for(
        "the new workers' first steps",
        lambda: job.first_step("worker/2") is not None and job.first_step("worker/3") is not None,
    )
    # They joined at the job's step, not at a checkpoint's, and the ps is the same process.
    assert min(job.first_step("worker/2") or 0, job.first_step("worker/3") or 0) >= before
    assert tasks(job.ws)["ps/0"]["handle"]["pid"] == ps_pid  # type: ignore[index]
    assert any("the job has 4 replicas now" in line for line in job.log("ps/0"))
    wait_for("all four to train", lambda: job.training([f"worker/{i}" for i in range(4)]))

    # Scale in: the two newest workers leave after a push, with their done tokens.
    shrunk = job.run("apply", "--auto-approve", "--detach", *base, FOREVER_STEPS)
    assert shrunk.returncode == 0, shrunk.stdout[-3000:] + shrunk.stderr
    for task in ("worker/2", "worker/3"):
        assert f"{task} left the job (exit code 0)" in shrunk.stdout, shrunk.stdout[-3000:]
    assert set(tasks(job.ws)) == {"ps/0", "worker/0", "worker/1"}
    assert tasks(job.ws)["ps/0"]["handle"]["pid"] == ps_pid  # type: ignore[index]

    # A new step budget, told: the job ends by itself there, the ps after 4 done tokens.
    planned = job.run("plan", "--no-save", *base, "trainer.max_steps=50000000")
    assert "told to the running task (no restart, no rollback)" in planned.stdout
    assert "Plan: 0 to add, 3 to change, 0 to destroy." in planned.stdout, planned.stdout[-4000:]
    # a little ahead (the job trains on meanwhile, every step costs the machine's CPU: a few
    # seconds' worth); had the job passed it before it is told, it stops at once all the same
    stop_at = job.step() + 200
    ended = job.run("apply", "--auto-approve", *base, f"trainer.max_steps={stop_at}", timeout=600)
    assert ended.returncode == 0, ended.stdout[-3000:] + ended.stderr
    assert f"trainer.max_steps is {stop_at} now (told)" in ended.stdout
    assert "ps/0 done: 4 of 4 replicas finished" in ended.stdout, ended.stdout[-4000:]
    assert "Training complete" in ended.stdout
    for task in ("ps/0", "worker/0", "worker/1"):  # no task ever rolled back
        assert not [line for line in job.log(task) if "back from global step" in line]
    _nothing_left_soon(job.ws)


@pytest.mark.full
def test_workers_join_and_leave_on_ssh_hosts(ws: Path, netns_testbed: NetnsTestbed) -> None:
    """The whole story (:func:`grow_shrink_and_end`) on three namespace hosts over SSH: the ps
    on h1, the workers spread. The process backend's local transport takes the same steps in
    test_a_new_worker_killed_while_joining_is_restarted_and_the_job_still_ends (scale out, a
    told end), test_a_worker_told_to_leave_in_live_json_leaves_after_a_push, docs/resize.md's
    commands (tests/test_docs.py) and bench_resize's smoke test (out, in, a told end, nothing
    rolled back or left), so the story runs once more only here (the suite's budget)."""
    hosts = [_host(t, cpu_slots=2) for t in netns_testbed.targets()]
    env = _conf_with_cluster(
        ws,
        "three",
        {
            "hosts": hosts,
            "ps": 1,
            "workers": 2,
            "port_base": 2600,
            "ssh_known_hosts": str(netns_testbed.known_hosts),
            "workdir": str(ws / "work"),
            "output_dir": str(netns_testbed.shared_dir / "resize"),
        },
    )
    base = ["cluster=three", "experiment.id=t", *ELASTIC]
    grow_shrink_and_end(Job(ws, env), base)
    placed = {t["name"]: t["host"] for t in state_of(ws)["tasks"]}
    assert len(set(placed.values())) >= 2, placed  # the job really spans hosts
    result = json.loads((netns_testbed.shared_dir / "resize" / "result.json").read_text())
    assert result["global_step"] > 0
    for task in ("worker/2", "worker/3"):  # the hosts write their logs into this machine's ws
        log = (ws / "work" / task.replace("/", "-") / "task.log").read_text()
        assert f"{task} leaves the job at step=" in log and "back from global step" not in log


@pytest.mark.full
def test_a_new_worker_killed_while_joining_is_restarted_and_the_job_still_ends(ws: Path) -> None:
    """worker/3 is SIGKILLed before its first step: the supervisor restarts it as any task
    (its done token still counts in the told membership), it joins, and the job ends by itself
    after 4 done tokens with nothing rolled back."""
    base = [*base_overrides(ws, free_port_base(12)), *ELASTIC]
    job = Job(ws)
    started = job.run("apply", "--auto-approve", "--detach", *base, FOREVER_STEPS)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr
    wait_for("both workers to train", lambda: job.training(["worker/0", "worker/1"]))
    ps_pid = tasks(ws)["ps/0"]["handle"]["pid"]  # type: ignore[index]
    grown = job.run(
        "apply", "--auto-approve", "--detach", *base, FOREVER_STEPS, "cluster.workers=4"
    )
    assert grown.returncode == 0, grown.stdout[-3000:] + grown.stderr
    joiner = tasks(ws)["worker/3"]
    # apply returns once it started: it is importing TensorFlow, building its graph, joining
    os.killpg(int(joiner["handle"]["pgid"]), signal.SIGKILL)  # type: ignore[index]
    wait_for(
        "worker/3 to be restarted",
        lambda: int(tasks(ws)["worker/3"].get("restarts") or 0) >= 1,  # type: ignore[call-overload]
    )
    wait_for("all four to train", lambda: job.training([f"worker/{i}" for i in range(4)]))
    assert tasks(ws)["ps/0"]["handle"]["pid"] == ps_pid  # type: ignore[index]
    stop_at = job.step() + 200  # a little ahead (see grow_shrink_and_end)
    ended = job.run("apply", "--auto-approve", *base, f"trainer.max_steps={stop_at}", timeout=600)
    assert ended.returncode == 0, ended.stdout[-3000:] + ended.stderr
    assert "ps/0 done: 4 of 4 replicas finished" in ended.stdout, ended.stdout[-4000:]
    for task in ("ps/0", "worker/0", "worker/1", "worker/3"):
        assert not [line for line in job.log(task) if "back from global step" in line]
    _nothing_left_soon(ws)


@pytest.mark.full
def test_a_worker_told_to_leave_in_live_json_leaves_after_a_push(ws: Path) -> None:
    """How a worker leaves where the launcher cannot signal (Kubernetes): its name under
    ``leave`` in live.json, written here by hand into every running task's folder as the
    kubelet writes the ConfigMap's key; the recipes' own reaction, with real processes."""
    base = [*base_overrides(ws, free_port_base(12)), *ELASTIC, "cluster.workers=3"]
    job = Job(ws)
    started = job.run("apply", "--auto-approve", "--detach", *base, FOREVER_STEPS)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr
    wait_for("the workers to train", lambda: job.training(["worker/0", "worker/1", "worker/2"]))
    told = json.dumps({"replicas": 3, "leave": ["worker/2"]})
    for task in tasks(ws).values():
        (Path(str(task["workdir"])) / "live.json").write_text(told)
    wait_for("worker/2 to leave", lambda: tasks(ws)["worker/2"]["status"] == "succeeded")
    log = job.log("worker/2")
    assert any(line.startswith("worker/2 leaves the job at step=") for line in log), log[-20:]
    assert job.training(["worker/0", "worker/1"])  # the others go on
    assert not [line for line in job.log("worker/0") if "back from global step" in line]


@pytest.mark.full
def test_a_resize_while_the_ps_restarts_is_serialised_with_it_or_refused(ws: Path) -> None:
    """ps/0 is killed and its restart is due in 60 s (backoff): the plan says the resize goes
    with the ps's restart and what that rolls back. Apply then either carries it out (the
    supervisor lets go before restarting the ps: one new ps, four workers, the job resumes
    from its checkpoint) or, had the supervisor restarted the ps first, refuses in one line."""
    base = [
        *base_overrides(ws, free_port_base(12)),
        *ELASTIC,
        "lifecycle.restart.backoff_secs=60",
        "trainer.checkpoint_steps=200",
    ]
    job = Job(ws)
    started = job.run("apply", "--auto-approve", "--detach", *base, FOREVER_STEPS)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr
    wait_for("both workers to train", lambda: job.training(["worker/0", "worker/1"]))
    ps = tasks(ws)["ps/0"]
    os.killpg(int(ps["handle"]["pgid"]), signal.SIGKILL)  # type: ignore[index]
    wait_for("the ps to be seen down", lambda: job.status()["ps/0"]["state"] != "running")
    four = [*base, FOREVER_STEPS, "cluster.workers=4"]
    planned = job.run("plan", "--no-save", *four)
    assert planned.returncode == 0, planned.stderr
    assert "not in place: ps/0 restart(s), and the resize goes with it" in planned.stdout
    assert "#   cost: rolls back to " in planned.stdout
    assert "starts with the restarted job" in planned.stdout
    applied = job.run("apply", "--auto-approve", "--detach", *four)
    if applied.returncode != 0:  # the supervisor restarted the ps first: refused, one line
        lines = applied.stderr.strip().splitlines()
        assert len(lines) == 1 and "run `tfplan plan` again" in lines[0], applied.stderr
        return
    assert "the job has 4 training replica(s)" not in applied.stdout  # not in place
    wait_for("all four to train", lambda: job.training([f"worker/{i}" for i in range(4)]))
    assert tasks(ws)["ps/0"]["handle"]["pid"] != ps["handle"]["pid"]  # type: ignore[index]


@pytest.mark.full
@pytest.mark.slurm
@pytest.mark.netns
def test_workers_join_and_leave_as_steps_of_the_same_slurm_job(
    ws: Path, slurm_cluster: SlurmTestbed
) -> None:
    """On a real Slurm: new workers are new steps of the job that holds the allocation (two
    slots on each of three nodes), leavers' steps end; the job is the same from start to end."""
    base = ["cluster=slurmtest", "experiment.id=t", *ELASTIC]
    job = Job(ws, slurm_env(ws, slurm_cluster, tasks_per_node=2))
    jobs: set[str] = set()

    def held() -> None:
        allocation = state_of(ws).get("allocation") or {}
        jobs.add(str(allocation.get("id")))

    job.run_hook = held
    grow_shrink_and_end(job, base)
    assert len(jobs - {"None"}) == 1, jobs  # one Slurm job held the allocation throughout
    assert slurm_cluster.run("squeue", "-h").stdout.strip() == ""  # released at the end


def test_what_cannot_be_resized_is_refused_or_planned_as_a_restart(ws: Path) -> None:
    base = [*base_overrides(ws, free_port_base(12)), *ELASTIC]
    none_left = tfplan(ws, "plan", "--no-save", *base, "cluster.workers=0")
    assert none_left.returncode == 1 and "cluster.workers" in none_left.stderr
    assert len(none_left.stderr.strip().splitlines()) == 1
    too_many = tfplan(ws, "plan", "--no-save", *base, "cluster.workers=40")
    assert too_many.returncode == 1 and "cpu_slots" in too_many.stderr, too_many.stderr
    assert len(too_many.stderr.strip().splitlines()) == 1
