"""The transport base class: how the process backend does things on one host.

:class:`Transport` has public template methods (checks, timing, one-line errors naming the host)
that wrap a few private hooks. Everything except starting a process and moving bytes is the
same POSIX ``sh`` script on every host (:mod:`tfplan.backends.transports.scripts`), so the local and
the SSH transport share stop/status/streaming/file-transfer code and one conformance suite.
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
import tarfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path

from tfplan.backends.logstream import LogStream, ThreadLogStream
from tfplan.backends.transports import scripts as _scripts
from tfplan.backends.transports.hostwatch import HostWatch, WatchedStream, agent_command
from tfplan.backends.transports.preflight import (
    PREFLIGHT_SNIPPET,
    PreflightRequest,
    PreflightResult,
    parse_preflight_output,
    request_json,
)
from tfplan.backends.transports.specs import (
    CommandResult,
    HostTarget,
    Launched,
    LaunchSpec,
    ProcessInfo,
    StopResult,
    StreamPipe,
)
from tfplan.errors import BackendError

__all__ = ["STATUS_TIMEOUT_SECS", "WATCH_RETRY_SECS", "Transport"]


STATUS_TIMEOUT_SECS = 5.0
WATCH_RETRY_SECS = 30.0
_CGROUP_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # a folder's name, not a path


class Transport(ABC):
    """Does things on one host: preflight, copy files, start/stop/observe detached tasks.

    Public methods are templates that validate, time and word errors; subclasses implement the
    private hooks. Every failure is an :class:`~tfplan.errors.BackendError` whose one-line
    message names the host and says what to do. Transports are thread-safe: ``run_on_hosts``
    and log streams use one transport from several threads.
    """

    kind = "abstract"

    def __init__(self, target: HostTarget) -> None:
        self.target = target
        self._watch: HostWatch | None = None
        self._watch_lock = threading.Lock()
        self._watch_failed_at: float | None = None
        self.watch_problem: str | None = None  # why the host's watcher could not start

    # ---- hooks -------------------------------------------------------------------------
    @abstractmethod
    def _run(self, script: str, stdin: bytes | None, timeout: float) -> CommandResult:
        """Run a POSIX sh script on the host; never raises for a non-zero exit status."""

    @abstractmethod
    def _start(self, spec: LaunchSpec) -> Launched:
        """Start the wrapped command detached (see ``_scripts.TASK_WRAPPER``)."""

    @abstractmethod
    def _open_stream(self, script: str) -> StreamPipe:
        """Run a long script; return its pipe (read, write, close its stdin, force close)."""

    @abstractmethod
    def _close(self) -> None:
        """Release connections."""

    @property
    @abstractmethod
    def python(self) -> str:
        """The interpreter used for preflight on this host."""

    # ---- templates ---------------------------------------------------------------------
    def run_script(
        self, script: str, what: str, stdin: bytes | None = None, timeout: float = 60.0
    ) -> CommandResult:
        """Run a sh script on the host and insist on exit status 0.

        Args:
            script: POSIX sh code.
            what: what it does, for the error message ("write /x/run.yaml").
            stdin: bytes fed to its standard input.
            timeout: seconds before giving up.

        Returns:
            The exit status and raw output.

        Raises:
            BackendError: the host is unreachable, or the script failed.
        """
        result = self._run(script, stdin, timeout)
        if result.returncode != 0:
            raise BackendError(f"host {self.target.name}: {what} failed: {result.err_line()}")
        return result

    def preflight(self, req: PreflightRequest) -> PreflightResult:
        """Check the host can run tasks; failed checks (even unreachable) are data, not errors.

        Checks: reachable, the host's python runs, TensorFlow is there (with ``req.tf_version``),
        ``req.ports`` can be bound, ``req.writable_dirs`` are writable (created), and the marker
        in ``req.shared_dir`` (compare hosts with :func:`~.preflight.check_shared_dir`).

        Args:
            req: the checks, the same for every host.

        Returns:
            The host's result; ``result.ok`` is False with reasons in ``result.problems``.
        """
        began = time.monotonic()
        script = f"{_scripts.q(self.python)} -c {_scripts.q(PREFLIGHT_SNIPPET)} " + _scripts.q(
            request_json(req)
        )
        try:
            result = self._run(script, None, 120.0)
        except BackendError as exc:
            return PreflightResult(self.target.name, (str(exc),), elapsed_secs=_since(began))
        elapsed = _since(began)
        if result.returncode == 127:
            why = f"{self.python} not found: install Python 3 or set the host's python"
            return PreflightResult(self.target.name, (why,), elapsed_secs=elapsed)
        try:
            return parse_preflight_output(self.target.name, result.stdout.decode(), elapsed)
        except (ValueError, KeyError) as exc:
            why = f"preflight with {self.python} failed: {result.err_line()} ({exc})"
            return PreflightResult(self.target.name, (why,), elapsed_secs=elapsed)

    def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` atomically, creating parent folders.

        Raises:
            BackendError: the folder cannot be created or written.
        """
        self.run_script(_scripts.write_file_script(path), f"write {path}", stdin=data)

    def put_tree(self, local_dir: Path, remote_dir: str) -> None:
        """Make ``remote_dir`` hold exactly the files of the small folder ``local_dir``.

        Sent as one gzipped tar over stdin (of the bytecode in ``__pycache__``, only this
        interpreter version's) and swapped in with renames, so files deleted locally disappear
        remotely too.

        Raises:
            BackendError: ``remote_dir`` is not an absolute path below ``/``, or unpacking failed.
        """
        if not remote_dir.startswith("/") or remote_dir.rstrip("/").count("/") < 2:
            raise BackendError(
                f"host {self.target.name}: refusing to replace {remote_dir!r}: put_tree needs an "
                "absolute folder at least two levels deep"
            )
        self.run_script(
            _scripts.put_tree_script(remote_dir),
            f"copy {local_dir} to {remote_dir}",
            stdin=_tar_gz(Path(local_dir)),
        )

    def shared_marker(self, folder: str, token: str) -> str:
        """Create ``<folder>/.tfplan-shared-<token>`` unless it exists (then this host reads
        another's), with this host's name and a nonce; returns what the file holds.

        Raises:
            BackendError: the folder cannot be created, or the host is unreachable.
        """
        content = f"{self.target.name} {uuid.uuid4().hex}"
        result = self.run_script(
            _scripts.marker_script(folder, token, content), f"write a marker in {folder}"
        )
        return result.stdout.decode(errors="replace").strip()

    def get_tree(
        self, folder: str, skip: Sequence[str] = (), prune: Sequence[str] = (), max_kib: int = 1
    ) -> bytes | None:
        """The files under ``folder`` as a gzipped tar, or None when the folder does not exist.

        Args:
            skip: file name patterns (``find -name``) to leave out.
            prune: subfolders (relative) to leave out whole.
            max_kib: leave out files of this size or more.

        Raises:
            BackendError: the host is unreachable, or the folder could not be read.
        """
        script = _scripts.pack_tree_script(folder, skip, prune, max_kib)
        result = self._run(script, None, 300.0)
        if result.returncode == 3:
            return None
        if result.returncode != 0:
            raise BackendError(
                f"host {self.target.name}: read {folder} failed: {result.err_line()}"
            )
        return base64.b64decode(result.stdout)

    def read_file(self, path: str, offset: int = 0, max_bytes: int = 16 << 20) -> tuple[bytes, int]:
        """Read a file from byte ``offset``; return the bytes and the offset after them.

        Args:
            path: the file on the host.
            offset: where to start; negative counts from the end (``-4096``: the last 4 KiB).
            max_bytes: read at most this much (call again from the returned offset for more).

        Returns:
            (data, offset of the byte after ``data``) - pass it back to read on.

        Raises:
            BackendError: the file does not exist or cannot be read.
        """
        return self._read(path, offset, max_bytes, missing_ok=False)

    def oom_kills(self, since: float) -> list[dict[str, object]]:
        """The processes the host's kernel killed for want of memory since ``since`` (unix
        time): ``pid``, ``name``, ``rss`` (bytes), ``at`` (unix time). Empty where the kernel's
        log cannot be read (not root and ``kernel.dmesg_restrict=1``).

        Raises:
            BackendError: the host could not be reached.
        """
        result = self.run_script(_scripts.oom_script(self.python, since), "read the kernel log")
        try:
            found = json.loads(result.stdout.decode(errors="replace") or "[]")
        except ValueError:
            return []
        return [f for f in found if isinstance(f, dict)]

    def read_tails(self, paths: Sequence[str], max_bytes: int) -> list[bytes]:
        """The last ``max_bytes`` of many files in one round trip (b"" for a missing one).

        Raises:
            BackendError: the host could not be reached.
        """
        if not paths:
            return []
        result = self.run_script(
            _scripts.tails_script(self.python, paths, max_bytes),
            f"read {len(paths)} log(s)",
            timeout=30.0,
        )
        try:
            return _scripts.parse_tails(result.stdout.decode(errors="replace"), len(paths))
        except ValueError as error:
            raise BackendError(f"host {self.target.name}: reading logs failed: {error}") from None

    def read_log(self, path: str, offset: int = 0, max_bytes: int = 16 << 20) -> tuple[bytes, int]:
        """Like :meth:`read_file`, but a log that does not exist yet reads as empty."""
        return self._read(path, offset, max_bytes, missing_ok=True)

    def _read(self, path: str, offset: int, max_bytes: int, missing_ok: bool) -> tuple[bytes, int]:
        result = self.run_script(
            _scripts.read_script(path, offset, max_bytes, missing_ok), f"read {path}"
        )
        first, _, encoded = result.stdout.partition(b"\n")
        data = base64.b64decode(encoded)
        start = int(first)
        return data, start + len(data)

    def start(self, spec: LaunchSpec) -> Launched:
        """Start ``spec.command`` detached, in its own session and process group.

        The environment is the host's plus ``spec.env``; cwd is ``spec.workdir`` (created);
        stdout and stderr go to ``spec.log_path`` (truncated), stdin is /dev/null. The command
        runs under a ``sh`` wrapper that records its exit status in ``<workdir>/exit_code``,
        so ``status`` knows it although tfplan is not the parent. Returns in well under a second;
        record the PID at once.

        Raises:
            BackendError: empty command, relative workdir, or the host could not start it.
        """
        if not spec.command:
            raise BackendError(f"host {self.target.name}: task {spec.name} has an empty command")
        if not spec.workdir.startswith("/") or not spec.log_path.startswith("/"):
            raise BackendError(
                f"host {self.target.name}: task {spec.name} needs an absolute workdir and log path"
            )
        try:
            _scripts.check_env_names(spec.env)
        except ValueError as error:
            raise BackendError(f"host {self.target.name}: task {spec.name}: {error}") from None
        if spec.memory_limit is not None and not _CGROUP_NAME.match(spec.cgroup):
            raise BackendError(
                f"host {self.target.name}: task {spec.name} has a memory limit but its cgroup "
                f"name {spec.cgroup!r} is not a plain name"
            )
        return self._start(spec)

    def _start_by_script(self, spec: LaunchSpec) -> Launched:
        """``_start`` for a host reached through scripts (SSH, a Spark executor's agent): the
        detached start script runs there and prints the wrapper's PID."""
        began = time.time()
        script = _scripts.remote_start_script(
            spec.command,
            spec.env,
            spec.workdir,
            spec.log_path,
            spec.exit_file,
            spec.memory_limit,
            spec.cgroup,
        )
        result = self.run_script(script, f"start task {spec.name} in {spec.workdir}", timeout=30)
        last = result.stdout.decode().strip().splitlines()[-1:] or [""]
        if not last[0].isdigit():
            raise BackendError(
                f"host {self.target.name}: starting task {spec.name} printed no PID: "
                f"{result.stdout.decode(errors='replace')[-200:]!r}"
            )
        pid = int(last[0])
        return Launched(pid=pid, pgid=pid, started_at=began)

    def move(self, source: str, target: str) -> None:
        """Rename a file on the host (nothing happens when ``source`` does not exist).

        Raises:
            BackendError: the rename failed.
        """
        self.run_script(_scripts.move_script(source, target), f"move {source} to {target}")

    def move_all(self, moves: Sequence[tuple[str, str]]) -> None:
        """Several renames on the host, in order, in one round trip (each as :meth:`move`).

        Raises:
            BackendError: a rename failed (the later ones were not made).
        """
        what = "; ".join(f"move {s} to {t}" for s, t in moves)
        self.run_script(_scripts.moves_script(moves), what)

    def signal(self, pgid: int, name: str) -> int:
        """Send signal ``name`` (``USR1``, ``TERM``, ...) to every process of group ``pgid``;
        returns how many live processes the group had.

        Raises:
            BackendError: ``pgid`` is not a real group, the signal is unknown, or the group has
                no live process.
        """
        if pgid <= 1:
            raise BackendError(f"host {self.target.name}: refusing to signal group {pgid}")
        try:
            script = _scripts.signal_script(pgid, name)
        except ValueError as error:
            raise BackendError(f"host {self.target.name}: {error}") from None
        result = self._run(script, None, STATUS_TIMEOUT_SECS)
        if result.returncode == 3:
            raise BackendError(
                f"host {self.target.name}: process group {pgid} has no live process to signal"
            )
        if result.returncode != 0:
            raise BackendError(
                f"host {self.target.name}: signal {name} to group {pgid} failed: "
                f"{result.err_line()}"
            )
        return int(result.stdout.decode().strip() or 0)

    def stop(self, pid: int, pgid: int, grace_secs: float = 10.0) -> StopResult:
        """SIGTERM the task's process group, SIGKILL it after ``grace_secs``, verify it is gone.

        Never matches by name: only the group ``pgid`` is signalled. Zombies count as gone.

        Raises:
            BackendError: ``pgid`` is not a real group (<= 1), or the group survived SIGKILL.
        """
        if pgid <= 1 or pid <= 1:
            raise BackendError(f"host {self.target.name}: refusing to signal pid {pid}/{pgid}")
        began = time.monotonic()
        result = self.run_script(
            _scripts.stop_script(pgid, grace_secs),
            f"stop process group {pgid}",
            timeout=grace_secs + 30.0,
        )
        outcome = result.stdout.decode().strip()
        if outcome not in ("none", "terminated", "killed"):
            raise BackendError(
                f"host {self.target.name}: process group {pgid} survived SIGKILL ({outcome}): "
                "it is probably stuck in the kernel (D state); check the host"
            )
        return StopResult(pid, pgid, outcome, _since(began))

    def stop_groups(
        self, groups: Sequence[tuple[int, int]], grace_secs: float = 10.0
    ) -> dict[int, StopResult | BackendError]:
        """:meth:`stop` for many tasks in one round trip: ``(pid, pgid)`` each; pgid -> its
        result, or the error of a group that survived SIGKILL.

        Raises:
            BackendError: a pgid is not a real group, or the host could not be reached.
        """
        if not groups:
            return {}
        if any(pgid <= 1 or pid <= 1 for pid, pgid in groups):
            raise BackendError(f"host {self.target.name}: refusing to signal {list(groups)}")
        began = time.monotonic()
        result = self.run_script(
            _scripts.stop_groups_script([pgid for _, pgid in groups], grace_secs),
            f"stop {len(groups)} process group(s)",
            timeout=grace_secs + 30.0,
        )
        elapsed = _since(began)
        outcomes = dict(
            line.split(" ", 1) for line in result.stdout.decode().splitlines() if " " in line
        )
        out: dict[int, StopResult | BackendError] = {}
        for pid, pgid in groups:
            outcome = outcomes.get(str(pgid), "missing")
            if outcome in ("none", "terminated", "killed"):
                out[pgid] = StopResult(pid, pgid, outcome, elapsed)
            else:
                out[pgid] = BackendError(
                    f"host {self.target.name}: process group {pgid} survived SIGKILL "
                    f"({outcome}): it is probably stuck in the kernel (D state); check the host"
                )
        return out

    def status(
        self,
        pids: Sequence[int],
        workdirs: Sequence[str | None] | None = None,
        exit_files: Sequence[str | None] | None = None,
    ) -> dict[int, ProcessInfo]:
        """Observe many tasks in one round trip.

        Args:
            pids: task PIDs (each the leader of its own group, as ``start`` made them).
            workdirs: the tasks' workdirs, parallel to ``pids``, to read their exit codes.
            exit_files: instead of ``workdirs``: each task's exit file (``LaunchSpec.exit_file``).

        Returns:
            pid -> info. A missing or zombie leader is dead; a task with an exit code is ended.
            A dead leader whose group still has live processes says so in ``left``.

        Raises:
            BackendError: the host is unreachable or ``ps`` failed.
        """
        pids = list(pids)
        if not pids:
            return {}
        if exit_files is not None:
            files = list(exit_files)
        elif workdirs is not None:
            files = [_scripts.exit_file(w) if w else None for w in workdirs]
        else:
            files = [None] * len(pids)
        heard = self.heard_status(pids, files)
        if heard is not None:
            return heard
        # Short: the supervisor polls this, and a host that went silent must not stall it.
        result = self.run_script(
            _scripts.status_script(pids, files), "read process status", timeout=STATUS_TIMEOUT_SECS
        )
        return _parse_status(pids, result.stdout.decode())

    def heard_status(
        self, pids: Sequence[int], exit_files: Sequence[str | None]
    ) -> dict[int, ProcessInfo] | None:
        """:meth:`status` from what the host's watcher reported, without asking the host; None
        when it cannot answer for every one of ``pids`` (see :meth:`HostWatch.status`)."""
        watch = self._watch
        if watch is None or not pids:
            return None
        return watch.status(pids, exit_files)

    def stream_log(
        self,
        path: str,
        pid: int,
        on_line: Callable[[str], None],
        exit_file: str | None = None,
        pgid: int | None = None,
        adopt: bool = False,
    ) -> LogStream | WatchedStream:
        """Follow a task's log from its start, line by line, until the task is dead.

        Every log of a host goes through the host's one watcher (:mod:`.hostwatch`), which
        also learns each task's end (and, given ``exit_file``, its exit code, so
        :meth:`status` can answer without asking the host). Where the watcher cannot start, a
        follower per task does the same.

        Args:
            path: the log file (may not exist yet).
            pid: the task; the stream ends once it is gone and the log fully delivered.
            on_line: called from the stream's thread with each whole line (no newline).
            exit_file: where the task's wrapper records its exit status.
            pgid: the task's process group (default: ``pid``, as :meth:`start` makes it).
            adopt: a program that outlives its wrapper (``pid``) is followed on, its log with
                it, until its whole group is gone (where the host's watcher runs).

        Returns:
            The running stream; ``.stop()`` ends it early, ``.join()`` waits for its end.
        """
        watch = self.host_watch()
        if watch is not None:
            return watch.follow(path, pid, pgid or pid, exit_file, on_line, adopt)
        pipe = self._open_stream(_scripts.stream_script(path, pid))
        return ThreadLogStream(
            f"{self.target.name}:{path}", pipe.read, pipe.end_input, pipe.force_close, on_line
        )

    def host_watch(self) -> HostWatch | None:
        """The host's watcher, started on first use (and again after it ended); None when it
        cannot start here (tried again after :data:`WATCH_RETRY_SECS`)."""
        with self._watch_lock:
            if self._watch is not None and not self._watch.closed:
                return self._watch
            failed = self._watch_failed_at
            if failed is not None and time.monotonic() - failed < WATCH_RETRY_SECS:
                return None
            try:
                command, source = agent_command(self.python)
                pipe = self._open_stream(command)
                self._watch = HostWatch(self.target.name, pipe, source)
            except (OSError, BackendError) as error:
                self._watch = None
                self._watch_failed_at = time.monotonic()
                self.watch_problem = str(error)
                return None
            self._watch_failed_at = None
            self.watch_problem = None
            return self._watch

    def close(self) -> None:
        """Release the connection and the watcher; running tasks are not affected."""
        with self._watch_lock:
            watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        self._close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _since(began: float) -> float:
    return time.monotonic() - began


_PYC_SUFFIX = f".{sys.implementation.cache_tag}.pyc"


def _tar_gz(local_dir: Path) -> bytes:
    if not local_dir.is_dir():
        raise BackendError(f"{local_dir} is not a folder: nothing to copy")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        # bytecode of this interpreter's version only (what a task here would write itself,
        # scripts/setup.sh compiles it): valid on the host while the source's time and size are
        # those it was compiled from (the tar keeps the times), recompiled there otherwise
        parts = Path(info.name).parts
        if "__pycache__" in parts or info.name.endswith(".pyc"):
            return info if info.isdir() or info.name.endswith(_PYC_SUFFIX) else None
        return info

    buffer = io.BytesIO()
    # gzip's fastest level: the recipes with their bytecode (about 0.6 MB) pack in 0.04 s of
    # CPU instead of the default level's 0.33 s, for 15 % more bytes; every apply sends them
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for child in sorted(local_dir.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return buffer.getvalue()


def _live(stat: str) -> bool:
    """A process that still holds what it holds: not a zombie, or a zombie leader whose other
    threads still run (``Zl``; its files close with its last thread)."""
    return not stat.startswith("Z") or "l" in stat


def _parse_status(pids: list[int], text: str) -> dict[int, ProcessInfo]:
    rows: dict[int, tuple[int, str, float, int]] = {}
    groups: dict[int, list[tuple[str, float, int]]] = {}
    exits: dict[int, int | None] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == "P":
            pid, pgid, stat, pcpu, rss = int(parts[1]), int(parts[2]), parts[3], parts[4], parts[5]
            rows[pid] = (pgid, stat, float(pcpu), int(rss) * 1024)
            groups.setdefault(pgid, []).append((stat, float(pcpu), int(rss) * 1024))
        elif parts and parts[0] == "E" and len(parts) >= 2:
            code = parts[2] if len(parts) > 2 else ""
            exits[int(parts[1])] = int(code) if code.lstrip("-").isdigit() else None
    infos: dict[int, ProcessInfo] = {}
    for pid in pids:
        exit_code = exits.get(pid)
        row = rows.get(pid)
        live = [p for p in groups.get(pid, []) if _live(p[0])]
        # A recycled PID would not lead its own group: treat it as our task gone missing.
        if row is None or row[0] != pid:
            left = len(live)
            infos[pid] = ProcessInfo(pid, False, "missing", None, None, exit_code, left)
            continue
        if row[1].startswith("Z"):
            infos[pid] = ProcessInfo(pid, False, "zombie", None, None, exit_code, len(live))
            continue
        infos[pid] = ProcessInfo(
            pid=pid,
            alive=exit_code is None,
            state=row[1],
            cpu_percent=sum(p[1] for p in live),
            rss_bytes=sum(p[2] for p in live),
            exit_code=exit_code,
            left=len(live),
        )
    return infos
