"""A fake Kubernetes API server on 127.0.0.1, for the Kubernetes backend's tests only.

No Kubernetes cluster can run on the test machines, so this stands in for the one thing that
cannot exist here: the API server, and the controllers behind it that tfplan relies on. It
serves just the endpoints the backend calls (namespaces, PVCs and service accounts read;
services, configmaps, jobs and pods created, read, listed by label, replaced and deleted; pod
logs, followed over a chunked response) and simulates:

- the Job controller: a created Job gets one Pod (``<job>-<5 letters>``, labels of its template
  plus ``job-name``), Pending with its container "ContainerCreating";
- the kubelet, as the test drives it: :meth:`FakeKube.start` (Running on node ``node-1``),
  :meth:`FakeKube.write` (log lines), :meth:`FakeKube.exit` (Succeeded, or Failed with an exit
  code); deleting a Job deletes its pods; a pod's log follow ends when the pod ends;
- the reader pod of ``read_file``: a pod labelled ``tfplan/reader`` prints the file its
  ``sh -c 'test -f "$1" || exit 3; cat "$1"'`` names from the PVC contents the test gave
  (:attr:`FakeKube.volumes`), or fails with exit code 3.

With ``FakeKube(run_pods=True)`` the kubelet is not the test's but a real one of sorts: every
pod created (a task's, a reader's) runs its container as a local process, as a kubelet would:

- the process: ``command`` + ``args``, with Kubernetes' ``$(VAR)``/``$$`` expansion; the
  environment is this process's own (standing for the image's) plus the container's ``env``;
  ``workingDir`` (created when missing; ``/`` without one). In its own session and process
  group (``start_new_session``): the group is the container.
- its stdout and stderr, interleaved as written, go to the pod's log as they come (reads and
  follows see them at once); the pod is Running on ``node-1`` once the process started, then
  Succeeded or Failed with its exit code (killed by signal N: 128+N, as a container runtime
  says), reason ``Completed`` or ``Error``. When the main process ends, the rest of its group
  is killed (a container's PID namespace ends with its init). A command that cannot start is a
  Failed pod, exit code 128, reason ``StartError``.
- deleting a running pod (or its Job) is the kubelet's graceful stop: the pod gets a
  ``deletionTimestamp`` and stays, SIGTERM goes to the process group, SIGKILL after the grace
  period, and the pod goes once the process has ended (its ended status is written just before:
  no client can count on seeing it). The grace period is the delete's ``gracePeriodSeconds``,
  else the pod's ``terminationGracePeriodSeconds``, else 30 s; 0 removes the pod at once and
  kills the group. Deleting a Job is the garbage collector's: each of its pods is deleted with
  the pod's own grace period; ``propagationPolicy=Foreground`` keeps the Job (with a
  ``deletionTimestamp``) until its pods are gone, any other policy removes it at once (Orphan
  is not simulated: the pods always go).
- volumes are this machine's folders: a mount path is a local path (a PVC's contents are what
  is there, :attr:`FakeKube.volumes` is not read), and nothing is mounted (the ConfigMap's
  files are not written).

Not supported, and reported as the kubelet would report a container it cannot create
(waiting, ``CreateContainerConfigError``): an env ``valueFrom`` (the downward API, secrets,
ConfigMap keys), ``envFrom``, a container without ``command`` (an image's entrypoint). Only the
first container of a pod runs; no restarts (``restartPolicy`` is Never for every pod the
backend creates), no probes, no resource limits, no OOM kills. A process that leaves its
process group (``setsid``) is not followed. Every process started is killed (its group, by the
group id it was started with: never by name) when the fake stops.

Every change notifies a condition variable: tests wait for events (:meth:`FakeKube.wait`), not
for time to pass. What it does not do is everything else a cluster does (scheduling, DNS,
images, volumes, the real API's validation): the backend was not run against a real cluster.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import string
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

KINDS = {"services": "Service", "configmaps": "ConfigMap", "jobs": "Job", "pods": "Pod"}
NODE = "node-1"
DEFAULT_GRACE_SECS = 30  # a pod's terminationGracePeriodSeconds when it sets none
PUMP_JOIN_SECS = 10.0  # a process that left the container's group may hold its output open
_EXPANSION = re.compile(r"\$\$|\$\(([^)]*)\)")


def _now(later: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=later)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.body = _status(code, reason, message)


class Unsupported(Exception):
    """A container the fake kubelet cannot run (see the module docstring)."""


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of a command word or an env value: ``$$`` -> ``$``, ``$(NAME)`` ->
    its value when defined (else as is), anything else as is."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        return "$" if name is None else env.get(name, match.group(0))

    return _EXPANSION.sub(one, text)


@dataclass
class Container:
    """A pod's container as the fake kubelet runs it: a local process, leader of its group."""

    ns: str
    pod: str
    proc: subprocess.Popen[bytes]
    reaped: bool = False  # set (under the fake's lock) once waited for: its pid may be reused
    ended: threading.Event = field(default_factory=threading.Event)
    waiter: threading.Thread | None = None


def container_process(spec: dict[str, Any]) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment, working folder) of a container spec, as a kubelet resolves them.

    Raises:
        Unsupported: what the fake kubelet cannot resolve.
    """
    if spec.get("envFrom"):
        raise Unsupported("envFrom is not supported by the fake kubelet")
    declared: dict[str, str] = {}
    for item in spec.get("env") or []:
        if "valueFrom" in item:
            raise Unsupported(f"env {item['name']}: valueFrom is not supported by the fake kubelet")
        declared[item["name"]] = expand(item.get("value", ""), declared)
    if not spec.get("command"):
        raise Unsupported("no command: the fake kubelet has no image to take an entrypoint from")
    words = [*spec["command"], *(spec.get("args") or [])]
    argv = [expand(word, declared) for word in words]
    return argv, {**os.environ, **declared}, spec.get("workingDir") or "/"


class FakeKube:
    """The fake API server and its simulated controllers (see the module docstring)."""

    def __init__(
        self,
        namespaces: tuple[str, ...] = ("default",),
        claims: tuple[str, ...] = (),
        service_accounts: tuple[str, ...] = (),
        run_pods: bool = False,
    ) -> None:
        self.cond = threading.Condition()
        self.namespaces = set(namespaces)
        self.service_accounts = set(service_accounts)
        self.volumes: dict[str, dict[str, bytes]] = {c: {} for c in claims}  # claim -> path -> data
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name) -> obj
        self.logs: dict[str, bytearray] = {}  # pod name -> its container's log
        self.created: list[str] = []  # "Kind/name", in order of creation
        self.deleted: list[str] = []
        self.requests: list[str] = []  # "METHOD path?query", in order
        self.autostart = False  # new task pods go Running at once
        self.run_pods = run_pods  # the kubelet runs every pod's container (module docstring)
        self.containers: dict[str, Container] = {}  # pod name -> its process (run_pods)
        self.closing = False
        self._version = 1
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ---- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> FakeKube:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.cond:
            self.closing = True
            containers = list(self.containers.values())
            for container in containers:
                self._signal(container, signal.SIGKILL)
            self.cond.notify_all()
        for container in containers:  # each waited for: no process of it is left
            if container.waiter is not None:
                container.waiter.join()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def kubeconfig(self, path: Path, context: str = "fake") -> Path:
        """A kubeconfig that points the official client at this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "fake-token"}}],
            "contexts": [{"name": context, "context": {"cluster": "fake", "user": "tester"}}],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # ---- what tests look at and drive -----------------------------------------------------
    def names(self, kind: str) -> list[str]:
        with self.cond:
            return sorted(name for (k, _, name) in self.objects if k == kind)

    def left(self) -> list[str]:
        """Every object still stored, as Kind/name."""
        with self.cond:
            return sorted(f"{KINDS[k]}/{name}" for (k, _, name) in self.objects)

    def pod(self, task: str) -> dict[str, Any] | None:
        """The newest pod of task ``worker-1`` (by its ``tfplan/task`` label)."""
        with self.cond:
            pods = [
                p
                for (k, _, _), p in self.objects.items()
                if k == "pods" and p["metadata"]["labels"].get("tfplan/task") == task
            ]
            return pods[-1] if pods else None

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        """Block until ``predicate()`` is true (re-checked at every change)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate()
                if value:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
                self.cond.wait(remaining)

    def wait_pod(self, task: str, phase: str = "Pending", not_named: str | None = None) -> str:
        """Wait for a pod of ``task`` in ``phase`` (and not the one named ``not_named``)."""

        def found() -> str | None:
            pod = self.pod(task)
            ok = pod and pod["status"]["phase"] == phase and pod["metadata"]["name"] != not_named
            return pod["metadata"]["name"] if ok and pod else None

        name: str = self.wait(found, f"a {phase} pod of {task}")
        return name

    def start(self, task: str) -> None:
        with self.cond:
            pod = self._must_pod(task)
            self._run(pod)

    def write(self, task: str, text: str) -> None:
        with self.cond:
            pod = self._must_pod(task)
            self.logs.setdefault(pod["metadata"]["name"], bytearray()).extend(text.encode())
            self.cond.notify_all()

    def exit(self, task: str, code: int, reason: str | None = None) -> None:
        """The container ends with ``code``; ``reason`` as the kubelet gives it (OOMKilled)."""
        with self.cond:
            self._end(self._must_pod(task), code, reason)

    def _must_pod(self, task: str) -> dict[str, Any]:
        pod = self.pod(task)
        if pod is None:
            raise AssertionError(f"no pod of {task}")
        return pod

    # ---- simulated controllers (called with the lock held) --------------------------------
    def _run(self, pod: dict[str, Any]) -> None:
        pod["spec"]["nodeName"] = NODE
        pod["status"]["phase"] = "Running"
        pod["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": _now()}}
        pod["status"]["containerStatuses"][0]["ready"] = True
        self.cond.notify_all()

    def _end(self, pod: dict[str, Any], code: int, reason: str | None = None) -> None:
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        reason = reason or ("Completed" if code == 0 else "Error")
        container = pod["status"]["containerStatuses"][0]
        container["state"] = {"terminated": {"exitCode": code, "reason": reason}}
        container["ready"] = False
        self.cond.notify_all()

    def _created_pod(self, ns: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self.logs.setdefault(name, bytearray())
        containers = pod["spec"]["containers"]
        pod["status"] = {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": containers[0]["name"],
                    "image": containers[0]["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                }
            ],
        }
        labels = pod["metadata"].get("labels") or {}
        if self.run_pods:
            self._start_container(ns, pod)
        elif labels.get("tfplan/reader") == "true":
            self._read(ns, pod)
        elif self.autostart:
            self._run(pod)

    # ---- the kubelet of run_pods (called with the lock held, but for the threads) ----------
    def _start_container(self, ns: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        status = pod["status"]["containerStatuses"][0]
        if self.closing:  # the fake stops: nothing starts that __exit__ would not end
            return
        try:
            argv, env, cwd = container_process(pod["spec"]["containers"][0])
        except Unsupported as error:
            reason = "CreateContainerConfigError"
            status["state"] = {"waiting": {"reason": reason, "message": str(error)}}
            self.cond.notify_all()
            return
        try:
            Path(cwd).mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as error:  # what runc says of a command it cannot exec
            pod["spec"]["nodeName"] = NODE
            pod["status"]["phase"] = "Failed"
            status["state"] = {
                "terminated": {"exitCode": 128, "reason": "StartError", "message": str(error)}
            }
            self.cond.notify_all()
            return
        container = Container(ns, name, proc)
        self.containers[name] = container
        self._run(pod)
        pump = threading.Thread(target=self._pump, args=(container,), daemon=True)
        container.waiter = threading.Thread(
            target=self._wait_container, args=(container, pump), daemon=True
        )
        pump.start()
        container.waiter.start()

    def _pump(self, container: Container) -> None:
        """The container's output into its pod's log, as it comes."""
        stream = container.proc.stdout
        assert stream is not None
        with stream:
            while chunk := os.read(stream.fileno(), 65536):
                with self.cond:
                    self.logs[container.pod].extend(chunk)
                    self.cond.notify_all()

    def _wait_container(self, container: Container, pump: threading.Thread) -> None:
        """The container's end: the rest of its group killed, its status, and, when it was
        being deleted, the pod removed."""
        proc = container.proc
        # exited, not reaped yet: its pid still names its group, which no one else can have
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # reaped by someone else: its pid may name another group now
            with self.cond:
                container.reaped = True
        with self.cond:
            self._signal(container, signal.SIGKILL)  # the container ends with its init
            returncode = proc.wait()
            container.reaped = True
            container.ended.set()
        pump.join(PUMP_JOIN_SECS)  # its log complete (the group is gone: its pipe is closed)
        code = 128 - returncode if returncode < 0 else returncode
        with self.cond:
            pod = self.objects.get(("pods", container.ns, container.pod))
            if pod is None:  # deleted at once (grace period 0)
                return
            self._end(pod, code)
            if pod["metadata"].get("deletionTimestamp"):
                self._remove("pods", container.ns, container.pod)

    def _signal(self, container: Container, sig: int) -> None:
        """``sig`` to the container's process group, while its leader is not reaped."""
        if not container.reaped:
            try:
                os.killpg(container.proc.pid, sig)
            except ProcessLookupError:
                pass

    def _kill_after(self, container: Container, grace: float) -> None:
        if not container.ended.wait(grace):  # the kubelet's grace period ran out
            with self.cond:
                self._signal(container, signal.SIGKILL)

    def _delete_pod(self, ns: str, name: str, grace: int | None) -> dict[str, Any]:
        """A graceful delete, as the API server and the kubelet do it (module docstring)."""
        pod = self.objects.get(("pods", ns, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        container = self.containers.get(name)
        running = container is not None and not container.ended.is_set()
        if grace is None:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECS))
        if container is None or not running or grace == 0:
            if container is not None:
                self._signal(container, signal.SIGKILL)
            self._remove("pods", ns, name)
            return pod
        meta = pod["metadata"]
        if "deletionTimestamp" in meta:  # already stopping (a shorter grace: not simulated)
            return pod
        meta["deletionTimestamp"] = _now(grace)
        meta["deletionGracePeriodSeconds"] = grace
        self._signal(container, signal.SIGTERM)
        threading.Thread(target=self._kill_after, args=(container, grace), daemon=True).start()
        self.cond.notify_all()
        return pod

    def _delete_job(self, ns: str, name: str, policy: str | None) -> dict[str, Any]:
        """The garbage collector: the Job's pods deleted with their own grace period."""
        job = self.objects.get(("jobs", ns, name))
        if job is None:
            raise ApiError(404, "NotFound", f'jobs "{name}" not found')
        for pod in self._pods_of(ns, name):
            if "deletionTimestamp" not in pod["metadata"]:
                self._delete_pod(ns, pod["metadata"]["name"], None)
        if policy == "Foreground" and self._pods_of(ns, name):
            job["metadata"]["deletionTimestamp"] = _now()
            job["metadata"]["finalizers"] = ["foregroundDeletion"]
            self.cond.notify_all()
        elif ("jobs", ns, name) in self.objects:
            self._remove("jobs", ns, name)
        return job

    def _pods_of(self, ns: str, job: str) -> list[dict[str, Any]]:
        return [
            p
            for (k, n, _), p in self.objects.items()
            if k == "pods" and n == ns and p["metadata"]["labels"].get("job-name") == job
        ]

    def _remove(self, kind: str, ns: str, name: str) -> None:
        """An object gone from the store; a Job deleted in the foreground goes with its last
        pod."""
        del self.objects[(kind, ns, name)]
        self.deleted.append(f"{KINDS[kind]}/{name}")
        for (k, n, job), obj in list(self.objects.items()):
            if (
                k == "jobs"
                and n == ns
                and obj["metadata"].get("deletionTimestamp")
                and not self._pods_of(ns, job)
            ):
                del self.objects[(k, n, job)]
                self.deleted.append(f"Job/{job}")
        self.cond.notify_all()

    def _read(self, ns: str, pod: dict[str, Any]) -> None:
        """The reader pod's command, as its container would run it."""
        command = pod["spec"]["containers"][0]["command"]
        assert command[:2] == ["sh", "-c"] and command[3] == "tfplan-read", command
        path = command[4].replace("$$", "$")
        data = None
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"].get("volumes", [])
            if "persistentVolumeClaim" in v
        }
        for mount in pod["spec"]["containers"][0].get("volumeMounts", []):
            root = mount["mountPath"].rstrip("/") + "/"
            if mount["name"] in claims and path.startswith(root):
                data = self.volumes.get(claims[mount["name"]], {}).get(path[len(root) :])
        self._run(pod)
        if data is not None:
            self.logs[pod["metadata"]["name"]].extend(data)
        self._end(pod, 0 if data is not None else 3)

    def _job_created(self, ns: str, job: dict[str, Any]) -> None:
        template = job["spec"]["template"]
        name = job["metadata"]["name"]
        suffix = "".join(random.choices(string.ascii_lowercase, k=5))
        labels = {
            **(template.get("metadata") or {}).get("labels", {}),
            "job-name": name,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": job["metadata"]["uid"],
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{suffix}",
                "namespace": ns,
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                    }
                ],
            },
            "spec": json.loads(json.dumps(template["spec"])),
        }
        self._store("pods", ns, pod)
        self._created_pod(ns, pod)

    # ---- the store (called with the lock held) --------------------------------------------
    def _store(self, kind: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        if (kind, ns, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{kind} "{name}" already exists')
        self._version += 1
        obj["metadata"].update(
            namespace=ns,
            uid=str(uuid.uuid4()),
            resourceVersion=str(self._version),
            creationTimestamp=_now(),
        )
        self.objects[(kind, ns, name)] = obj
        self.created.append(f"{KINDS[kind]}/{name}")
        self.cond.notify_all()
        return obj

    def _delete(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        obj = self.objects.pop((kind, ns, name), None)
        if obj is None:
            raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
        self.deleted.append(f"{KINDS[kind]}/{name}")
        if kind == "jobs":  # foreground or background: the Job's pods go with it
            for key, pod in list(self.objects.items()):
                if key[0] == "pods" and pod["metadata"]["labels"].get("job-name") == name:
                    self._delete("pods", ns, key[2])
        self.cond.notify_all()
        return obj

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        """One API request -> (status, JSON body); the pod log is served by the handler."""
        parts = [p for p in path.split("/") if p]
        with self.cond:
            if parts[:2] == ["apis", "batch"]:
                parts = parts[3:]  # apis/batch/v1/namespaces/...
            elif parts[:2] == ["api", "v1"]:
                parts = parts[2:]
            else:
                raise ApiError(404, "NotFound", f"no route {path}")
            if parts[0] != "namespaces" or len(parts) < 2:
                raise ApiError(404, "NotFound", f"no route {path}")
            ns = parts[1]
            if ns not in self.namespaces:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
            if len(parts) == 2:
                return 200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            kind, name = parts[2], (parts[3] if len(parts) > 3 else None)
            if kind in ("persistentvolumeclaims", "serviceaccounts") and name is not None:
                known = self.volumes if kind == "persistentvolumeclaims" else self.service_accounts
                if name not in known:
                    raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
                what = (
                    "PersistentVolumeClaim"
                    if kind == "persistentvolumeclaims"
                    else "ServiceAccount"
                )
                return 200, {
                    "apiVersion": "v1",
                    "kind": what,
                    "metadata": {"name": name, "namespace": ns},
                }
            if kind not in KINDS:
                raise ApiError(404, "NotFound", f"no route {path}")
            return self._crud(method, kind, ns, name, query, body)

    def _crud(
        self, method: str, kind: str, ns: str, name: str | None, query: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        if name is None and method == "POST":
            obj = self._store(kind, ns, body)
            if kind == "jobs":
                obj["status"] = {}
                self._job_created(ns, obj)
            elif kind == "pods":
                self._created_pod(ns, obj)
            return 201, obj
        if name is None and method == "GET":
            items = [o for (k, n, _), o in self.objects.items() if k == kind and n == ns]
            wanted = dict(
                part.split("=", 1) for part in query.get("labelSelector", "").split(",") if part
            )
            items = [o for o in items if _matches(o, wanted)]
            return 200, {
                "apiVersion": "v1" if kind != "jobs" else "batch/v1",
                "kind": f"{KINDS[kind]}List",
                "metadata": {"resourceVersion": str(self._version)},
                "items": items,
            }
        if name is not None and method == "GET":
            found = self.objects.get((kind, ns, name))
            if found is None:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            return 200, found
        if name is not None and method == "PUT":
            if (kind, ns, name) not in self.objects:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            self.objects[(kind, ns, name)] = body
            self.cond.notify_all()
            return 200, body
        if name is not None and method == "DELETE":
            options = body if isinstance(body, dict) else {}
            grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            policy = query.get("propagationPolicy", options.get("propagationPolicy"))
            if self.run_pods and kind == "pods":
                obj = self._delete_pod(ns, name, None if grace is None else int(grace))
            elif self.run_pods and kind == "jobs":
                obj = self._delete_job(ns, name, policy)
            else:
                obj = self._delete(kind, ns, name)
            if kind in ("jobs", "configmaps"):
                return 200, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                }
            return 200, obj
        raise ApiError(405, "MethodNotAllowed", f"{method} {kind}")

    def log_chunks(self, ns: str, pod: str, query: dict[str, str]) -> Iterator[bytes]:
        """A pod's log: all of it, or (follow) as it grows until the pod ends or goes."""
        with self.cond:
            obj = self.objects.get(("pods", ns, pod))
            if obj is None:
                raise ApiError(404, "NotFound", f'pods "{pod}" not found')
            if obj["status"]["phase"] == "Pending":
                raise ApiError(
                    400,
                    "BadRequest",
                    f'container "{obj["spec"]["containers"][0]["name"]}" in pod "{pod}" is '
                    "waiting to start: ContainerCreating",
                )
        yield b""  # the request is valid: the response starts
        follow = query.get("follow") == "true"
        sent = 0
        while True:
            with self.cond:
                data = bytes(self.logs.get(pod, b""))
                obj = self.objects.get(("pods", ns, pod))
                ended = obj is None or obj["status"]["phase"] in ("Succeeded", "Failed")
                if len(data) == sent and follow and not ended and not self.closing:
                    self.cond.wait(5)
                    continue
            if not follow:
                if "tailLines" in query:
                    lines = data.splitlines(keepends=True)[-int(query["tailLines"]) :]
                    data = b"".join(lines)
                if "limitBytes" in query:
                    data = data[: int(query["limitBytes"])]
                yield data
                return
            if len(data) > sent:
                yield data[sent:]
                sent = len(data)
                continue
            return  # the pod ended (or went, or the server stops): the follow ends


def _matches(obj: dict[str, Any], wanted: dict[str, str]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def _handler(fake: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            pass

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str) -> None:
            if fake.closing:  # the server went away: drop the kept-alive connection unanswered
                self.close_connection = True
                return
            url = urlsplit(self.path)
            with fake.cond:
                fake.requests.append(f"{method} {self.path}")
                fake.cond.notify_all()
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            try:
                if url.path.endswith("/log") and method == "GET":
                    parts = [p for p in url.path.split("/") if p]
                    self._log(parts[3], parts[5], query)
                    return
                status, reply = fake.handle(method, url.path, query, body)
            except ApiError as error:
                self._reply(error.body["code"], error.body)
                return
            self._reply(status, reply)

        def _log(self, ns: str, pod: str, query: dict[str, str]) -> None:
            chunks = fake.log_chunks(ns, pod, query)
            next(chunks)  # raises ApiError before any header is sent
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for chunk in chunks:
                    if chunk:
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._serve("PUT")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

    return Handler
