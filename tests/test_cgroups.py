"""``cluster.memory`` for real (tfplan.backends.transports.cgroups, the process backend): each
limited task in a memory cgroup of its own, started cold (the shell wrapper makes the group) or
forked from the warm seed (the seed makes it), held there by the kernel, told apart when it is
killed at its limit, refused before anything starts where no group can be made, and nothing left
in the cgroup file system once the experiment is released. Real processes, the real kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from apply_helpers import (
    CONF,
    alive,
    base_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
    wait_until,
)

import tfplan.backends.process.seeds as process_seeds
from tfplan.backends.api import LaunchRequest, TaskPhase
from tfplan.backends.process import ProcessBackend
from tfplan.backends.process.memory import CGROUPS_KEY, group_of, problem_line
from tfplan.backends.transports import seed_agent
from tfplan.backends.transports.cgroups import ENTER_FAILED_EXIT, cgroup_name, probe_script
from tfplan.backends.transports.scripts import MEMORY_TASK_WRAPPER, memory_env
from tfplan.config.compose import compose_config, to_config
from tfplan.engine.plans import make_plan
from tfplan.errors import BackendError
from tfplan.planning.context import PlanContext
from tfplan.planning.plan import BackendRef
from tfplan.planning.state import Allocation, TaskRecord, TaskStatus

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="making memory cgroups needs root (CI runs as root)"
)

PY = sys.executable
MiB = 2**20
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/memory")
# A program that says where it runs (its memory cgroup, as /proc/self/cgroup names it, and that
# group's limit as the kernel holds it), then allocates argv[1] MiB, then sleeps argv[2] seconds.
# Its first line names TensorFlow (a comment): a warm seed forks it, yet it never imports it.
PROGRAM = r"""# a stand-in for a tensorflow program
import json, os, sys, time
rows = [line.rstrip("\n").split(":", 2) for line in open("/proc/self/cgroup")]
v1 = [path for _, kinds, path in rows if "memory" in kinds.split(",")]
if v1:
    group, limit = "/sys/fs/cgroup/memory" + v1[0], "memory.limit_in_bytes"
else:
    group, limit = "/sys/fs/cgroup" + [path for _, kinds, path in rows if not kinds][0], "memory.max"
held = open(os.path.join(group, limit)).read().strip()
print(json.dumps({"group": group, "limit": held, "told": os.environ.get("TFPLAN_MEMORY_LIMIT")}),
      flush=True)
block = b"\1" * (int(sys.argv[1]) * 2**20)
print("allocated", len(block) // 2**20, "MiB", flush=True)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""


def _groups(prefix: str) -> list[Path]:
    """Every folder of the cgroup file system whose name starts with ``prefix``."""
    root = V2 / "tfplan" if (V2 / "cgroup.controllers").is_file() else V1
    if not root.is_dir():
        return []
    found = []
    for folder, subfolders, _ in os.walk(root):
        found += [Path(folder, s) for s in subfolders if s.startswith(prefix)]
    return found


def _said(log: Path) -> dict[str, str]:
    """The program's line: its group and the limit held there."""
    rows = [line for line in log.read_text().splitlines() if line.startswith("{")]
    assert rows, log.read_text()[-2000:]
    data: dict[str, str] = json.loads(rows[0])
    return data


# ---- the backend: one task at a time -----------------------------------------------------


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProcessBackend]:
    # a seed of json only: what matters here is the fork, not TensorFlow's import
    monkeypatch.setattr(process_seeds, "PRELOAD", ("json",))
    ref = BackendRef("process", {"hosts": [{"name": "localhost", "address": "127.0.0.1"}]})
    with ProcessBackend(ref, tmp_path / "scratch") as b:
        yield b


def _request(tmp: Path, experiment: str, limit: int, *args: str) -> LaunchRequest:
    script = tmp / "program.py"
    script.write_text(PROGRAM)
    workdir = str(tmp / "worker-0")
    return LaunchRequest(
        name="worker/0",
        role="worker",
        index=0,
        host="localhost",
        command=(PY, str(script), *args),
        env={},
        workdir=workdir,
        log_path=f"{workdir}/task.log",
        memory_limit=limit,
        experiment=experiment,
    )


def _record(request: LaunchRequest, handle: dict[str, object]) -> TaskRecord:
    return TaskRecord(
        name=request.name,
        role=request.role,
        index=request.index,
        planned_host=request.host,
        host=request.host,
        address="127.0.0.1",
        port=None,
        handle=handle,
        workdir=request.workdir,
        log_path=request.log_path,
        command=request.command,
        env=request.env,
        devices=(),
        is_chief=False,
        fingerprint="",
        config_digest="",
        cluster_digest="",
        started_at=time.time(),
        status=TaskStatus.RUNNING,
    )


def _ended(backend: ProcessBackend, request: LaunchRequest) -> tuple[TaskRecord, int | None]:
    record = _record(request, backend.launch(request, Allocation()).handle)
    wait_until(lambda: backend.describe([record])["worker/0"].phase.ended, 60, "the task's end")
    info = backend.describe([record])["worker/0"]
    assert info.phase in (TaskPhase.SUCCEEDED, TaskPhase.FAILED), info
    return record, info.exit_code


@pytest.mark.parametrize("start", ["cold", "forked"])
def test_a_task_runs_in_a_memory_cgroup_of_its_own_and_a_restart_in_the_same(
    backend: ProcessBackend, tmp_path: Path, start: str
) -> None:
    """The task's program is in its group, of its limit, before its first line; over the
    limit the kernel kills it alone (137; a forked task's seed lives on); its next life enters
    the same group, the limit written again; release removes the group."""
    experiment = f"cg-{start}-{os.getpid()}"
    name = cgroup_name(experiment, "worker", 0)
    seed = None
    if start == "forked":
        seed = backend.start_seed("localhost", str(tmp_path / "_seed"), PY, {})
        wait_until(lambda: backend.seed_ready(seed), 60, "the seed to be ready")
        backend.use_seeds([seed])
    try:
        request = _request(tmp_path, experiment, 128 * MiB, "400")
        record, code = _ended(backend, request)
        assert bool(record.handle.get("forked")) is (start == "forked")
        said, log = _said(Path(request.log_path)), Path(request.log_path).read_text()
        assert code == 137 and "allocated" not in log, log[-2000:]
        assert said["group"].endswith(f"/{name}") and said["limit"] == str(128 * MiB), said
        assert said["told"] == str(128 * MiB)
        if seed is not None:
            assert alive(seed.pid)  # the limit was the task's alone
        again = replace(
            request, memory_limit=512 * MiB, attempt=1, command=(*request.command[:2], "200")
        )
        record, code = _ended(backend, again)
        assert code == 0 and "allocated 200 MiB" in Path(again.log_path).read_text()
        assert _said(Path(again.log_path)) == {
            "group": said["group"],
            "limit": str(512 * MiB),
            "told": str(512 * MiB),
        }
    finally:
        if seed is not None:
            backend.stop_seed(seed)
    assert [p.name for p in _groups(name)] == [name]
    backend.release(Allocation(data={CGROUPS_KEY: {"localhost": [name]}}))
    assert _groups(name) == []


def test_release_leaves_a_group_that_still_holds_a_process_and_names_it(
    backend: ProcessBackend, tmp_path: Path
) -> None:
    experiment = f"cg-busy-{os.getpid()}"
    name = cgroup_name(experiment, "worker", 0)
    request = _request(tmp_path, experiment, 256 * MiB, "1", "600")
    record = _record(request, backend.launch(request, Allocation()).handle)
    allocation = Allocation(data={CGROUPS_KEY: {"localhost": [name]}})
    try:
        wait_until(lambda: "allocated" in Path(request.log_path).read_text(), 30, "the task")
        with pytest.raises(BackendError) as raised:
            backend.release(allocation)
        said = str(raised.value)
        assert said.startswith("could not release everything: localhost: memory cgroups still")
        assert said.endswith(f"/{name}") and "\n" not in said
    finally:
        backend.cancel([record], 2.0)
    backend.release(allocation)
    assert _groups(name) == []


def test_a_standby_is_in_a_group_of_its_own_beside_its_tasks() -> None:
    request = LaunchRequest("ps/0", "ps", 0, "h", (PY,), {}, "/w", "/w/l", experiment="e")
    assert group_of(replace(request, standby=True, attempt=3)) == "tfplan-e-ps-0-standby-3"


def test_a_host_where_no_group_can_be_made_says_why() -> None:
    """The probe preflight runs makes the group as a task would, then removes it; run as a
    user who may not make one, the kernel's word comes back, and preflight's one line names
    the tasks and the fixes. (A whole apply cannot run as such a user here: the interpreter
    lives under root's own folder. Every apply of a limited task passes this probe.)"""
    probe = probe_script(cgroup_name("probe", "preflight", 0), 128 * MiB)
    ok = subprocess.run(["sh", "-c", probe], capture_output=True, text=True, check=True)
    assert ok.stdout == "ok\n"
    assert _groups("tfplan-probe-") == []  # made, then removed
    refused = subprocess.run(
        [*NOBODY, "sh", "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Permission denied" in refused.stdout and refused.stdout.count("\n") == 1
    plan = make_plan(
        to_config(compose_config(["cluster.workers=5", "+cluster.memory.worker=1GiB"], CONF)),
        None,
        PlanContext(cwd="/p", local_python=PY, tf_version="2.21.0"),
    )
    line = problem_line([t for t in plan.tasks if t.memory_limit], refused.stdout)
    assert line == (
        "cluster.memory gives worker/1 (1.0 GiB), worker/2 (1.0 GiB), worker/3 (1.0 GiB) and 1 "
        f"more a memory cgroup of its own, but this host offers none tfplan can make "
        f"({refused.stdout.strip()}): run tfplan as root there, delegate a cgroup to its user, "
        "or remove cluster.memory"
    )


def test_a_task_that_cannot_enter_its_group_runs_nothing_and_says_why() -> None:
    """As a user who may make no cgroup: the cold start's wrapper records 125 and one error
    line, without running the program; the seed's mirror of it (run by the host's own Python:
    the agent is stdlib only) refuses with the kernel's word, which the fork request answers."""
    with tempfile.TemporaryDirectory(prefix="tfplan-nobody-") as folder:  # pytest's: root's alone
        Path(folder).chmod(0o777)
        exit_file = Path(folder) / "exit_code"
        wrapper = ["sh", "-c", MEMORY_TASK_WRAPPER, "tfplan-task", "echo", "ran"]
        env = {
            "PATH": os.environ["PATH"],
            "TFPLAN_EXIT_FILE": str(exit_file),
            **memory_env(128 * MiB, "tfplan-nobody-worker-0"),
        }
        done = subprocess.run([*NOBODY, *wrapper], env=env, capture_output=True, text=True)
        assert (done.returncode, exit_file.read_text()) == (
            ENTER_FAILED_EXIT,
            f"{ENTER_FAILED_EXIT}\n",
        )
        assert done.stdout == "" and done.stderr.count("\n") == 1, done
        assert done.stderr.startswith(
            "error: could not put the task in its memory cgroup tfplan-nobody-worker-0 (mkdir: "
        )
        assert done.stderr.endswith(
            "Permission denied): run tfplan as root on this host, delegate a cgroup to its user, or "
            "remove cluster.memory\n"
        )
        agent = Path(seed_agent.__file__).parent
        code = "import seed_agent; seed_agent._memory_group('tfplan-nobody-worker-0', 2**27)"
        seed = subprocess.run(
            [*NOBODY, "/usr/bin/python3", "-c", code], cwd=agent, capture_output=True, text=True
        )
        assert seed.returncode == 1 and "PermissionError" in seed.stderr, seed.stderr[-1000:]
        assert seed_agent.ENTER_FAILED_EXIT == ENTER_FAILED_EXIT
        assert _groups("tfplan-nobody-") == []


# ---- through tfplan apply ----------------------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def _command(ws: Path, experiment: str, mib: int, *extra: str) -> list[str]:
    script = ws / "program.py"
    script.write_text(PROGRAM)
    return [
        *base_overrides(ws, free_port_base(4), experiment),
        "recipe=command",
        f"recipe.command='{PY} {script} {mib}'",
        "cluster.ps=0",
        "cluster.workers=1",
        *extra,
    ]


@pytest.mark.parametrize("start", ["cold", "forked"])
def test_a_task_over_its_limit_is_killed_by_the_kernel_and_the_run_says_which_limit(
    ws: Path, start: str
) -> None:
    """worker/0 (the chief) allocates 400 MiB under cluster.memory.chief=128MiB: the kernel
    kills both of its lives, each in the task's own group; the run fails saying so in one line,
    and nothing of the groups is left once it is over."""
    experiment = f"mem-{start}"
    args = _command(
        ws,
        experiment,
        400,
        "+cluster.memory.chief=128MiB",
        "lifecycle.restart.chief=OnFailure",
        "lifecycle.restart.backoff_limit=1",
        "lifecycle.restart.backoff_secs=0",
        *(["cluster.warm=false"] if start == "cold" else []),
    )
    applied = tfplan(ws, "apply", "--auto-approve", *args)
    assert applied.returncode == 1, applied.stdout[-3000:] + applied.stderr[-2000:]
    line = (
        "worker/0 failed: killed by the kernel on host localhost: it reached its memory limit "
        "of 128 MiB (cluster.memory.chief) -> raise cluster.memory.chief"
    )
    assert line in " ".join(applied.stdout.split()), applied.stdout[-3000:]
    state = state_of(ws, experiment)
    task = state["tasks"][0]
    assert (task["memory_limit"], task["restarts"], task["exit_code"]) == (128 * MiB, 1, 137)
    assert bool(task["handle"].get("forked")) is (start == "forked"), task["handle"]
    name = cgroup_name(experiment, "worker", 0)
    assert state["allocation"] is None and _groups(name) == []  # released at the run's end
    log = Path(task["log_path"])
    for life in (Path(f"{log}.0"), log):
        said = _said(life)
        assert said["group"].endswith(f"/{name}") and said["limit"] == str(128 * MiB), life
        assert "allocated" not in life.read_text()
    row = json.loads(tfplan(ws, "explain", "worker/0", "--json", check=True).stdout)[0]
    assert row["known"] == "memory-limit" and "128 MiB (cluster.memory.chief)" in row["line"]
    if start == "cold":  # status says the limit beside the task's RSS
        status = json.loads(tfplan(ws, "status", "--json", check=True).stdout)["tasks"][0]
        assert status["memory_limit"] == 128 * MiB, status
    tfplan(ws, "destroy", "--auto-approve", f"experiment.id={experiment}", check=True)
    assert _groups(name) == []


def test_the_same_run_without_a_limit_succeeds(ws: Path) -> None:
    applied = tfplan(
        ws, "apply", "--auto-approve", *_command(ws, "mem-none", 400, "cluster.warm=false")
    )
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-2000:]
    task = state_of(ws, "mem-none")["tasks"][0]
    log = Path(task["log_path"])
    assert "allocated 400 MiB" in log.read_text() and "memory_limit" not in task
    assert "/tfplan-" not in _said(log)["group"] and _said(log)["told"] is None
