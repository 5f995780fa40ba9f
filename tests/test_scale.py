"""Clusters of hundreds of tasks: apply, supervision, status and destroy whose cost follows the
hosts, not the tasks.

Every task is a program that waits for a signal (``sleep``), started through the real CLI and
supervised by the real background supervisor; the SSH bed is ten network namespaces with an
sshd each. What is checked is counted, never timed (bench/bench_scale.py measures the times):
every task runs, tfplan adds one process per task (its wrapper), the supervisor's processes and
threads do not grow with the tasks, and nothing is left after destroy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import base_overrides, fake_overrides, free_port_base, tfplan
from scale_helpers import (
    ScaleRun,
    conf_with,
    group_sizes,
    local_cluster,
    netns_cluster,
    tree_usage,
)
from slurm_testbed import SlurmTestbed, slurm_missing
from testbed import NetnsTestbed


def check_scaled_run(run: ScaleRun, tasks: int, hosts: int) -> None:
    run.apply()
    _, status = run.status()
    rows = status["tasks"]
    not_running = [r for r in rows if r["state"] != "running"]  # type: ignore[union-attr]
    assert len(rows) == tasks and not not_running, [
        (r["state"], r["detail"]) for r in not_running[:3]
    ]
    groups = run.groups()
    assert len(groups) == tasks
    # each task's group: its wrapper and the program, nothing else of tfplan's
    assert set(group_sizes(groups).values()) == {2}
    supervisor = run.supervisor_pid()
    assert supervisor is not None
    usage = tree_usage(supervisor)
    # the supervisor and one watcher per host (over SSH the watcher runs on the host, and
    # this side is one connection, no process)
    assert usage.processes <= 1 + hosts, usage
    assert usage.threads <= 3 * hosts + 8, usage
    run.destroy()
    assert set(group_sizes(groups).values()) == {0}
    assert run.state()["tasks"] == []


@pytest.mark.full
def test_a_thousand_idle_tasks_on_one_host(tmp_path: Path) -> None:
    run = ScaleRun(tmp_path, local_cluster(tmp_path, 1000))
    try:
        check_scaled_run(run, 1000, hosts=1)
    finally:
        run.cleanup()


@pytest.fixture(scope="module")
def ten_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsTestbed]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    bed = NetnsTestbed(tmp_path_factory.mktemp("ten"), count=10, tag="x")
    try:
        try:
            bed.setup()
        except Exception as exc:  # noqa: BLE001 - we are root: this must fail, loudly
            pytest.fail(f"could not build the 10-host netns testbed as root: {exc}")
        yield bed
    finally:
        problems = bed.teardown()
        assert not problems, problems


@pytest.mark.full
@pytest.mark.netns
def test_a_hundred_tasks_on_each_of_ten_ssh_hosts(tmp_path: Path, ten_hosts: NetnsTestbed) -> None:
    run = ScaleRun(tmp_path, netns_cluster(tmp_path, ten_hosts, 100))
    try:
        check_scaled_run(run, 1000, hosts=10)
    finally:
        run.cleanup()


@pytest.fixture(scope="module")
def wide_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmTestbed]:
    """A Slurm bed of three nodes with 34 CPUs each (declared: the steps only sleep)."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm test bed needs root for network namespaces (CI runs as root)")
    missing = slurm_missing()
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)}): run scripts/setup.sh")
    bed = SlurmTestbed(tmp_path_factory.mktemp("wide"), cpus=34)
    try:
        bed.start()
        bed.wait_ready()
        yield bed
    finally:
        bed.stop()


@pytest.mark.full
@pytest.mark.slurm
@pytest.mark.netns
def test_a_hundred_steps_in_one_slurm_job(tmp_path: Path, wide_slurm: SlurmTestbed) -> None:
    """One job, 102 steps (34 per node), each an srun client on this machine: one watcher
    follows them all, status answers for all, and destroy leaves squeue empty."""
    cluster = {
        "backend": "slurm",
        "ps": 0,
        "workers": 102,
        "chief": "worker0",
        "evaluator": False,
        "port_base": 3100,
        "port_range": 40,
        "python": sys.executable,
        "workdir": str(tmp_path / "work"),
        "output_dir": str(tmp_path / "out"),
        "options": {"nodes": 3, "tasks_per_node": 34, "partition": wide_slurm.partition},
    }
    env = {**wide_slurm.env(), **conf_with(tmp_path, cluster)}
    run = ScaleRun(tmp_path, env)
    try:
        run.apply()
        _, status = run.status()
        rows = status["tasks"]
        assert [r["state"] for r in rows] == ["running"] * 102  # type: ignore[union-attr]
        assert {r["host"] for r in rows} == {"n1", "n2", "n3"}  # type: ignore[union-attr]
        supervisor = run.supervisor_pid()
        assert supervisor is not None
        # the supervisor and one watcher (the srun clients are the tasks' own processes,
        # started by the apply that detached)
        usage = tree_usage(supervisor)
        assert usage.processes <= 2 and usage.threads <= 11, usage
        groups = run.groups()
        assert len(groups) == 102
        run.destroy()
        assert set(group_sizes(groups).values()) == {0}
        squeue = subprocess.run(
            ["squeue", "-h", "-o", "%i"],
            env={**os.environ, **wide_slurm.env()},
            capture_output=True,
            text=True,
            check=True,
        )
        assert squeue.stdout.strip() == ""
    finally:
        run.cleanup()


def test_a_large_apply_shows_progress_and_a_failure_stops_everything_it_started(
    tmp_path: Path,
) -> None:
    """40 tasks start in parallel; the 30th cannot (a folder is in the way of its log, which
    preflight does not check): the apply stops every task it had started, says which failed
    in one line, and records none."""
    port = free_port_base(50)
    (tmp_path / "work" / "worker-29" / "task.log").mkdir(parents=True)
    args = [
        *base_overrides(tmp_path, port),
        "cluster.port_range=50",
        "cluster.ps=0",
        "cluster.workers=40",
        "cluster.hosts.0.cpu_slots=40",
        *fake_overrides(tmp_path),
    ]
    proc = tfplan(tmp_path, "apply", "--auto-approve", *args)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "worker/29" in proc.stderr
    state = tmp_path / ".tfplan" / "t" / "state.json"
    assert not state.exists() or '"tasks": []' in state.read_text()
    started = [line for line in proc.stdout.splitlines() if "tfplan | started " in line]
    assert started, proc.stdout[-2000:]  # the piped progress lines
    assert "Stopped" in proc.stdout
    assert running_in(tmp_path / "work") == []


def running_in(folder: Path) -> list[int]:
    """Live processes whose working directory is under ``folder``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if Path(cwd).is_relative_to(folder):
                found.append(int(entry))
    return found
