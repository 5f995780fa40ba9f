"""The Spark backend on a real Spark standalone cluster (a master and three workers in network
namespaces: tests/spark_testbed.py).

Through the real CLI: plan shows the spark-submit request and executors "known after apply";
apply submits one application whose executors each run a tfplan agent, binds the plan's places to
the agents' hosts, starts every task through them, streams their logs, supervises, and ends the
application when training is done (nothing left on any worker host); a ps killed inside its
executor is restarted there; a killed executor is replaced by Spark and its task restarted; destroy
mid-training ends everything; bad input is one line and starts nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    FAKE_TASK,
    kill_groups,
    paced,
    recorded_groups,
    state_of,
    tfplan,
    wait_until,
)
from chaos_helpers import ApplyRun
from spark_testbed import SparkTestbed

from tfplan.backends.spark import agent

pytestmark = [pytest.mark.spark]


@pytest.fixture
def ws(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """The test's folder; a test on the bed runs its clients (tfplan, hence spark-submit and
    the driver) with the bed's environment, as a machine of that cluster would: its
    spark-defaults.conf (the administrator's JVM options, quick-starting here), its scratch."""
    if "spark_cluster" in request.fixturenames:
        bed: SparkTestbed = request.getfixturevalue("spark_cluster")
        for key, value in bed.env().items():
            monkeypatch.setenv(key, value)
    yield tmp_path
    ApplyRun.kill_all(tmp_path)
    kill_groups(recorded_groups(tmp_path))  # a driver a failed test left behind, by group


def _args(ws: Path, bed: SparkTestbed | None, *extra: str, executors: int = 3) -> list[str]:
    master = bed.master_url if bed is not None else "spark://127.0.0.1:1"
    options = [
        f"cluster.options.master={master}",
        f"cluster.options.executors={executors}",
        "cluster.options.tasks_per_executor=2",
        "cluster.options.executor_cores=1",
        "cluster.options.executor_memory=512m",
        "cluster.options.start_timeout_secs=300",
    ]
    if bed is not None:
        options += [
            f"cluster.options.driver_host={bed.driver_host}",
            f"cluster.options.master_web_url={bed.web_url}",
        ]
    return [
        "cluster=spark",
        "experiment.id=t",
        f"cluster.python={sys.executable}",
        f"cluster.workdir={ws / 'work'}",
        f"cluster.output_dir={ws / 'out'}",
        "lifecycle.stop_grace_secs=2",
        *options,
        *extra,
    ]


def _fake(ws: Path, **args: str) -> list[str]:
    script = ws / "fake_task.py"
    script.write_text(FAKE_TASK)
    extra = " ".join(f"{k}={v}" for k, v in args.items())
    return ["recipe=command", f"recipe.command='{sys.executable} {script} {extra}'"]


def _nothing_left(bed: SparkTestbed, output: str, timeout: float = 60) -> None:
    """No application active on the master, no process of one on any worker host, and no
    process left of the drivers the apply's ``output`` says it started on this machine."""

    def clean() -> bool:
        state = bed.master_state()
        return not state.get("activeapps") and all(
            not bed.processes_on_worker(i) for i in range(len(bed.worker_addresses))
        )

    wait_until(clean, timeout, "the application and its executors gone from every worker")
    drivers = {int(pid) for pid in re.findall(r"\(driver pid (\d+),", output)}
    assert drivers, output[-2000:]
    wait_until(  # each driver's wrapper leads its process group
        lambda: not [p for p, s in agent.processes().items() if s.pgid in drivers],
        timeout,
        "the driver's processes gone from this machine",
    )


def test_plan_shows_the_request_and_executors_known_after_apply(ws: Path) -> None:
    planned = tfplan(ws, "plan", *_args(ws, None), check=True)
    out = planned.stdout
    assert "spark-submit --master spark://127.0.0.1:1 --deploy-mode client" in out
    assert "--conf spark.executor.cores=1 --conf spark.task.cpus=1 --conf spark.cores.max=3" in out
    assert '+ host       = "executor-0" (known after apply)' in out
    # each executor has its own ports: two executors on one host never clash
    ports = [int(p) for p in re.findall(r"\+ port       = (\d+)", out)]
    assert len(ports) == len(set(ports)) == 3, out


ROLES = "cluster.options.roles={ps: {executors: 1, cores: 1, memory: 512m}, worker: {executors: 2, cores: 2, memory: 768m, gpus: 1}}"


def test_plan_gives_each_listed_role_executors_of_its_own_shape(ws: Path) -> None:
    extra = ("cluster.options.executors=0", ROLES)
    planned = tfplan(ws, "plan", "--json", "--no-save", *_args(ws, None, *extra), check=True)
    hosts = {f"{t['role']}/{t['index']}": t["host"] for t in json.loads(planned.stdout)["tasks"]}
    assert hosts == {
        "ps/0": "ps-executor-0",
        "worker/0": "worker-executor-0",
        "worker/1": "worker-executor-1",
    }
    # a mapping of Spark settings from the command line (keys with dots: a whole mapping)
    conf = "cluster.options.conf={spark.ui.port: 4050}"
    out = tfplan(ws, "plan", *_args(ws, None, *extra, conf), check=True).stdout
    assert "--conf spark.ui.port=4050" in out
    assert "3 executor(s), 5 core(s) in all" in out
    assert "ps-executor-0 (ps): 1 executor(s) of 1 core(s), 512m, 2 task(s) each" in out
    assert (
        "worker-executor-0..worker-executor-1 (worker): 2 executor(s) of 2 core(s), 768m, "
        "1 GPU(s), 2 task(s) each (a resource profile)"
    ) in out
    # executors of several shapes in one application: resource profiles, dynamic allocation
    assert "--conf spark.dynamicAllocation.enabled=true" in out
    assert "--conf spark.dynamicAllocation.maxExecutors=3" in out
    ports = [int(p) for p in re.findall(r"\+ port       = (\d+)", out)]
    assert len(ports) == len(set(ports)) == 3, out
    # a worker is planned on its executor's first GPU; the chief (a separate one) and the ps
    # elsewhere: the chief goes to the default executors, which the roles listed leave
    chief = ("cluster.chief=separate", "cluster.options.executors=1", ROLES)
    planned = tfplan(ws, "plan", "--json", "--no-save", *_args(ws, None, *chief), check=True)
    after = {f"{t['role']}/{t['index']}": t for t in json.loads(planned.stdout)["tasks"]}
    assert after["chief/0"]["host"] == "executor-0"
    assert after["worker/0"]["devices"] == ["0"] and after["ps/0"]["devices"] == []


def test_the_driver_and_executors_start_with_the_quick_jit_unless_conf_says_otherwise() -> None:
    from tfplan.backends.spark.options import QUICK_JVM, parse_options

    base = {"master": "spark://m:7077"}
    settings = parse_options(base).submit_conf()
    assert settings["spark.driver.extraJavaOptions"] == QUICK_JVM == "-XX:TieredStopAtLevel=1"
    assert settings["spark.executor.extraJavaOptions"] == QUICK_JVM
    mine = {"spark.executor.extraJavaOptions": "-XX:+UseG1GC"}
    settings = parse_options({**base, "conf": mine}).submit_conf()
    assert settings["spark.executor.extraJavaOptions"] == "-XX:+UseG1GC"  # the user's, whole
    assert settings["spark.driver.extraJavaOptions"] == QUICK_JVM


def test_a_workers_planned_gpu_is_the_one_spark_gave_its_executor() -> None:
    from tfplan.backends.api import LaunchRequest
    from tfplan.backends.spark.backend import _on_gpus

    def request(devices: str) -> LaunchRequest:
        env = {"CUDA_VISIBLE_DEVICES": devices, "A": "1"}
        return LaunchRequest("worker/0", "worker", 0, "w-0", ("python",), env, "/w", "/w/log")

    assert _on_gpus(request("0"), ("3", "5")).env == {"CUDA_VISIBLE_DEVICES": "3", "A": "1"}
    assert _on_gpus(request("1,0"), ("3", "5")).env["CUDA_VISIBLE_DEVICES"] == "5,3"
    assert _on_gpus(request(""), ("3",)).env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU: none
    assert _on_gpus(request("0"), ()).env["CUDA_VISIBLE_DEVICES"] == "0"  # none given: as planned


@pytest.mark.parametrize(
    ("extra", "env", "expected"),
    [
        ((), {}, "cluster.options.master: spark://127.0.0.1:1 does not answer"),
        (("cluster.options.executor_memory=lots",), {}, "cluster.options.executor_memory: 'lots'"),
        (("+cluster.options.exectors=3",), {}, "cluster.options.exectors: no such Spark option"),
        ((), {"PATH": "/nonexistent", "JAVA_HOME": ""}, "no Java on this machine"),
        (("cluster.hosts=[{name: a, address: 10.0.0.1}]",), {}, "cluster.hosts: the spark backend"),
        (
            ("cluster.options.roles={pss: {executors: 1}}",),
            {},
            "cluster.options.roles.pss: not a role; use ps, chief, worker, evaluator",
        ),
        (
            ("cluster.options.roles={ps: {executors: 1, memory: lots}}",),
            {},
            "cluster.options.roles.ps.memory: 'lots' is not a JVM memory size",
        ),
        (
            ("cluster.options.executors=0", "cluster.options.roles={ps: {executors: 1}}"),
            {},
            "cluster.options.roles: no place takes worker tasks",
        ),
    ],
    ids=[
        "master-unreachable",
        "bad-memory",
        "typo",
        "no-java",
        "hosts-listed",
        "not-a-role",
        "role-memory",
        "role-unplaced",
    ],
)
def test_bad_input_is_one_line_and_starts_nothing(
    ws: Path, extra: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    proc = tfplan(ws, "apply", "--auto-approve", *_args(ws, None, *extra), env=env)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert not recorded_groups(ws)  # no driver was started


def test_an_unsupported_spark_is_refused(ws: Path) -> None:
    home = ws / "spark-3.1"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "spark-submit").write_text("#!/bin/sh\nexit 1\n")
    (home / "bin" / "spark-submit").chmod(0o755)
    (home / "version.py").write_text('__version__: str = "3.1.3"\n')
    proc = tfplan(
        ws, "apply", "--auto-approve", *_args(ws, None, f"cluster.options.spark_home={home}")
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"Spark 3.1 in {home} is not supported" in proc.stderr, proc.stderr


def test_the_agents_guard_ends_what_the_agent_started_when_the_agent_dies(tmp_path: Path) -> None:
    """The guard follows the agent's descendants, detached ones included (the agent is their
    subreaper), and kills them once the agent is gone: a killed executor leaves no task."""
    import multiprocessing

    ready = tmp_path / "pids"

    def fake_agent() -> None:
        agent._become_subreaper()
        agent._start_guard("test-mark")
        # a detached task, as tfplan's start script makes one (setsid, its parent exits)
        os.system(f"setsid sh -c 'sleep 600 & echo $! > {ready}' &")  # noqa: S605
        time.sleep(600)

    proc = multiprocessing.get_context("fork").Process(target=fake_agent)
    proc.start()
    wait_until(lambda: ready.exists() and ready.read_text().strip() != "", 30, "the task")
    task = int(ready.read_text())
    time.sleep(2 * agent.GUARD_TICK_SECS)  # seen by the guard
    assert task in agent.descendants(proc.pid or 0)
    os.kill(proc.pid or 0, signal.SIGKILL)
    proc.join()
    wait_until(lambda: not _alive(task), 30, "the task killed by the guard")


def test_the_guard_also_ends_a_task_it_never_saw_by_the_agents_mark(tmp_path: Path) -> None:
    """A task started after the guard's last look (here: one that was never the agent's
    descendant at all) still carries the agent's mark in its environment: the guard's last
    sweep ends it. Seen on the bed: an executor killed within half a second of a task's start
    left that task running, and its replacement was never started."""
    import multiprocessing

    ready = tmp_path / "pids"
    unmarked = tmp_path / "unmarked"

    def fake_agent() -> None:  # no subreaper: the orphans go to init, out of the guard's sight
        os.environ[agent.MARK_ENV] = "mark-1"
        agent.GUARD_TICK_SECS = 5.0  # its guard's first look now, its next after the agent died
        agent._start_guard("mark-1")
        time.sleep(0.5)  # the tasks start after that first look
        os.system(f"setsid sh -c 'sleep 600 & echo $! > {ready}' &")  # noqa: S605
        other = f"env {agent.MARK_ENV}=mark-2 setsid sh -c 'sleep 600 & echo $! > {unmarked}' &"
        os.system(other)  # noqa: S605 - another agent's: left alone
        time.sleep(600)

    proc = multiprocessing.get_context("fork").Process(target=fake_agent)
    proc.start()
    for path in (ready, unmarked):
        wait_until(lambda p=path: p.exists() and p.read_text().strip() != "", 30, "the tasks")
    task, other = int(ready.read_text()), int(unmarked.read_text())
    assert task not in agent.descendants(proc.pid or 0)  # never the agent's: only marked
    assert task in agent.marked("mark-1") and other not in agent.marked("mark-1")
    os.kill(proc.pid or 0, signal.SIGKILL)
    proc.join()
    try:
        wait_until(lambda: not _alive(task), 30, "the unseen task killed by the guard")
        assert _alive(other)
    finally:
        for pid in (task, other):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.cluster
def test_downpour_across_three_spark_workers_trains_and_leaves_nothing(
    ws: Path, spark_cluster: SparkTestbed
) -> None:
    args = _args(
        ws,
        spark_cluster,
        "algo=downpour",
        "trainer.max_steps=200",
        "trainer.log_steps=50",
        "trainer.checkpoint_steps=100",
    )
    proc = tfplan(ws, "apply", "--auto-approve", *args, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr
    assert "submitted the Spark application to " + spark_cluster.master_url in out
    bound = re.search(r"runs its agents on (.*)", out)
    assert bound, out
    assert all(address in bound.group(1) for address in spark_cluster.worker_addresses), out
    started = dict(re.findall(r"(ps/0|worker/0|worker/1): started on (executor-\d)", out))
    assert sorted(started.values()) == ["executor-0", "executor-1", "executor-2"], out
    assert "worker/0     | step=" in out and "Training complete" in out
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["global_step"] >= 200 and result["algo"] == "downpour"
    state = state_of(ws)
    assert state["allocation"] is None
    # every task ran on a Spark worker's host, at that worker's address: one task per worker
    addresses = {t["name"]: t["address"] for t in state["tasks"]}
    assert sorted(addresses.values()) == sorted(spark_cluster.worker_addresses), addresses
    assert all(t["handle"].get("forked") for t in state["tasks"]), state["tasks"]  # warm
    _nothing_left(spark_cluster, out)
    completed = [a["name"] for a in spark_cluster.master_state()["completedapps"]]
    assert "tfplan-t" in completed
    # the application and its agents are gone: `tfplan logs` reads the copy kept before the
    # application was given back (each task's whole log, its last line included)
    logs = tfplan(ws, "logs", "worker/0", check=True)
    assert "worker/0 finished after" in logs.stdout, logs.stdout[-2000:]
    assert "worker/0: its host cannot be read" in logs.stderr, logs.stderr
    assert "the copy kept at its end" in logs.stderr, logs.stderr


@pytest.mark.full
def test_a_killed_executor_is_replaced_then_status_logs_and_destroy_leave_nothing(
    ws: Path, spark_cluster: SparkTestbed
) -> None:
    """A detached job (one application for the two stories, each a Spark start saved):

    - SIGKILL of the executor JVM that hosts worker/0: its agent dies with it (the PySpark
      daemon hangs up on its workers), the agent's guard kills the task, Spark runs the agent's
      task again in a new executor, which registers anew; the background supervisor waits for the
      host, then restarts the task through the new agent;
    - then status, logs and destroy mid-training: nothing left anywhere."""
    args = _args(
        ws,
        spark_cluster,
        *_fake(ws, steps="100000", step_secs="0.05", worker_secs="600"),
        "lifecycle.restart.backoff_secs=0.2",
    )
    applied = tfplan(ws, "apply", "--auto-approve", "--detach", *args, check=True, timeout=600)
    log = ws / "work" / "worker-0" / "task.log"
    wait_until(lambda: "step=" in log.read_text(), 120, "a step")
    chief = next(t for t in state_of(ws)["tasks"] if t["name"] == "worker/0")
    host = spark_cluster.worker_addresses.index(chief["address"])
    executors = [
        pid
        for pid, line in spark_cluster.processes_on_worker(host)
        if "CoarseGrainedExecutorBackend" in line
    ]
    assert len(executors) == 1, spark_cluster.processes_on_worker(host)
    os.kill(executors[0], signal.SIGKILL)
    supervisor = ws / ".tfplan" / "t" / "supervisor.log"
    restarted = f"worker/0: restarted on {chief['host']} (restart 1;"
    wait_until(lambda: restarted in supervisor.read_text(), 180, "worker/0 restarted")
    assert "worker/0 failed (killed or vanished): restarting" in supervisor.read_text()
    registry = json.loads((ws / ".tfplan" / "t" / "backend" / "spark" / "agents.json").read_text())
    assert registry["agents"][chief["host"]]["attempt"] >= 1, registry  # Spark ran it again
    wait_until(lambda: "step=" in log.read_text(), 120, "a step of the restarted worker/0")

    status = tfplan(ws, "status", "--json", check=True)
    data = json.loads(status.stdout)
    assert data["backend"] == "spark" and data["allocation"]["id"].startswith("driver-")
    rows = {r["task"]: r for r in data["tasks"]}
    assert {r["state"] for r in rows.values()} == {"running"}, rows
    logs = tfplan(ws, "logs", "worker/0", check=True)
    assert "step=" in logs.stdout
    assert spark_cluster.master_state()["activeapps"]
    began = time.monotonic()
    destroyed = tfplan(ws, "destroy", check=True, timeout=120)
    print(f"destroy took {time.monotonic() - began:.1f}s")
    assert "Destroy complete! 3 task(s) stopped" in destroyed.stdout, destroyed.stdout
    _nothing_left(spark_cluster, applied.stdout)


@pytest.mark.full
@pytest.mark.cluster
def test_a_killed_ps_is_restarted_in_its_executor(ws: Path, spark_cluster: SparkTestbed) -> None:
    args = _args(
        ws,
        spark_cluster,
        "trainer.max_steps=1200",
        "trainer.log_steps=50",
        "trainer.checkpoint_steps=100",
        "lifecycle.restart.backoff_secs=0.2",
        *paced(0.01),  # at least 6 s of training: the first snapshot comes before its end
    )
    run = ApplyRun(ws, args)
    # killed once its first in-memory snapshot exists: the ps comes back from it (before that,
    # the chief restores every ps from the last checkpoint, a path of its own)
    first = run.wait_for(r"worker/0\s+\| snapshots: .* the first at step \d+", timeout=400)
    snapshot_step = int(run.lines[first][1].rsplit(" ", 1)[1])
    fault = run.wait_step(snapshot_step + 50, timeout=400, task="worker/0")
    tasks = {t["name"]: t for t in state_of(ws)["tasks"]}
    ps = tasks["ps/0"]
    # Both workers are frozen while the ps dies and comes back, so the steps left cannot end
    # the job before the restart: an order of events, not a race against the machine's speed.
    # Their programs were forked by their executors' warm seeds: the PIDs are the programs'.
    workers = [int(tasks[name]["handle"]["pid"]) for name in ("worker/0", "worker/1")]
    for pid in workers:
        os.killpg(pid, signal.SIGSTOP)
    try:
        os.kill(int(ps["handle"]["pid"]), signal.SIGKILL)
        run.wait_for(r"ps/0 failed \(exit code 137\): restarting", timeout=120, after=fault)
        run.wait_for(r"ps/0: restarted on executor-\d", timeout=120, after=fault)
        chief_steps = [step for task, step in run.steps(after=fault) if task == "worker/0"]
        assert max(chief_steps, default=0) < 1200, "the chief trained to the end while frozen"
    finally:
        for pid in workers:
            os.killpg(pid, signal.SIGCONT)
    code = run.finish(timeout=400)
    assert code == 0, run.text()[-4000:]
    restarted = next(t for t in state_of(ws)["tasks"] if t["name"] == "ps/0")
    assert restarted["host"] == ps["host"] and restarted["address"] == ps["address"]
    assert restarted["restarts"] == 1 and restarted["handle"].get("forked")
    assert re.search(r"^worker/0\s+\| ps/0 restored from its", run.text(), re.M), run.text()[-3000:]
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["global_step"] >= 1200
    assert [r["ps"] for r in result["ps_recoveries"]] == [0], result["ps_recoveries"]
    _nothing_left(spark_cluster, run.text())


@pytest.mark.full
def test_a_dead_driver_ends_the_run_with_its_reason_and_leaves_nothing(
    ws: Path, spark_cluster: SparkTestbed
) -> None:
    """The driver is the application: when its JVM dies, Spark ends the executors, their agents
    and (the agents' guards) every task; tfplan does not restart into the dead application but
    ends the run saying why (docs/spark.md: what a dead driver costs)."""
    args = _args(ws, spark_cluster, *_fake(ws, steps="100000", step_secs="0.05", worker_secs="600"))
    run = ApplyRun(ws, args)
    run.wait_for(r"worker/0\s+\| step=", timeout=300)
    driver = state_of(ws)["allocation"]["data"]["driver"]
    jvm = [
        pid
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if _group(pid) == int(driver["pgid"]) and b"SparkSubmit" in _cmdline(pid)
    ]
    assert len(jvm) == 1, jvm
    os.kill(jvm[0], signal.SIGKILL)
    code = run.finish(timeout=180)
    assert code == 1, run.text()[-3000:]
    assert f"the Spark driver (pid {driver['pid']}) ended" in run.text(), run.text()[-3000:]
    _nothing_left(spark_cluster, run.text())
    tasks = state_of(ws)["tasks"]
    assert all(t["status"] != "running" for t in tasks), (tasks, run.text()[-2500:])


def _group(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_an_agent_started_again_on_another_host_ends_the_run_with_the_fix(tmp_path: Path) -> None:
    """A TensorFlow cluster's addresses are fixed: an executor's agent that Spark ran again on
    another host cannot take its tasks back; the allocation says so (and how to go on)."""
    from tfplan.backends.spark import SparkBackend
    from tfplan.planning.plan import BackendRef
    from tfplan.planning.state import Allocation

    backend = SparkBackend(BackendRef("spark", {"options": {"executors": 2}}), tmp_path)
    backend.folder.mkdir(parents=True)
    backend.token_file.write_text("t\n")

    def register(address: str) -> None:
        agents = {
            f"executor-{i}": {
                "place": f"executor-{i}",
                "attempt": 0,
                "port": 1000 + i,
                "address": a,
                "hostname": a,
            }
            for i, a in enumerate(["10.0.0.1", address])
        }
        backend.registry.write_text(json.dumps({"app_id": "app-1", "agents": agents}))
        os.utime(backend.registry, (time.time() + len(address), time.time() + len(address)))

    register("10.0.0.2")
    driver = {"pid": os.getpid(), "pgid": os.getpgid(0)}
    allocation = Allocation("driver-1", {"driver": driver}, backend._bound())  # noqa: SLF001
    assert backend.allocation_problem(allocation) is None
    assert backend.agents["executor-1"].target.address == "10.0.0.2"
    register("10.0.0.99")  # Spark ran executor-1's agent again, elsewhere
    problem = backend.allocation_problem(allocation)
    assert problem is not None and "executor-1's agent again on another host" in problem, problem
    assert "(10.0.0.2 -> 10.0.0.99)" in problem and "run `tfplan apply` again" in problem
    assert backend.agents["executor-1"].target.address == "10.0.0.99"  # reached where it is now


CUDA_TASK = 'import os\nprint("CUDA=" + os.environ.get("CUDA_VISIBLE_DEVICES", "-"), flush=True)\n'


@pytest.mark.full
def test_each_role_runs_on_executors_of_its_own_shape_with_its_gpus(
    ws: Path, spark_cluster: SparkTestbed
) -> None:
    """``cluster.options.roles``: the ps on a 1-core 512 MiB executor, each worker on a 2-core
    768 MiB executor with a GPU (the bed's workers name two each: Spark's scheduling of them is
    real, nothing computes on them); each worker's CUDA_VISIBLE_DEVICES is the address Spark
    gave its executor."""
    script = ws / "cuda_task.py"
    script.write_text(CUDA_TASK + FAKE_TASK)
    command = ["recipe=command", f"recipe.command='{sys.executable} {script}'"]
    args = _args(ws, spark_cluster, *command, ROLES, executors=0)
    proc = tfplan(ws, "apply", "--auto-approve", *args, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr
    started = dict(re.findall(r"(ps/0|worker/0|worker/1): started on ([\w-]+)", out))
    assert started["ps/0"] == "ps-executor-0", out
    assert sorted([started["worker/0"], started["worker/1"]]) == [
        "worker-executor-0",
        "worker-executor-1",
    ], out
    folder = ws / ".tfplan" / "t" / "backend" / "spark"
    granted = re.findall(
        r"Granted executor ID \S+ on hostPort \S+ with (\d+) core\(s\), ([\d.]+) MiB",
        (folder / "driver.log").read_text(),
    )
    assert sorted(granted) == [("1", "512.0"), ("2", "768.0"), ("2", "768.0")], granted
    agents = json.loads((folder / "agents.json").read_text())["agents"]
    assert agents["ps-executor-0"]["gpus"] == []
    for worker in ("worker/0", "worker/1"):
        gpus = agents[started[worker]]["gpus"]
        assert len(gpus) == 1 and gpus[0] in ("0", "1"), agents
        assert f"{worker:<12} | CUDA={gpus[0]}" in out, out[-3000:]
    _nothing_left(spark_cluster, out)


@pytest.mark.full
def test_workers_join_and_leave_in_place_in_one_application(
    ws: Path, spark_cluster: SparkTestbed
) -> None:
    """docs/resize.md's story on Spark: 2 -> 4 -> 2 workers, then a told step budget, in the
    application the first apply started (joiners start through the agents of the executors
    already held; the ps on an executor of its own, which no joiner may take)."""
    from test_resize import ELASTIC, Job, grow_shrink_and_end

    ps_own = "cluster.options.roles={ps: {executors: 1, cores: 1, memory: 512m}}"
    base = [*_args(ws, spark_cluster, ps_own, executors=2), *ELASTIC]
    job = Job(ws)
    applications: set[str] = set()
    drivers: set[int] = set()

    def held() -> None:
        data = (state_of(ws).get("allocation") or {}).get("data") or {}
        if data:
            applications.add(str(data.get("app_id")))
            drivers.add(int(data["driver"]["pid"]))

    job.run_hook = held
    grow_shrink_and_end(job, base)
    assert len(applications) == len(drivers) == 1, applications  # one application throughout
    _nothing_left(spark_cluster, f"(driver pid {drivers.pop()},")


@pytest.mark.full
def test_the_users_keras_model_and_data_train_on_spark_and_come_back(
    tmp_path: Path, spark_cluster: SparkTestbed
) -> None:
    """The user's own project (examples/tabular: its package, its TFRecord shards at relative
    paths) through Spark: the package reaches the executors through their agents, the data
    is read where every executor sees it, and the trained model comes back as model.keras."""
    from apply_helpers import example_with_data
    from test_user_model_apply import SHARDS

    project = example_with_data("tabular", tmp_path / "project")
    args = _args(
        project,
        spark_cluster,
        "algo=downpour",
        "model._target_=tabular.models.build",
        "model.units=16",
        *SHARDS,
        "trainer.max_steps=60",
        "trainer.checkpoint_steps=60",
    )
    try:
        proc = tfplan(project, "apply", "--auto-approve", *args, timeout=600)
        out = proc.stdout
        assert proc.returncode == 0, out[-4000:] + proc.stderr
        result = json.loads((project / "out" / "result.json").read_text())
        assert result["status"] == "succeeded" and result["global_step"] >= 60, result
        shipped = project / "work" / "_code" / "tabular" / "models.py"
        assert shipped.read_text() == (project / "tabular" / "models.py").read_text()
        assert f"exported the trained model to {project / 'out' / 'model.keras'}" in out
        assert (project / "out" / "model.keras").is_file()
        _nothing_left(spark_cluster, out)
    finally:
        kill_groups(recorded_groups(project))


@pytest.mark.full
def test_more_cores_than_the_cluster_has_is_refused_before_submitting(
    ws: Path, spark_cluster: SparkTestbed
) -> None:
    free = spark_cluster.workers * spark_cluster.cores
    args = _args(ws, spark_cluster, *_fake(ws), executors=spark_cluster.workers + 1)
    proc = tfplan(ws, "apply", "--auto-approve", *args, "cluster.options.executor_cores=2")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    needed = (spark_cluster.workers + 1) * 2
    assert (
        f"cluster.options.executors: the plan needs {spark_cluster.workers + 1} executor(s) of 2 "
        f"core(s), 512m: {needed} core(s); the master has {free} free core(s) on "
        f"{spark_cluster.workers} alive worker(s)"
    ) in proc.stderr, proc.stderr
    assert not recorded_groups(ws) and not spark_cluster.master_state()["activeapps"]
