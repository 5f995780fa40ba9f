"""The Kubernetes backend through the official client, against a fake API server (kube_fake.py).

No Kubernetes cluster can run here, so the API server and the controllers behind it are
simulated (tests/kube_fake.py says exactly what). The backend, the engine and the CLI are the
real ones: ``tfplan apply/status/logs/destroy`` run as subprocesses with a generated
kubeconfig, and the test plays the kubelet (a pod starts, writes its log, exits with a code).
Everything waits on the fake's events, never on time. None of this ran against a real cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import CONF, state_of, tfplan
from k8s_helpers import k8s_plan
from kube_fake import FakeKube

from tfplan.backends.api import TaskPhase
from tfplan.backends.kubernetes import KubernetesBackend
from tfplan.engine.launching import PlanLaunches
from tfplan.errors import BackendError, PreflightError
from tfplan.planning.plan import Plan
from tfplan.planning.state import Allocation, TaskRecord

TASKS = ("ps-0", "worker-0", "worker-1")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    with FakeKube(claims=("shared",), service_accounts=("trainer",)) as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig")))
        yield server


def _overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "cluster=k8s",
        "experiment.id=t",
        "cluster.options.output_volume=shared",
        "lifecycle.ps_grace_secs=1",
        "lifecycle.restart.backoff_secs=0.1",
        *extra,
    ]


def _env() -> dict[str, str]:
    return {"KUBECONFIG": os.environ["KUBECONFIG"]}


# --- the backend in process --------------------------------------------------------------------


class Started:
    def __init__(self, backend: KubernetesBackend, plan: Plan, allocation: Allocation) -> None:
        self.backend, self.plan, self.allocation = backend, plan, allocation
        launches = PlanLaunches(plan, allocation)
        self.records = {}
        for task in plan.tasks:
            launched = backend.launch(launches.request(task), allocation)
            self.records[task.name] = TaskRecord.from_task(
                task, plan, launched.handle, launched.started_at, launched.host, launched.address
            )


def _start(tmp_path: Path, *overrides: str) -> Started:
    plan = k8s_plan("cluster.options.output_volume=shared", *overrides)
    backend = KubernetesBackend(plan.backend, tmp_path / "scratch")
    backend.preflight(plan, plan.tasks)
    allocation = backend.allocate(plan, plan.tasks, None, lambda line: None, lambda a: None)
    backend.stage(plan, plan.tasks, allocation)
    return Started(backend, plan, allocation)


def test_launch_creates_a_job_per_task_and_describe_follows_its_pod(
    fake: FakeKube, tmp_path: Path
) -> None:
    run = _start(tmp_path)
    assert fake.left() == [
        "ConfigMap/tfplan-default-config",
        *(f"Job/tfplan-default-{t}" for t in TASKS),
        *(f"Pod/{fake.pod(t)['metadata']['name']}" for t in TASKS),  # type: ignore[index]
        "Service/tfplan-default",
    ]
    records = list(run.records.values())
    infos = run.backend.describe(records)
    assert {n: (i.phase, i.detail) for n, i in infos.items()} == {
        n: (TaskPhase.PENDING, "ContainerCreating") for n in run.records
    }
    fake.start("worker-0")
    fake.start("worker-1")
    fake.exit("worker-1", 137)
    infos = run.backend.describe(records)
    assert infos["worker/0"].phase is TaskPhase.RUNNING and infos["worker/0"].host == "node-1"
    assert (infos["worker/1"].phase, infos["worker/1"].exit_code) == (TaskPhase.FAILED, 137)
    pod = fake.pod("ps-0")
    assert pod is not None
    with fake.cond:  # the scheduler cannot place it; then an image name that can never run
        pod["status"]["containerStatuses"][0]["state"] = {}
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes: Insufficient nvidia.com/gpu",
            }
        ]
    assert (
        run.backend.describe(records)["ps/0"].detail
        == "Unschedulable: 0/3 nodes: Insufficient nvidia.com/gpu"
    )
    with fake.cond:
        pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "InvalidImageName"}}
    info = run.backend.describe(records)["ps/0"]
    assert (info.phase, info.exit_code) == (TaskPhase.FAILED, 127)
    results = run.backend.cancel(records, 1.0)
    assert {n: r.outcome for n, r in results.items()} == {
        "ps/0": "terminated",
        "worker/0": "terminated",
        "worker/1": "none",
    }  # type: ignore[union-attr]
    assert fake.names("jobs") == [] and fake.names("pods") == []
    run.backend.release(run.allocation)
    assert fake.left() == []


def test_the_api_going_away_makes_tasks_unreachable_not_an_exception(
    fake: FakeKube, tmp_path: Path
) -> None:
    run = _start(tmp_path)
    fake.__exit__()
    infos = run.backend.describe(list(run.records.values()))
    assert {i.phase for i in infos.values()} == {TaskPhase.UNREACHABLE}
    assert "does not answer" in (infos["ps/0"].error or "")


def test_a_followed_log_waits_for_the_pod_and_ends_with_it(fake: FakeKube, tmp_path: Path) -> None:
    run = _start(tmp_path)
    lines: list[str] = []
    got = threading.Event()

    def on_line(line: str) -> None:
        lines.append(line)
        if len(lines) == 2:
            got.set()

    stream = run.backend.stream_log(run.records["worker/0"], on_line)
    fake.start("worker-0")
    fake.write("worker-0", "worker/0 up\nstep=1 loss=0.5\n")
    assert got.wait(30)
    fake.write("worker-0", "no newline at the end")
    fake.exit("worker-0", 0)
    assert stream.join(30) and stream.error is None
    assert lines == ["worker/0 up", "step=1 loss=0.5", "no newline at the end"]
    record = run.records["worker/0"]
    assert run.backend.read_log(record) == b"worker/0 up\nstep=1 loss=0.5\nno newline at the end"
    assert run.backend.read_log(record, -11) == b" at the end"
    assert run.backend.read_log(record, 8, 3) == b" up"


def test_stopping_a_stream_of_a_silent_pod_ends_it(fake: FakeKube, tmp_path: Path) -> None:
    run = _start(tmp_path)
    fake.start("ps-0")
    stream = run.backend.stream_log(run.records["ps/0"], lambda line: None)
    fake.wait(lambda: any("follow" in r for r in fake.requests), "the follow request")
    stream.stop()
    assert stream.done


def test_read_file_prints_the_file_with_a_reader_pod(fake: FakeKube, tmp_path: Path) -> None:
    run = _start(tmp_path)
    output = run.plan.output_dir
    fake.volumes["shared"]["result.json"] = b'{"global_step": 3}'
    assert run.backend.read_file(f"{output}/result.json") == b'{"global_step": 3}'
    assert run.backend.read_file(f"{output}/checkpoint") is None
    assert run.backend.read_file("/elsewhere/result.json") is None
    readers = [c for c in fake.created if "-read-" in c]
    assert len(readers) == 2 and not [p for p in fake.names("pods") if "-read-" in p]


def test_preflight_names_what_is_missing(fake: FakeKube, tmp_path: Path) -> None:
    plan = k8s_plan("cluster.options.output_volume=nope", "cluster.options.service_account=nobody")
    backend = KubernetesBackend(plan.backend, tmp_path)
    with pytest.raises(PreflightError) as error:
        backend.preflight(plan, plan.tasks)
    assert str(error.value) == (
        "preflight failed on 1 host(s): kubernetes: PersistentVolumeClaim nope not found in "
        "namespace default; ServiceAccount nobody not found in namespace default"
    )
    plan = k8s_plan("cluster.options.context=elsewhere")
    with pytest.raises(BackendError, match="cannot use context 'elsewhere' of kubeconfig"):
        KubernetesBackend(plan.backend, tmp_path).preflight(plan, plan.tasks)


# --- the real CLI ------------------------------------------------------------------------------


def _popen_apply(tmp_path: Path, *overrides: str, detach: bool = False) -> subprocess.Popen[str]:
    env = {**os.environ, "TFPLAN_CONF": str(CONF), **_env()}
    env.pop("TFPLAN_DEBUG", None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfplan",
            "apply",
            "--auto-approve",
            *(["--detach"] if detach else []),
            *_overrides(tmp_path, *overrides),
        ],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_apply_supervises_restarts_and_ends_then_status_logs_destroy(
    fake: FakeKube, tmp_path: Path
) -> None:
    apply = _popen_apply(tmp_path)
    try:
        for task in TASKS:
            fake.wait_pod(task)
            fake.start(task)
        fake.write("ps-0", "ps/0 serving\n")
        fake.write("worker-0", "step=1 loss=0.9\n")
        first = fake.wait_pod("worker-1", "Running")
        fake.write("worker-1", "worker/1 up\n")
        fake.exit("worker-1", 137, "OOMKilled")  # killed (OOM): ExitCode retries it
        second = fake.wait_pod("worker-1", "Pending", not_named=first)
        fake.start("worker-1")
        fake.volumes["shared"]["result.json"] = json.dumps(
            {"status": "succeeded", "global_step": 3}
        ).encode()
        fake.write("worker-0", "step=3 loss=0.1\n")
        fake.exit("worker-0", 0)
        fake.exit("worker-1", 0)
        fake.exit("ps-0", 0)
        out, _ = apply.communicate(timeout=120)
    finally:
        if apply.poll() is None:
            apply.kill()
            apply.communicate()
    assert apply.returncode == 0, out
    assert (
        "worker/1 failed (exit code 137): restarting in 0.1s (policy ExitCode, restart 1 of 3)"
        in out
    )
    assert "worker/1: restarted on tfplan-t-worker-1 (restart 1" in out
    # the kubelet's OOMKilled, explained (the fake's pods have no memory limit: no RSS to say)
    assert "worker/1 failed: killed by the out-of-memory killer on host " in out, out[-3000:]
    assert "worker/0     | step=3 loss=0.1" in out
    assert (
        "Training complete" in out and "Result (/tfplan-output/t/result.json): global_step=3" in out
    )
    assert second != first
    # training over: nothing left in the namespace; the logs stay readable from the workspace
    assert fake.left() == []
    record = tmp_path / ".tfplan" / "t" / "output" / "tfplan"
    assert "step=3 loss=0.1" in (record / "logs" / "worker-0.log").read_text()
    assert (
        tmp_path / ".tfplan" / "t" / "backend" / "logs" / "worker-1.log.0"
    ).read_text() == "worker/1 up\n"
    status = tfplan(tmp_path, "status", "--json", env=_env(), check=True)
    rows = {r["task"]: r for r in json.loads(status.stdout)["tasks"]}
    assert {n: r["state"] for n, r in rows.items()} == {
        "ps/0": "succeeded",
        "worker/0": "succeeded",
        "worker/1": "succeeded",
    }
    assert rows["worker/1"]["handle"] == {"job": "tfplan-t-worker-1", "namespace": "default"}
    assert rows["worker/1"]["restarts"] == 1 and rows["worker/0"]["step"] == 3
    logs = tfplan(tmp_path, "logs", "worker/0", env=_env(), check=True)
    assert "worker/0     | step=1 loss=0.9" in logs.stdout
    destroy = tfplan(tmp_path, "destroy", "--auto-approve", env=_env(), check=True)
    assert "Destroy complete!" in destroy.stdout
    assert fake.left() == []


@pytest.mark.full  # the fast tier: status, logs, destroy: the supervised story above
def test_detached_apply_status_logs_and_destroy_of_running_tasks(
    fake: FakeKube, tmp_path: Path
) -> None:
    fake.autostart = True
    proc = tfplan(
        tmp_path,
        "apply",
        "--auto-approve",
        "--detach",
        *_overrides(tmp_path),
        env=_env(),
        check=True,
    )
    assert "Detached" in proc.stdout
    assert sorted(fake.names("jobs")) == [f"tfplan-t-{t}" for t in TASKS]
    fake.write("worker-0", "step=7 loss=0.3\n")
    status = tfplan(tmp_path, "status", env=_env(), check=True)
    for task in ("ps/0", "worker/0", "worker/1"):
        assert task in status.stdout
    assert "job tfplan-t-worker-0" in status.stdout and "running" in status.stdout
    logs = tfplan(tmp_path, "logs", "-n", "1", env=_env(), check=True)
    assert "worker/0     | step=7 loss=0.3" in logs.stdout
    destroy = tfplan(tmp_path, "destroy", "--auto-approve", env=_env(), check=True)
    assert "Destroy complete! 3 task(s) stopped" in destroy.stdout
    assert fake.left() == []


@pytest.mark.parametrize(
    ("overrides", "env", "message"),
    [
        (
            (),
            {"KUBECONFIG": "/nonexistent/kubeconfig"},
            "error: no kubeconfig at /nonexistent/kubeconfig: tfplan apply on Kubernetes needs one",
        ),
        (
            ("cluster.options.namespace=nope",),
            None,
            "error: preflight failed on 1 host(s): kubernetes: namespace nope does not exist (kubectl create namespace nope)",
        ),
        (
            ("cluster.options.output_volume=missing",),
            None,
            "error: preflight failed on 1 host(s): kubernetes: PersistentVolumeClaim missing not found",
        ),
        (("+cluster.options.nmespace=x",), None, "error: cluster.options.nmespace: no such option"),
    ],
)
def test_bad_inputs_are_one_line_and_leave_nothing(
    fake: FakeKube,
    tmp_path: Path,
    overrides: tuple[str, ...],
    env: dict[str, str] | None,
    message: str,
) -> None:
    proc = tfplan(
        tmp_path, "apply", "--auto-approve", *_overrides(tmp_path), *overrides, env=env or _env()
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith(message) and "\n" not in err, err
    assert fake.left() == [] and fake.created == []


def _live(fake: FakeKube) -> dict[str, object]:
    data = fake.objects[("configmaps", "default", "tfplan-t-config")]["data"]
    return dict(json.loads(data["live.json"]))


def test_workers_join_and_leave_a_running_job_as_jobs_added_and_deleted(
    fake: FakeKube, tmp_path: Path
) -> None:
    """In place on Kubernetes: new workers are new Jobs, leavers are told to leave (the API
    cannot signal a container) through live.json, which every pod mounts from the ConfigMap;
    the ps's Job is never touched. (The pods are the fake's: what a recipe does with live.json
    is tested with real processes in test_resize.py and test_live.py.)"""
    fake.autostart = True
    elastic = ["algo=downpour", "data.shard=none", "trainer.max_steps=100000000"]
    job = [*_overrides(tmp_path, *elastic)]
    tfplan(tmp_path, "apply", "--auto-approve", "--detach", *job, env=_env(), check=True)
    ps_job = fake.objects[("jobs", "default", "tfplan-t-ps-0")]["metadata"]["uid"]
    assert _live(fake) == {}
    # every pod mounts live.json beside its run.yaml
    volume = fake.objects[("jobs", "default", "tfplan-t-worker-1")]["spec"]["template"]["spec"][
        "volumes"
    ][0]
    assert {"key": "live.json", "path": "worker-1/live.json"} in volume["configMap"]["items"]

    planned = tfplan(tmp_path, "plan", "--json", "--no-save", *job, "cluster.workers=4", env=_env())
    assert planned.returncode == 0, planned.stderr
    actions = {c["task"]: c["action"] for c in json.loads(planned.stdout)["changes"]}
    assert actions == {
        "ps/0": "no-op",
        "worker/0": "no-op",
        "worker/1": "no-op",
        "worker/2": "create",
        "worker/3": "create",
    }
    grown = tfplan(
        tmp_path, "apply", "--auto-approve", "--detach", *job, "cluster.workers=4", env=_env()
    )
    assert grown.returncode == 0, grown.stdout[-3000:] + grown.stderr
    assert "the job has 4 training replica(s) taking part now" in grown.stdout
    assert sorted(fake.names("jobs")) == [
        f"tfplan-t-{t}" for t in ("ps-0", "worker-0", "worker-1", "worker-2", "worker-3")
    ]
    assert _live(fake)["replicas"] == 4
    assert not [d for d in fake.deleted if d.startswith("Job/")]

    shrink = _popen_apply(tmp_path, *elastic, detach=True)
    try:
        fake.wait(lambda: "leave" in _live(fake), "the leavers to be told", timeout=120)
        assert _live(fake)["leave"] == ["worker/2", "worker/3"]
        assert _live(fake)["replicas"] == 4  # the leavers' done tokens still count
        fake.exit("worker-2", 0)  # what a recipe told to leave does: push, done token, exit 0
        fake.exit("worker-3", 0)
        out, _ = shrink.communicate(timeout=120)
    finally:
        if shrink.poll() is None:
            shrink.kill()
            shrink.communicate()
    assert shrink.returncode == 0, out[-3000:]
    for task in ("worker/2", "worker/3"):
        assert f"{task}: asked to leave the job after its next push (told)" in out
        assert f"{task} left the job (exit code 0)" in out, out[-3000:]
    assert sorted(fake.names("jobs")) == [f"tfplan-t-{t}" for t in ("ps-0", "worker-0", "worker-1")]
    assert "leave" not in _live(fake) and _live(fake)["replicas"] == 4
    assert fake.objects[("jobs", "default", "tfplan-t-ps-0")]["metadata"]["uid"] == ps_job
    assert {t["name"] for t in state_of(tmp_path)["tasks"]} == {"ps/0", "worker/0", "worker/1"}
    tfplan(tmp_path, "destroy", "--auto-approve", env=_env(), check=True)
    assert fake.left() == []
