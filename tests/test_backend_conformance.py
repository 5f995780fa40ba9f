"""One conformance suite for every backend: the contract of tfplan/backends/api.py, with real
processes (the process backend over its local and SSH transports, cold and forked from a warm
seed, Slurm on the real bed, Spark on the real bed (one application for all its cases), and
Kubernetes).

Kubernetes is included through the fake API server of tests/kube_fake.py: no API server, and no
cluster, can run here. The backend and the official client are the real ones; the kubelet is
the fake's, which runs each pod's container as a local process (``FakeKube(run_pods=True)``):
the programs run on this machine, their output is the pods' logs, deleting a pod is SIGTERM to
its process group and SIGKILL after the grace period the delete asks for. What a pod does not
have (a tracked wrapper apart from the program, standbys) is skipped, with the reason.

Each case launches small Python programs through ``Backend.launch`` and checks what the engine
relies on: describe (running, then the exit code), log streaming in order, reading a file the
task wrote, a graceful cancel (the task sees SIGTERM), a kill after the grace period, and a
restart that keeps the previous log.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from kube_fake import NODE, FakeKube
from slurm_testbed import SlurmTestbed
from spark_testbed import SparkTestbed
from testbed import LoopbackSshd

import tfplan.backends.process.seeds as process_seeds
from tfplan.backends.api import Backend, LaunchRequest, TaskPhase
from tfplan.backends.kubernetes import KubernetesBackend
from tfplan.backends.kubernetes.options import KubeOptions
from tfplan.backends.process import ProcessBackend
from tfplan.backends.slurm import SlurmBackend
from tfplan.backends.spark import SparkBackend
from tfplan.errors import TfplanError
from tfplan.planning.plan import BackendRef
from tfplan.planning.state import Allocation, TaskRecord, TaskStatus

PY = sys.executable


@dataclass
class Case:
    backend: Backend
    allocation: Allocation
    host: str  # the planned host name to launch on
    tmp: Path
    warm: bool = False  # every task must be forked from the allocation's warm seed
    # the handle's pid is a process apart from the program (a wrapper, an srun client); None:
    # there is none, and why (a pod's program is its container's main process)
    no_tracked: str | None = None
    # where a restarted task's previous log is kept: at the request's keep_log_as (None), or in
    # the backend's own folder as <role>-<index>.log.<n> (Kubernetes: logs are the API's)
    kept_logs: Path | None = None
    shared: bool = False  # the allocation serves several tests: released by its own fixture


def _process_case(tmp: Path, kind: str, sshd: LoopbackSshd | None) -> Case:
    if sshd is not None:
        target = sshd.target()
        hosts = [
            {
                "name": "h",
                "address": target.address,
                "ssh_user": target.ssh_user,
                "ssh_port": target.ssh_port,
                "ssh_key": target.ssh_key,
                "python": PY,
                "known_hosts": target.known_hosts,
                "kind": "ssh",
            }
        ]
    else:
        hosts = [{"name": "h", "address": "127.0.0.1", "python": PY, "kind": "local"}]
    backend = ProcessBackend(BackendRef("process", {"hosts": hosts}), tmp / "scratch")
    return Case(backend, Allocation(), "h", tmp)


def _docs_example() -> type[Backend]:
    """The worked example of docs/backends.md, exactly as printed there."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "backends.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/backends.md", "exec"), namespace)  # noqa: S102 - our own docs
    backend = namespace["NiceBackend"]
    assert isinstance(backend, type) and issubclass(backend, Backend)
    return backend


def _warm_case(tmp: Path) -> Case:
    """The process backend with a warm seed recorded in the allocation, as apply's allocate
    leaves it: every task is forked from the seed, and release stops it."""
    made = _process_case(tmp, "local", None)
    backend = made.backend
    seed = backend.start_seed("h", str(tmp / "seed"), PY, {})
    deadline = time.monotonic() + 120
    while not backend.seed_ready(seed):
        assert time.monotonic() < deadline, "the warm seed did not get ready"
        time.sleep(0.1)
    allocation = Allocation(data={"seeds": [seed.to_dict()]})
    assert backend.starts_warm("h", allocation)
    return replace(made, allocation=allocation, warm=True)


@pytest.fixture
def kube_pods(tmp_path: Path) -> Iterator[FakeKube]:
    """The fake API server whose kubelet runs the pods here; every process of it ends with it."""
    with FakeKube(claims=("shared",), run_pods=True) as fake:
        yield fake
    with fake.cond:
        left = [c.pod for c in fake.containers.values() if not c.reaped]
    assert not left, f"the fake kubelet left the processes of {left}"


def _kubernetes_case(tmp: Path, fake: FakeKube) -> Case:
    """Tasks as Jobs through the API, their pods run by the fake's kubelet on this machine:
    the output volume (the PVC ``shared``, mounted at output_dir) is ``tmp``, where the tasks'
    workdirs are, so read_file's reader pod finds what a task wrote."""
    options = KubeOptions(
        name="conformance",
        kubeconfig=str(fake.kubeconfig(tmp / "kubeconfig")),
        output_volume="shared",
        workdir=str(tmp / "tfplan"),
        output_dir=str(tmp),
    )
    scratch = tmp / "scratch"
    backend = KubernetesBackend(BackendRef("kubernetes", options.to_config()), scratch)
    allocation = Allocation(  # as allocate leaves it: nothing to ship (the programs are here)
        id=options.service,
        data={"namespace": options.namespace, "code": [], "code_dir": f"{options.workdir}/_code"},
    )
    return Case(
        backend,
        allocation,
        NODE,
        tmp,
        no_tracked="a pod has no tracked process apart from its program: the container's main "
        "process is the program, and the handle names a Job, not a pid",
        kept_logs=scratch / "logs",
    )


@pytest.fixture(
    params=[
        "process-local",
        "process-warm",
        "process-ssh",
        pytest.param("slurm", marks=[pytest.mark.slurm, pytest.mark.netns]),
        pytest.param("spark", marks=[pytest.mark.spark, pytest.mark.full]),
        "docs-example",
        "kubernetes",
    ]
)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    if request.param == "docs-example":
        nice = _docs_example()
        made = Case(
            nice(BackendRef("nice", {"level": 10}), tmp_path), Allocation(), "here", tmp_path
        )
    elif request.param == "process-local":
        made = _process_case(tmp_path, "local", None)
    elif request.param == "process-warm":
        # the seed imports json only: the contract is the fork's, not TensorFlow's import time
        request.getfixturevalue("monkeypatch").setattr(process_seeds, "PRELOAD", ("json",))
        made = _warm_case(tmp_path)
    elif request.param == "process-ssh":
        made = _process_case(tmp_path, "ssh", request.getfixturevalue("sshd_server"))
    elif request.param == "kubernetes":
        made = _kubernetes_case(tmp_path, request.getfixturevalue("kube_pods"))
    elif request.param == "spark":
        backend, allocation = request.getfixturevalue("spark_application")
        made = Case(backend, allocation, "executor-0", tmp_path, shared=True)
    else:
        bed: SlurmTestbed = request.getfixturevalue("slurm_cluster")
        request.getfixturevalue("slurm_env")
        options = {"nodes": 1, "tasks_per_node": 4, "partition": bed.partition}
        backend = SlurmBackend(BackendRef("slurm", {"options": options, "python": PY}), tmp_path)
        job = backend.slurm.submit(
            ["--nodes=1", f"--output={tmp_path}/slurm-%j.out", f"--partition={bed.partition}"],
            _holder(tmp_path),
        )
        nodes = backend._wait_running(job, lambda line: None)  # noqa: SLF001 - test setup
        address = bed.addresses[nodes[0]]
        made = Case(
            backend, Allocation(id=job, bound={"node-0": (nodes[0], address)}), "node-0", tmp_path
        )
    try:
        yield made
    finally:
        if not made.shared:
            made.backend.release(made.allocation)
            made.backend.close()
            for seed in made.allocation.data.get("seeds", []):
                assert not _alive(int(seed["pid"])), "release left the warm seed running"


@pytest.fixture(scope="module")
def spark_application(
    spark_cluster: SparkTestbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SparkBackend, Allocation]]:
    """One Spark application (one executor, its agent) for every Spark case of the module:
    an application's start is the JVMs' (seconds of both cores), the contract is the agent's."""
    options = {
        "master": spark_cluster.master_url,
        "executors": 1,
        "tasks_per_executor": 4,
        "executor_cores": 1,
        "executor_memory": "512m",
        "driver_host": spark_cluster.driver_host,
        "start_timeout_secs": 300,
    }
    ref = BackendRef("spark", {"options": options, "python": PY, "warm": False})
    with pytest.MonkeyPatch.context() as env:  # the driver starts with the bed's environment
        for key, value in spark_cluster.env().items():
            env.setenv(key, value)
        backend = SparkBackend(ref, tmp_path_factory.mktemp("spark-conformance"))
        allocation = backend.submit("conformance", lambda line: None, lambda a: None)
    try:
        allocation = Allocation(allocation.id, allocation.data, backend.wait_agents(allocation))
        yield backend, allocation
    finally:
        backend.release(allocation)
        backend.close()


@pytest.fixture
def slurm_env(slurm_cluster: SlurmTestbed, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in slurm_cluster.env().items():
        monkeypatch.setenv(key, value)


def _holder(tmp: Path) -> str:
    script = tmp / "hold.sh"
    script.write_text("#!/bin/sh\nexec sleep infinity\n")
    return str(script)


def _program(case: Case, code: str) -> tuple[str, ...]:
    """A Python program as a script of its own (a seed forks scripts and modules, not -c)."""
    folder = case.tmp / "programs"
    folder.mkdir(exist_ok=True)
    script = folder / f"program-{len(list(folder.iterdir()))}.py"
    # forked from a warm seed, a program is a TensorFlow program (a seed forks only those): a
    # comment naming it is enough (importing it would cost seconds, the seed preloads json)
    named = "# a stand-in for a tensorflow program\n"
    script.write_text((named if case.warm else "") + textwrap.dedent(code))
    return (PY, str(script))


def _launch(
    case: Case, name: str, code: str, attempt: int = 0, keep: str | None = None
) -> TaskRecord:
    workdir = case.tmp / "tasks" / name.replace("/", "-")
    request = LaunchRequest(
        name=name,
        role=name.split("/")[0],
        index=int(name.split("/")[1]),
        host=case.host,
        command=_program(case, code),
        env={"TF_CONFIG": '{"task": {"type": "worker", "index": 0}}', "CONFORMANCE": "yes"},
        workdir=str(workdir),
        log_path=str(workdir / "task.log"),
        keep_log_as=keep,
        attempt=attempt,
    )
    launched = case.backend.launch(request, case.allocation)
    assert launched.handle and launched.started_at > 0
    assert launched.handle.get("forked", False) is case.warm, launched
    return TaskRecord(
        name=name,
        role=request.role,
        index=request.index,
        planned_host=case.host,
        host=launched.host,
        address=launched.address,
        port=None,
        handle=launched.handle,
        workdir=request.workdir,
        log_path=request.log_path,
        command=request.command,
        env=request.env,
        devices=(),
        is_chief=False,
        fingerprint="f",
        config_digest="c",
        cluster_digest="d",
        started_at=launched.started_at,
    )


def _wait_phase(case: Case, task: TaskRecord, phase: TaskPhase, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        info = case.backend.describe([task])[task.name]
        if info.phase is phase:
            return
        assert time.monotonic() < deadline, f"{task.name} is {info} after {timeout}s, not {phase}"
        time.sleep(0.1)


def _wait_log(case: Case, task: TaskRecord, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in case.backend.read_log(task).decode():
        assert time.monotonic() < deadline, f"no {text!r} in the log of {task.name}"
        time.sleep(0.1)


def test_describe_stream_and_exit_code(case: Case) -> None:
    task = _launch(
        case,
        "worker/0",
        """
        import os, sys, time
        for i in range(5):
            print(f"line {i} {os.environ['CONFORMANCE']}", flush=True)
            time.sleep(0.1)
        open(os.path.join(os.getcwd(), "out.txt"), "w").write("written by the task")
        print("TF_CONFIG=" + os.environ["TF_CONFIG"], flush=True)
        sys.exit(3)
        """,
    )
    lines: list[str] = []
    stream = case.backend.stream_log(task, lines.append)
    try:
        assert stream.join(60), "the stream did not end with the task"
    finally:
        stream.stop()
    assert [line for line in lines if line.startswith("line")] == [
        f"line {i} yes" for i in range(5)
    ]
    assert 'TF_CONFIG={"task": {"type": "worker", "index": 0}}' in lines
    _wait_phase(case, task, TaskPhase.FAILED)
    info = case.backend.describe([task])[task.name]
    assert info.exit_code == 3 and info.host == task.host
    assert case.backend.read_file(str(Path(task.workdir) / "out.txt")) == b"written by the task"
    assert case.backend.read_file(str(Path(task.workdir) / "missing.txt")) is None
    whole = case.backend.read_log(task)
    assert 'TF_CONFIG={"task": {"type": "worker", "index": 0}}' in whole.decode()
    assert case.backend.read_log(task, -10) == whole[-10:]  # negative: from the end
    assert case.backend.read_log(task, 5) == whole[5:]


def test_cancel_is_graceful_then_kills(case: Case) -> None:
    polite = _launch(
        case,
        "ps/0",
        """
        import signal, sys, time
        def bye(*_):
            print("got TERM", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
        """,
    )
    stubborn = _launch(
        case,
        "worker/1",
        """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
        """,
    )
    for task in (polite, stubborn):
        _wait_log(case, task, "ready")
        assert case.backend.describe([task])[task.name].phase is TaskPhase.RUNNING
    began = time.monotonic()
    results = case.backend.cancel([polite, stubborn], grace_secs=2.0)
    assert time.monotonic() - began < 30
    assert not isinstance(results["ps/0"], Exception) and results["ps/0"].outcome == "terminated"
    assert (
        not isinstance(results["worker/1"], Exception) and results["worker/1"].outcome == "killed"
    )
    assert "got TERM" in case.backend.read_log(polite).decode()
    for task in (polite, stubborn):
        assert case.backend.describe([task])[task.name].phase.ended
    again = case.backend.cancel([replace(polite, status=TaskStatus.RUNNING)], grace_secs=1.0)
    assert not isinstance(again["ps/0"], Exception) and again["ps/0"].outcome == "none"


def test_restart_keeps_the_previous_log(case: Case) -> None:
    first = _launch(case, "evaluator/0", "print('first life', flush=True)")
    _wait_phase(case, first, TaskPhase.SUCCEEDED)
    # as the supervisor restarts a task: what is left of its previous life goes first (it
    # ended: nothing to stop; a Job's name is its task's), then it starts again
    left = case.backend.cancel([replace(first, status=TaskStatus.RUNNING)], grace_secs=0.5)
    assert not isinstance(left["evaluator/0"], Exception) and left["evaluator/0"].outcome == "none"
    kept = first.log_path + ".0"
    second = _launch(case, "evaluator/0", "print('second life', flush=True)", attempt=1, keep=kept)
    _wait_phase(case, second, TaskPhase.SUCCEEDED)
    assert case.backend.read_log(second).decode().strip().endswith("second life")
    kept_at = Path(kept) if case.kept_logs is None else case.kept_logs / "evaluator-0.log.0"
    assert "first life" in kept_at.read_text()
    assert "first life" not in case.backend.read_log(second).decode()


def _pid_file_program(path: Path) -> str:
    return f"""
        import os, time
        open({str(path)!r}, "w").write(str(os.getpid()))
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
        """


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_pid(path: Path, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"no pid in {path}"
        time.sleep(0.05)
    return int(path.read_text())


@pytest.mark.parametrize("first", ["tracked", "program"])
def test_cancel_stops_the_program_whichever_died_first(case: Case, first: str) -> None:
    """The tracked process (the handle's pid: a wrapper, an srun client's wrapper) and the
    program under it can die in either order; describe then says the task ended, or (the
    tracked process gone, the program alive) that the program is re-adopted, where the backend
    follows programs (the process backend's wrappers): running, ``readopted``. Either way
    cancel leaves no process of it (every backend runs the programs in this machine's PID
    namespace here, so the test sees them)."""
    if first == "tracked" and case.no_tracked:
        pytest.skip(case.no_tracked)
    pid_file = case.tmp / f"program-{first}.pid"
    task = _launch(case, "ps/0", _pid_file_program(pid_file))
    program = _wait_pid(pid_file)
    _wait_log(case, task, "ready")
    forked = bool(task.handle.get("forked"))  # its tracked process is the program
    if first == "tracked":
        os.kill(int(task.handle["pid"]), signal.SIGKILL)
    else:
        os.kill(program, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        info = case.backend.describe([task])[task.name]
        if info.phase is TaskPhase.FAILED or info.readopted:
            break
        assert time.monotonic() < deadline, f"{task.name} is {info}, neither ended nor adopted"
        time.sleep(0.1)
    if info.readopted:
        assert first == "tracked" and not forked and _alive(program), info
        assert info.phase is TaskPhase.RUNNING
    else:
        assert info.exit_code in (None, 137), info
    results = case.backend.cancel([replace(task, status=TaskStatus.RUNNING)], grace_secs=1.0)
    assert not isinstance(results["ps/0"], Exception), results
    assert not _alive(program), f"{first} killed first: the program {program} outlived cancel"
    again = case.backend.cancel([replace(task, status=TaskStatus.RUNNING)], grace_secs=1.0)
    assert not isinstance(again["ps/0"], Exception) and again["ps/0"].outcome == "none"


STANDBY_PROGRAM = """
    import os, signal, sys
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    print("waiting", os.environ.get("ROLE_OF_THIS"), flush=True)
    signal.sigwait({signal.SIGUSR1})
    print("go", flush=True)
    sys.exit(0)
    """


def test_a_standby_keeps_apart_from_its_task_and_goes_on_its_signal(case: Case) -> None:
    """``launch(standby=True)`` next to the live task in the same workdir: the task's end does
    not end the standby (its own exit record); ``signal(USR1)`` reaches the program, not the
    wrappers; ``move_logs`` makes the standby's log the task's."""
    if not case.backend.capabilities.standby:
        pytest.skip(f"the {case.backend.name} backend keeps no standbys")
    task = _launch(case, "ps/0", "import sys; print('first life', flush=True); sys.exit(5)")
    _wait_phase(case, task, TaskPhase.FAILED)
    workdir = Path(task.workdir)
    request = LaunchRequest(
        name="ps/0",
        role="ps",
        index=0,
        host=case.host,
        command=_program(case, STANDBY_PROGRAM),
        env={"ROLE_OF_THIS": "standby"},
        workdir=str(workdir),
        log_path=str(workdir / "task.log.standby"),
        attempt=1,
        standby=True,
    )
    launched = case.backend.launch(request, case.allocation)
    standby = replace(
        task,
        name="ps/0~standby",
        handle=launched.handle,
        log_path=request.log_path,
        started_at=launched.started_at,
    )
    _wait_log(case, standby, "waiting standby")
    assert case.backend.describe([task])[task.name].exit_code == 5
    assert case.backend.describe([standby])[standby.name].phase is TaskPhase.RUNNING
    case.backend.signal(standby, "USR1")
    keep = task.log_path + ".0"
    case.backend.move_logs(standby, [(task.log_path, keep), (standby.log_path, task.log_path)])
    adopted = replace(standby, name="ps/0", log_path=task.log_path)
    _wait_phase(case, adopted, TaskPhase.SUCCEEDED)
    assert case.backend.read_log(adopted).decode().split() == ["waiting", "standby", "go"]
    assert "first life" in Path(keep).read_text()
    # nothing left to signal, once the process is gone: its exit record (SUCCEEDED) is written
    # a moment before it exits (a forked task's agent writes it, then leaves)
    deadline = time.monotonic() + 60
    while True:
        try:
            case.backend.signal(adopted, "USR1")
        except TfplanError:
            break
        assert time.monotonic() < deadline, "a group whose task ended could still be signalled"
        time.sleep(0.1)
