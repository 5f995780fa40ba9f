"""The local transport: tasks on this machine, started with ``subprocess``; no SSH involved."""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import threading
import time

from tfplan.backends.transports import scripts as _scripts
from tfplan.backends.transports.base import Transport
from tfplan.backends.transports.specs import CommandResult, Launched, LaunchSpec, StreamPipe
from tfplan.errors import BackendError

__all__ = ["REAPER", "LocalTransport", "Reaper"]


class Reaper:
    """Waits for the processes this one started, all of them on one thread: each child's
    ``pidfd`` becomes readable when it exits, then it is reaped. Without pidfds (Linux < 5.3,
    Python < 3.9) a thread per child waits, as before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # pidfd -> child
        self._wake_read, self._wake_write = os.pipe()
        self._thread: threading.Thread | None = None

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            threading.Thread(target=proc.wait, name=f"reap:{proc.pid}", daemon=True).start()
            return
        with self._lock:
            self._children[pidfd] = proc
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)
                self._thread.start()
        os.write(self._wake_write, b"+")

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._children)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        registered: set[int] = set()
        while True:
            with self._lock:
                for pidfd in self._children.keys() - registered:
                    poller.register(pidfd, select.POLLIN)
                    registered.add(pidfd)
            for fd, _ in poller.poll():
                if fd == self._wake_read:
                    os.read(self._wake_read, 4096)
                    continue
                with self._lock:
                    proc = self._children.pop(fd)
                poller.unregister(fd)
                registered.discard(fd)
                proc.wait()
                os.close(fd)


REAPER = Reaper()


class LocalTransport(Transport):
    """Runs the shared sh scripts with ``sh -c`` and starts tasks with ``start_new_session``.

    tfplan is the parent of the tasks it starts here, so one reaper thread waits for all of
    them (:class:`Reaper`): otherwise an ended task would stay a zombie for as long as tfplan
    runs.
    """

    kind = "local"

    @property
    def python(self) -> str:
        return self.target.python or sys.executable

    def _run(self, script: str, stdin: bytes | None, timeout: float) -> CommandResult:
        try:
            argv, stdin = _scripts.shell_invocation(script, stdin)
            done = subprocess.run(
                ["/bin/sh", *argv[1:]],
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BackendError(
                f"host {self.target.name}: a command timed out after {timeout:.0f}s: "
                "the machine may be overloaded"
            ) from exc
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def _start(self, spec: LaunchSpec) -> Launched:
        try:
            os.makedirs(spec.workdir, exist_ok=True)
            os.makedirs(os.path.dirname(spec.log_path) or "/", exist_ok=True)
            exit_file = spec.exit_file or _scripts.exit_file(spec.workdir)
            if os.path.lexists(exit_file):
                os.remove(exit_file)
            env = {**os.environ, **spec.env, "TFPLAN_EXIT_FILE": exit_file}
            for name in ("TFPLAN_CGROUP", "TFPLAN_MEMORY_LIMIT"):  # a task's own, not tfplan's
                env.pop(name, None)
            env.update(_scripts.memory_env(spec.memory_limit, spec.cgroup))
            wrapper = _scripts.task_wrapper(spec.memory_limit)
            with open(spec.log_path, "wb") as log:
                began = time.time()
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", wrapper, "tfplan-task", *spec.command],
                    cwd=spec.workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            raise BackendError(
                f"host {self.target.name}: cannot start task {spec.name} in {spec.workdir}: "
                f"{exc.strerror or exc}"
            ) from exc
        REAPER.add(proc)
        return Launched(pid=proc.pid, pgid=proc.pid, started_at=began)

    def _open_stream(self, script: str) -> StreamPipe:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        assert isinstance(stdout, io.BufferedReader)

        def read_chunk() -> bytes:
            return stdout.read1(65536)

        def write(data: bytes) -> None:
            stdin.write(data)
            stdin.flush()

        def end_input() -> None:
            try:
                stdin.close()
            except OSError:
                pass

        def force_close() -> None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the follower's own group, by PID
                except ProcessLookupError:
                    pass
            proc.wait()

        return StreamPipe(read_chunk, write, end_input, force_close)

    def _close(self) -> None:
        pass
