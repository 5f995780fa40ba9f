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

Every change notifies a condition variable: tests wait for events (:meth:`FakeKube.wait`), not
for time to pass. What it does not do is everything else a cluster does (scheduling, DNS,
images, volumes, the real API's validation): the backend was not run against a real cluster.
"""

from __future__ import annotations

import json
import random
import string
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

KINDS = {"services": "Service", "configmaps": "ConfigMap", "jobs": "Job", "pods": "Pod"}
NODE = "node-1"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


class FakeKube:
    """The fake API server and its simulated controllers (see the module docstring)."""

    def __init__(
        self,
        namespaces: tuple[str, ...] = ("default",),
        claims: tuple[str, ...] = (),
        service_accounts: tuple[str, ...] = (),
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
            self.cond.notify_all()
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
        if labels.get("tfplan/reader") == "true":
            self._read(ns, pod)
        elif self.autostart:
            self._run(pod)

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
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            return 200, obj
        if name is not None and method == "PUT":
            if (kind, ns, name) not in self.objects:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            self.objects[(kind, ns, name)] = body
            self.cond.notify_all()
            return 200, body
        if name is not None and method == "DELETE":
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
