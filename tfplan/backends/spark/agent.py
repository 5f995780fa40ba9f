"""The tfplan agent inside a Spark executor: it runs tfplan's shell scripts on the executor's host.

Stdlib only: Spark ships this file to the executors (``spark-submit --py-files``); an executor
needs no tfplan. The Spark backend's driver application (:mod:`.driver_app`) runs one long Spark
task per executor, and that task is :func:`serve`:

1. it becomes a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so every process it
   starts stays its descendant even after detaching (``setsid``, as tfplan's task starts do);
2. it forks a *guard* in a session of its own that notes the agent's descendants four times a
   second and, once the agent is gone (Spark cancelled its task, the executor died, a SIGKILL),
   kills every one of them by process group, and every process that carries the agent's mark
   in its environment (``TFPLAN_SPARK_AGENT``, inherited by all the agent starts: a task
   started since the guard's last look): no task outlives the agent that can control it;
3. it listens on a TCP port and registers ``{place, attempt, address, port, python, pid,
   hostname, gpus}`` with the driver's registry (the address is the one it reaches the driver from);
4. it serves requests until it is killed.

Protocol (one TCP connection per request, like an SSH channel): the client sends one JSON line
``{"token", "op", ...}``; a wrong token is answered ``{"error"}`` and the connection closed.

- ``run``: ``{"args", "stdin": N, "timeout"}`` then N bytes: ``/bin/sh ARGS`` runs with them
  as its input (``-c SCRIPT``, or ``-s`` with a long script as its input, as the local
  transport runs them); the answer is ``{"rc", "out": N1, "err": N2}`` then the N1 + N2 bytes.
- ``stream``: ``{"script"}``: the script runs with its stdin and stdout on the connection
  (bytes both ways, as an SSH channel: the client's half-close ends the script's input; the
  script's end closes the connection; the client's close ends the script's process group).
- ``ping``: answered ``{"pid", "python", "hostname", "address"}``.
"""

from __future__ import annotations

import ctypes
import hmac
import json
import os
import secrets
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from typing import Any, NamedTuple

__all__ = [
    "GUARD_TICK_SECS",
    "ProcStat",
    "descendants",
    "proc_stat",
    "processes",
    "read_exact",
    "read_line",
    "serve",
]

GUARD_TICK_SECS = 0.25
MARK_ENV = "TFPLAN_SPARK_AGENT"  # in the environment of everything an agent starts
PR_SET_CHILD_SUBREAPER = 36
RUN_TIMEOUT_SECS = 600.0


def read_line(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("the other end closed the connection")
        data += chunk
        if len(data) > limit:
            raise ConnectionError("request header too long")
    return bytes(data)


def read_exact(sock: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(min(65536, count - len(data)))
        if not chunk:
            raise ConnectionError("the other end closed the connection")
        data += chunk
    return bytes(data)


class ProcStat(NamedTuple):
    state: str  # R, S, Z, ...
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: tells a reused PID apart


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s state, parent, group and start time from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return ProcStat(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))


def processes() -> dict[int, ProcStat]:
    """Every process this one can see."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := proc_stat(int(name))) is not None:
            found[int(name)] = stat
    return found


def descendants(root: int, stats: dict[int, ProcStat] | None = None) -> dict[int, tuple[int, int]]:
    """Every live descendant of ``root`` (among ``stats``, default every process now):
    pid -> (pgid, start time)."""
    children: dict[int, list[int]] = {}
    stats = processes() if stats is None else stats
    for pid, stat in stats.items():
        children.setdefault(stat.ppid, []).append(pid)
    found: dict[int, tuple[int, int]] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found[pid] = (stats[pid].pgid, stats[pid].start)
        todo.extend(children.get(pid, []))
    return found


def marked(mark: str, since: int = 0) -> dict[int, tuple[int, int]]:
    """Every live process started at or after ``since`` (clock ticks since boot, as /proc
    says) whose environment carries ``MARK_ENV=mark``: what an agent started (its scripts,
    their detached tasks, a warm seed and what it forked): pid -> (pgid, start)."""
    needle = f"{MARK_ENV}={mark}".encode() + b"\0"
    found = {}
    for pid, stat in processes().items():
        if stat.state == "Z" or stat.start < since:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if environ.startswith(needle) or b"\0" + needle in environ:
            found[pid] = (stat.pgid, stat.start)
    return found


def _guard(agent: int, mark: str) -> None:
    """In the guard process: follow the agent's descendants; once the agent is gone, kill
    every one still alive (by process group, then by PID), and every process carrying the
    agent's mark (one started between the last look and the agent's end: a look at every
    process takes a while on a busy host), then exit. Never returns."""
    me = os.getpid()
    seen: dict[int, tuple[int, int]] = {}
    horizon = 0  # every process started before this was looked at
    while proc_stat(agent) is not None and os.getppid() == agent:
        stats = processes()
        now = descendants(agent, stats)
        horizon = max((s.start for s in stats.values()), default=horizon)
        now.pop(me, None)
        seen = {p: v for p, v in seen.items() if proc_stat(p) is not None}
        seen.update(now)
        time.sleep(GUARD_TICK_SECS)
    seen.update(marked(mark, since=horizon))  # only what started since: a quick last look
    seen.pop(me, None)
    for sig in (signal.SIGKILL,):
        for pid, (pgid, start) in seen.items():
            stat = proc_stat(pid)
            if stat is None or stat.start != start:
                continue  # gone, or its PID was reused
            for target in (-pgid, pid):
                try:
                    os.kill(target, sig)
                except (ProcessLookupError, PermissionError):
                    pass
    os._exit(0)


def _start_guard(mark: str) -> None:
    agent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            _guard(agent, mark)
        finally:
            os._exit(0)


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class _Reaper:
    """Reaps the orphans the subreaper inherits (a detached task that ended), never the
    scripts a request waits for (their ``subprocess`` waits for them)."""

    def __init__(self) -> None:
        self.managed: set[int] = set()
        self.lock = threading.Lock()

    def loop(self) -> None:
        me = os.getpid()
        while True:
            time.sleep(1.0)
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                pid = int(name)
                stat = proc_stat(pid)
                if stat is None or stat.ppid != me:
                    continue
                with self.lock:
                    if pid in self.managed:
                        continue
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        try:
            header = json.loads(read_line(sock))
        except (ConnectionError, ValueError, OSError):
            return
        if not hmac.compare_digest(str(header.get("token", "")), self.server.token):
            self._answer({"error": "wrong token"})
            return
        op = header.get("op")
        try:
            if op == "run":
                self._run(header)
            elif op == "stream":
                self._stream(header)
            elif op == "ping":
                self._answer(self.server.info)
            else:
                self._answer({"error": f"unknown op {op!r}"})
        except (ConnectionError, OSError):
            pass

    def _answer(self, header: dict[str, Any], payload: bytes = b"") -> None:
        self.request.sendall(json.dumps(header).encode() + b"\n" + payload)

    def _popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self.server.reaper.lock:
            proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
            self.server.reaper.managed.add(proc.pid)
        return proc

    def _forget(self, proc: subprocess.Popen[bytes]) -> None:
        with self.server.reaper.lock:
            self.server.reaper.managed.discard(proc.pid)

    def _run(self, header: dict[str, Any]) -> None:
        data = read_exact(self.request, int(header.get("stdin", 0)))
        argv = ["/bin/sh", *[str(word) for word in header["args"]]]  # -c SCRIPT, or -s
        timeout = float(header.get("timeout", RUN_TIMEOUT_SECS))
        proc = self._popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            out, err = proc.communicate(data, timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
            rc, err = 124, err + f"\nagent: timed out after {timeout:.0f}s\n".encode()
        finally:
            self._forget(proc)
        self._answer({"rc": rc, "out": len(out), "err": len(err)}, out + err)

    def _stream(self, header: dict[str, Any]) -> None:
        sock: socket.socket = self.request
        proc = self._popen(
            ["/bin/sh", "-c", str(header["script"])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        def feed() -> None:
            try:
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    stdin.write(chunk)
                    stdin.flush()
            except OSError:
                _kill_group(proc.pid)  # the client is gone
            finally:
                try:
                    stdin.close()
                except OSError:
                    pass

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            while True:
                chunk = stdout.read1(65536)  # type: ignore[attr-defined]
                if not chunk:
                    break
                sock.sendall(chunk)
        except OSError:
            _kill_group(proc.pid)  # the client closed: end the script, as local force_close
        finally:
            proc.wait()
            self._forget(proc)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, token: str, reaper: _Reaper) -> None:
        super().__init__(("0.0.0.0", 0), _Handler)  # noqa: S104 - every executor address
        self.token = token
        self.reaper = reaper
        self.info: dict[str, Any] = {}


def _register(registry: tuple[str, int], record: dict[str, Any]) -> str:
    """Tell the driver where this agent listens; returns the address it reached it from."""
    deadline = time.monotonic() + 60.0
    while True:
        try:
            with socket.create_connection(registry, timeout=10.0) as sock:
                address = str(sock.getsockname()[0])
                record = {**record, "address": record.get("address") or address}
                sock.sendall(json.dumps(record).encode() + b"\n")
                sock.recv(16)
                return address
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def serve(
    token: str,
    registry: tuple[str, int],
    place: str,
    attempt: int,
    gpus: list[str] | None = None,
) -> None:
    """The agent's life inside its Spark task (see the module docstring): the agent of
    ``place`` (``executor-0``), on an executor Spark gave ``gpus`` (their addresses). Never
    returns."""
    _become_subreaper()
    # everything the agent starts inherits the mark (the guard's last sweep finds it by it)
    mark = f"{os.getpid()}-{secrets.token_hex(8)}"
    os.environ[MARK_ENV] = mark
    _start_guard(mark)
    reaper = _Reaper()
    threading.Thread(target=reaper.loop, name="reaper", daemon=True).start()
    server = _Server(token, reaper)
    port = int(server.server_address[1])
    record: dict[str, Any] = {
        "place": place,
        "attempt": attempt,
        "gpus": list(gpus or []),
        "port": port,
        "pid": os.getpid(),
        "python": sys.executable,
        "hostname": socket.gethostname(),
        "address": os.environ.get("SPARK_LOCAL_IP", ""),
    }
    address = _register(registry, record)
    server.info = {**record, "address": record["address"] or address}
    server.serve_forever()
