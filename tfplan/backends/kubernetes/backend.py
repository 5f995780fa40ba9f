"""The Kubernetes backend: every task is a one-pod Job, found by the stable DNS name of its pod.

``tfplan apply cluster=k8s`` creates, through the official client and the user's kubeconfig:
the headless Service (:meth:`allocate`), the ConfigMap with run.yaml and the recipes
(:meth:`stage`), then one Job per task (:meth:`launch`, ``backoffLimit: 0``: tfplan's own
supervisor restarts tasks by their policy, as for every backend). ``status``, ``logs`` and
``destroy`` go through the API too.

Handle: ``{"job": <Job name>, "namespace": ...}``; the Job's pod carries the label
``tfplan/task=<role>-<index>``.

While tasks run, an ended task's Job and pod stay (its log readable); once none runs,
:meth:`release` deletes everything the experiment created, keeping each pod's log in the
workspace (``.tfplan/<experiment>/backend/logs/``), as a process ends and leaves its log. A task
restarted by the supervisor keeps its previous life's log there as ``<role>-<index>.log.<n>``.

Files a task wrote (``result.json``, the checkpoint index) are read with a short-lived reader
pod that mounts the output volume and prints the file to its log: it works while training runs
and after every task has ended (``exec`` would need a live pod), through nothing but the API.
Without ``output_volume`` there is nothing shared to read, and :meth:`read_file` returns None.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfplan.backends.api import (
    Backend,
    CancelResult,
    Capabilities,
    Launched,
    LaunchRequest,
    LogStream,
    Say,
    TaskInfo,
    TaskPhase,
)
from tfplan.backends.delivery import deliver
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.kubernetes.client import REQUEST_TIMEOUT_SECS, Kube, KubeError
from tfplan.backends.kubernetes.export import code_files
from tfplan.backends.kubernetes.manifests import (
    LIVE_KEY,
    PodTask,
    config_map,
    reader_pod,
    request_lines,
    service,
    task_job,
)
from tfplan.backends.kubernetes.options import (
    CONTAINER,
    LABEL_EXPERIMENT,
    LABEL_TASK,
    KubeOptions,
    parse_options,
)
from tfplan.backends.kubernetes.pods import PodLog, pod_info, terminated
from tfplan.errors import BackendError, PreflightError
from tfplan.planning.plan import BackendRef, Plan, Task
from tfplan.planning.state import Allocation, TaskRecord
from tfplan.planning.topology import PerTask, Target, Topology

if TYPE_CHECKING:
    from tfplan.config.schema import ClusterConfig
    from tfplan.planning.context import PlanContext

__all__ = ["CONFIG_MAP_LIMIT", "KubernetesBackend"]

CONFIG_MAP_LIMIT = 1 << 20  # the API server refuses a ConfigMap above 1 MiB
POLL_SECS = 0.2
READER_TIMEOUT_SECS = 90.0
GONE_TIMEOUT_SECS = 60.0  # beyond the grace period, for a deleted pod to disappear


class KubernetesBackend(Backend):
    """Tasks as one-pod Jobs under a headless Service, through the official client."""

    name = "kubernetes"
    capabilities = Capabilities(
        shared_output=False, launch_fanout=8, output_mount_key="cluster.options.output_volume"
    )

    def __init__(self, ref: BackendRef, scratch: Path) -> None:
        super().__init__(ref, scratch)
        self.opts = KubeOptions.from_ref(ref)
        self._kube: Kube | None = None

    @property
    def kube(self) -> Kube:
        """The API client, connected on first use.

        Raises:
            KubeError: no kubeconfig or no such context (one line).
        """
        if self._kube is None:
            self._kube = Kube(self.opts)
        return self._kube

    # ---- plan time -----------------------------------------------------------------------
    @classmethod
    def target(cls, cluster: ClusterConfig, ctx: PlanContext) -> Target:
        """One pod per task, at ``<name>-<role>-<index>.<name>.<namespace>.svc``, port 2222."""
        opts = parse_options(cluster)
        per_task = PerTask(
            name=opts.job("{role}", "{index}"),
            address=opts.address("{role}", "{index}"),
            gpus=opts.gpus,
            port=opts.port,
            python=opts.python,
        )
        topology = Topology(
            per_task=per_task, places_key="cluster.options", slots_key="cluster.options"
        )
        return Target(BackendRef(cls.name, opts.to_config()), topology, resize_in_place=True)

    @classmethod
    def dryrun(cls, plan: Plan) -> tuple[str, ...]:
        return request_lines(plan, KubeOptions.from_ref(plan.backend))

    # ---- apply ---------------------------------------------------------------------------
    def preflight(self, plan: Plan, tasks: Sequence[Task]) -> tuple[()]:
        """The API answers, the namespace, the output PVC and the service account exist, no
        Job of these tasks is left over, and the ConfigMap fits.

        Raises:
            KubeError: no kubeconfig, or the API does not answer.
            PreflightError: what is missing, in one line.
        """
        kube, ns, opts = self.kube, self.opts.namespace, self.opts
        problems: list[str] = []
        try:
            kube.call(f"read namespace {ns}", kube.core.read_namespace, ns)
        except KubeError as error:
            if error.status == 404:
                raise PreflightError(
                    {"kubernetes": f"namespace {ns} does not exist (kubectl create namespace {ns})"}
                ) from None
            if error.status != 403:  # allowed to work in a namespace it may not read
                raise
        checks = [
            (
                "PersistentVolumeClaim",
                opts.output_volume,
                kube.core.read_namespaced_persistent_volume_claim,
            )
        ]
        checks.append(
            ("ServiceAccount", opts.service_account, kube.core.read_namespaced_service_account)
        )
        for kind, name, read in checks:
            if name and not self._exists(f"read {kind} {name}", read, name):
                problems.append(f"{kind} {name} not found in namespace {ns}")
        wanted = {opts.job(t.role.value, t.index) for t in tasks}
        jobs = kube.call(
            "list Jobs", kube.batch.list_namespaced_job, ns, label_selector=opts.selector
        )
        left = sorted(wanted & {j.metadata.name for j in jobs.items})
        if left:
            problems.append(
                f"Job(s) {', '.join(left)} exist already (tfplan destroy, or kubectl delete job)"
            )
        size = sum(len(v.encode()) for v in self._config_map(plan)["data"].values())
        if size > CONFIG_MAP_LIMIT:
            problems.append(
                f"the ConfigMap would hold {size} bytes (run.yaml, the recipes"
                + "".join(f", {c.name} {c.bytes} bytes" for c in plan.user_code)
                + "), over the API's 1 MiB: build an image holding the code "
                "(cluster.options.code=image) or mount your package in a volume"
            )
        if problems:
            raise PreflightError({"kubernetes": "; ".join(problems)})
        return ()  # the pods' interpreter is the image's: no host to ask

    def _exists(self, what: str, read: Callable[..., Any], name: str) -> bool:
        try:
            self.kube.call(what, read, name, self.opts.namespace)
        except KubeError as error:
            if error.status == 404:
                return False
            raise
        return True

    def _config_map(self, plan: Plan, live: str = "{}") -> dict[str, Any]:
        return config_map(self.opts, plan.run_config, code_files(plan, self.opts), live)

    def _told(self) -> str | None:
        """``live.json`` as the ConfigMap holds it now, while a task of the experiment still
        runs (the job is changed in place); None when none runs (a new job starts afresh)."""
        running = [
            p
            for p in self._pods(self.opts.selector)
            if p.status is not None and p.status.phase in ("Pending", "Running")
        ]
        if not running:
            return None
        try:
            current = self._read_config_map()
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        return str((current.data or {}).get(LIVE_KEY, "{}"))

    def _read_config_map(self) -> Any:
        return self.kube.call(
            f"read ConfigMap {self.opts.config_map}",
            self.kube.core.read_namespaced_config_map,
            self.opts.config_map,
            self.opts.namespace,
        )

    def allocate(
        self,
        plan: Plan,
        tasks: Sequence[Task],
        current: Allocation | None,
        say: Say,
        submitted: Callable[[Allocation], None],
    ) -> Allocation:
        """Create the headless Service (kept when this experiment's already exists).

        Raises:
            KubeError: the API refused it, or a Service of that name belongs to something else.
        """
        kube, opts = self.kube, self.opts
        code = sorted(code_files(plan, opts))
        allocation = Allocation(
            id=opts.service,
            data={"namespace": opts.namespace, "code": code, "code_dir": plan.code_dir},
        )
        try:
            kube.call(
                f"create Service {opts.service}",
                kube.core.create_namespaced_service,
                opts.namespace,
                kube.model("V1Service", service(opts)),
            )
            say(f"created Service/{opts.service} (headless) in namespace {opts.namespace}")
        except KubeError as error:
            if error.status != 409:
                raise
            existing = kube.call(
                f"read Service {opts.service}",
                kube.core.read_namespaced_service,
                opts.service,
                opts.namespace,
            )
            owner = (existing.metadata.labels or {}).get(LABEL_EXPERIMENT)
            if owner != opts.name:
                raise KubeError(
                    f"Service {opts.service} exists in namespace {opts.namespace} and is not this "
                    "experiment's: choose another cluster.options.name"
                ) from None
        submitted(allocation)
        return allocation

    def stage(self, plan: Plan, tasks: Sequence[Task], allocation: Allocation) -> None:
        """Create (or replace) the ConfigMap with run.yaml and the recipes, and ``live.json``:
        kept while tasks run (workers join a running job), else empty."""
        kube, opts = self.kube, self.opts
        body = kube.model("V1ConfigMap", self._config_map(plan, self._told() or "{}"))
        try:
            kube.call(
                f"create ConfigMap {opts.config_map}",
                kube.core.create_namespaced_config_map,
                opts.namespace,
                body,
            )
        except KubeError as error:
            if error.status != 409:
                raise
            kube.call(
                f"replace ConfigMap {opts.config_map}",
                kube.core.replace_namespaced_config_map,
                opts.config_map,
                opts.namespace,
                body,
            )

    def launch(self, request: LaunchRequest, allocation: Allocation) -> Launched:
        """Create the task's Job; its pod runs the request's command with its environment."""
        kube, opts = self.kube, self.opts
        if request.keep_log_as:
            self._keep_previous_log(request)
        delivery = deliver(request)
        if delivery.files:
            raise BackendError(
                f"{request.name}: its TF_CONFIG is over Linux's 128 KiB limit for one variable; "
                "the kubernetes backend cannot hand it over as a file yet: split the cluster"
            )
        task = PodTask(
            request.role, request.index, delivery.command, dict(delivery.env), request.workdir
        )
        data = allocation.data
        job = task_job(
            opts,
            task,
            data.get("code", []),
            data.get("code_dir", f"{opts.workdir}/_code"),
            live=True,
        )
        name = job["metadata"]["name"]
        kube.call(
            f"create Job {name}",
            kube.batch.create_namespaced_job,
            opts.namespace,
            kube.model("V1Job", job),
        )
        return Launched(
            handle={"job": name, "namespace": opts.namespace},
            host=request.host,
            address=opts.address(request.role, request.index),
            started_at=time.time(),
        )

    def tell(self, tasks: Sequence[TaskRecord], name: str, data: bytes) -> None:
        """``live.json`` is the ConfigMap's key every task's pod mounts beside its run.yaml:
        one replace (the kubelet brings it into the running pods on its next sync, up to about
        a minute on a real cluster)."""
        if name != LIVE_KEY:
            raise BackendError(f"the kubernetes backend can tell running tasks {LIVE_KEY} only")
        kube, opts = self.kube, self.opts
        current = self._read_config_map()
        current.data = {**(current.data or {}), LIVE_KEY: data.decode()}
        kube.call(
            f"replace ConfigMap {opts.config_map}",
            kube.core.replace_namespaced_config_map,
            opts.config_map,
            opts.namespace,
            current,
        )

    def release(self, allocation: Allocation) -> None:
        """Once no task runs: delete what is left of the experiment (its ended Jobs, their logs
        kept in the workspace for ``tfplan logs``), the Service and the ConfigMap."""
        kube, ns = self.kube, self.opts.namespace
        for pod in self._pods(self.opts.selector):
            task = (pod.metadata.labels or {}).get(LABEL_TASK)
            if task:
                self._save_log_as(self.scratch / "logs" / f"{task}.log", pod)
        jobs = kube.call(
            "list Jobs", kube.batch.list_namespaced_job, ns, label_selector=self.opts.selector
        )
        for job in jobs.items:
            name = job.metadata.name
            self._delete(
                f"delete Job {name}",
                kube.batch.delete_namespaced_job,
                name,
                0,
                propagation_policy="Foreground",
            )
        for kind, name, delete in (
            ("Service", self.opts.service, kube.core.delete_namespaced_service),
            ("ConfigMap", self.opts.config_map, kube.core.delete_namespaced_config_map),
        ):
            self._delete(f"delete {kind} {name}", delete, name, 0)

    # ---- observe and control -------------------------------------------------------------
    def _pods(self, selector: str) -> list[Any]:
        pods = self.kube.call(
            "list pods",
            self.kube.core.list_namespaced_pod,
            self.opts.namespace,
            label_selector=selector,
        )
        return sorted(
            pods.items,
            key=lambda p: (
                p.metadata.creation_timestamp is not None,
                p.metadata.creation_timestamp or 0,
            ),
        )

    def _task_selector(self, task: TaskRecord) -> str:
        return f"{self.opts.selector},{LABEL_TASK}={task.role}-{task.index}"

    def _pod_of(self, task: TaskRecord) -> Any | None:
        """The newest pod of the task's current Job, or None."""
        job = task.handle.get("job")
        pods = [
            p
            for p in self._pods(self._task_selector(task))
            if (p.metadata.labels or {}).get("job-name") in (None, job)
        ]
        return pods[-1] if pods else None

    def oom_kills(self, task: TaskRecord) -> list[dict[str, object]]:
        """The kubelet's word: the task's container ended ``OOMKilled`` (its memory limit, or
        the node's memory). The RSS at the kill is the container's memory limit, when it has
        one."""
        from kubernetes.utils import parse_quantity

        pod = self._pod_of(task)
        if pod is None or terminated(pod, CONTAINER)[1] != "OOMKilled":
            return []
        limit = 0
        for container in pod.spec.containers or []:
            limits = (container.resources.limits or {}) if container.resources else {}
            if container.name == CONTAINER and limits.get("memory"):
                limit = int(parse_quantity(limits["memory"]))  # type: ignore[no-untyped-call]
        return [{"pid": 0, "name": CONTAINER, "rss": limit, "at": time.time()}]

    def describe(self, tasks: Sequence[TaskRecord]) -> dict[str, TaskInfo]:
        """One list of the experiment's pods (and of its Jobs when a pod is missing)."""
        try:
            pods = self._pods(self.opts.selector)
            by_task: dict[str, Any] = {}
            for pod in pods:
                labels = pod.metadata.labels or {}
                if LABEL_TASK in labels:
                    by_task[labels[LABEL_TASK]] = pod  # sorted: the newest wins
            jobs: set[str] | None = None
            out: dict[str, TaskInfo] = {}
            for task in tasks:
                pod = by_task.get(f"{task.role}-{task.index}")
                if pod is not None:
                    out[task.name] = pod_info(pod)
                    continue
                if jobs is None:
                    listed = self.kube.call(
                        "list Jobs",
                        self.kube.batch.list_namespaced_job,
                        self.opts.namespace,
                        label_selector=self.opts.selector,
                    )
                    jobs = {j.metadata.name for j in listed.items}
                if task.handle.get("job") in jobs:
                    out[task.name] = TaskInfo(TaskPhase.PENDING, detail="Job created, no pod yet")
                else:
                    out[task.name] = TaskInfo(TaskPhase.FAILED, detail="its Job is gone")
            return out
        except KubeError as error:
            return {
                t.name: TaskInfo(TaskPhase.UNREACHABLE, host=t.host, error=str(error))
                for t in tasks
            }

    def cancel(
        self, tasks: Sequence[TaskRecord], grace_secs: float
    ) -> dict[str, CancelResult | Exception]:
        """Delete each task's pods (grace period ``grace_secs``) and its Job (foreground), and
        wait until they are gone, all tasks at once. A running pod's log is followed to its end
        and kept, with what the program wrote while it stopped; a pod gone within the grace
        period ``terminated``, one that outlived it ``killed``."""
        return dict(run_on_hosts({t.name: t for t in tasks}, lambda t: self._stop(t, grace_secs)))

    def _stop(self, task: TaskRecord, grace_secs: float) -> CancelResult:
        kube, ns = self.kube, self.opts.namespace
        began = time.monotonic()
        selector = self._task_selector(task)
        pods = self._pods(selector)
        live = any(p.status is not None and p.status.phase in ("Pending", "Running") for p in pods)
        follow = None
        if pods:
            self._save_log(task, pods[-1])
            if pods[-1].status is not None and pods[-1].status.phase == "Running":
                follow = self._follow_to_end(pods[-1], grace_secs + GONE_TIMEOUT_SECS)
        grace = math.ceil(grace_secs)
        for pod in pods:
            self._delete(
                f"delete pod {pod.metadata.name}",
                kube.core.delete_namespaced_pod,
                pod.metadata.name,
                grace,
            )
        job = str(task.handle.get("job") or self.opts.job(task.role, task.index))
        self._delete(
            f"delete Job {job}",
            kube.batch.delete_namespaced_job,
            job,
            grace,
            propagation_policy="Foreground",
        )
        if follow is not None:  # what it wrote while it stopped (its SIGTERM handler's words)
            self._save_followed(task, follow)
        deadline = began + grace_secs + GONE_TIMEOUT_SECS
        while self._pods(selector) or self._exists(
            f"read Job {job}", kube.batch.read_namespaced_job, job
        ):
            if time.monotonic() > deadline:
                raise BackendError(
                    f"Job {job} in namespace {ns} still has pods {GONE_TIMEOUT_SECS:.0f}s after its grace period"
                )
            time.sleep(POLL_SECS)
        elapsed = time.monotonic() - began
        # the kubelet kills no sooner than ``grace`` seconds after the delete (sent after
        # ``began``): pods gone before that ended on SIGTERM; later, they outlived their grace
        outcome = "none" if not live else ("terminated" if elapsed < grace else "killed")
        return CancelResult(outcome, elapsed)

    def _delete(
        self, what: str, delete: Callable[..., Any], name: str, grace: int, **kwargs: Any
    ) -> None:
        try:
            self.kube.call(
                what, delete, name, self.opts.namespace, grace_period_seconds=grace, **kwargs
            )
        except KubeError as error:
            if error.status != 404:
                raise

    # ---- logs and files ------------------------------------------------------------------
    def _log_file(self, task: TaskRecord | LaunchRequest) -> Path:
        return self.scratch / "logs" / f"{task.role}-{task.index}.log"

    def _save_log(self, task: TaskRecord, pod: Any) -> None:
        """Keep a pod's log before its Job is deleted (a restart keeps the previous life's)."""
        self._save_log_as(self._log_file(task), pod)

    def _save_log_as(self, path: Path, pod: Any) -> None:
        if pod.status is None or pod.status.phase == "Pending":
            return
        try:
            data = self._log(pod.metadata.name)
        except KubeError:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def _follow(self, pod: Any, timeout: Any) -> Any:
        """The streaming response of a follow of ``pod``'s log (``timeout``: the client's
        ``_request_timeout``, None for none)."""
        return self.kube.call(
            f"follow the log of pod {pod.metadata.name}",
            self.kube.core.read_namespaced_pod_log,
            pod.metadata.name,
            self.opts.namespace,
            container=CONTAINER,
            follow=True,
            _preload_content=False,
            _request_timeout=timeout,
        )

    def _follow_to_end(self, pod: Any, read_secs: float) -> Any | None:
        """A follow of a running pod's log, opened before it is deleted: read to its end (the
        container's), it holds the whole log; None when it cannot be opened."""
        try:
            return self._follow(pod, (REQUEST_TIMEOUT_SECS, read_secs))
        except KubeError:
            return None

    def _save_followed(self, task: TaskRecord, response: Any) -> None:
        """The followed log, once the pod ended, as the task's saved log (when it was read to
        its end: else the one saved before the delete stays)."""
        from urllib3.exceptions import HTTPError

        try:
            data = bytes(response.data)
        except (HTTPError, OSError):
            return
        finally:
            response.release_conn()
        path = self._log_file(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def _keep_previous_log(self, request: LaunchRequest) -> None:
        saved = self._log_file(request)
        if saved.exists() and request.keep_log_as:  # worker-1.log -> worker-1.log.0, as task.log.0
            saved.replace(
                saved.with_name(saved.name + (Path(request.keep_log_as).suffix or ".prev"))
            )

    def _log(self, pod: str, container: str = CONTAINER, **kwargs: Any) -> bytes:
        response = self.kube.call(
            f"read the log of pod {pod}",
            self.kube.core.read_namespaced_pod_log,
            pod,
            self.opts.namespace,
            container=container,
            _preload_content=False,
            **kwargs,
        )
        try:
            return bytes(response.data)
        finally:
            response.release_conn()

    def read_log(self, task: TaskRecord, offset: int = 0, max_bytes: int = 16 << 20) -> bytes:
        pod = self._pod_of(task)
        if pod is None or pod.status is None or pod.status.phase == "Pending":
            saved = self._log_file(task)
            data = saved.read_bytes() if pod is None and saved.exists() else b""
        elif offset < 0:
            data = self._log(pod.metadata.name, tail_lines=max(50, -offset // 20))
        else:
            data = self._log(pod.metadata.name, limit_bytes=offset + max_bytes)
        return data[offset:] if offset < 0 else data[offset : offset + max_bytes]

    def stream_log(self, task: TaskRecord, on_line: Callable[[str], None]) -> LogStream:
        """Follow the pod's log (it waits for the pod to start); ends when the pod ends."""
        return PodLog(task.name, lambda: self._open_follow(task)).stream(on_line)

    def _open_follow(self, task: TaskRecord) -> tuple[Any | None, bool]:
        """(the follow response of the task's started pod, or None; whether it never will be)."""
        pod = self._pod_of(task)
        if pod is None:
            job = str(task.handle.get("job"))
            return None, not self._exists(
                f"read Job {job}", self.kube.batch.read_namespaced_job, job
            )
        if pod.status is None or pod.status.phase == "Pending":
            return None, False
        try:
            response = self._follow(pod, None)
        except KubeError as error:
            if error.status in (400, 404):  # the container is not started yet, or just went
                return None, False
            raise
        return response, False

    def read_file(self, path: str, near: str | None = None) -> bytes | None:
        """A file of the output volume, printed by a reader pod; None without a volume or
        when the file does not exist.

        Raises:
            KubeError: the API refused the pod, or it did not finish in time.
        """
        opts, kube = self.opts, self.kube
        if not opts.output_volume or not path.startswith(opts.output_dir.rstrip("/") + "/"):
            return None
        read_pvc = kube.core.read_namespaced_persistent_volume_claim
        if not self._exists(
            f"read PersistentVolumeClaim {opts.output_volume}", read_pvc, opts.output_volume
        ):
            return None
        name = f"{opts.name}-read-{uuid.uuid4().hex[:8]}"
        kube.call(
            f"create pod {name}",
            kube.core.create_namespaced_pod,
            opts.namespace,
            kube.model("V1Pod", reader_pod(opts, name, path)),
        )
        try:
            deadline = time.monotonic() + READER_TIMEOUT_SECS
            while True:
                pod = kube.call(
                    f"read pod {name}", kube.core.read_namespaced_pod, name, opts.namespace
                )
                phase = pod.status.phase if pod.status else None
                if phase == "Succeeded":
                    return self._log(name, "reader")
                if phase == "Failed":
                    code, reason = terminated(pod, "reader")
                    if code == 3:
                        return None
                    raise KubeError(
                        f"reading {path}: pod {name} failed ({reason or f'exit code {code}'})"
                    )
                if time.monotonic() > deadline:
                    raise KubeError(
                        f"reading {path}: pod {name} did not finish in {READER_TIMEOUT_SECS:.0f}s ({phase})"
                    )
                time.sleep(POLL_SECS)
        finally:
            self._delete(f"delete pod {name}", kube.core.delete_namespaced_pod, name, 0)

    def handle_text(self, task: TaskRecord) -> str:
        return f"job {task.handle.get('job')}"

    def close(self) -> None:
        if self._kube is not None:
            self._kube.close()
            self._kube = None
