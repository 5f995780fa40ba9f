"""The executor's data: how to reach a host, what to start, what came back; and LogStream."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "CommandResult",
    "HostTarget",
    "LaunchSpec",
    "Launched",
    "LogStream",
    "ProcessInfo",
    "StopResult",
]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})


@dataclass(frozen=True)
class HostTarget:
    """How to reach one host."""

    name: str
    address: str
    ssh_user: str | None = None  # None: ~/.ssh/config, else the local user
    ssh_port: int | None = None  # None: ~/.ssh/config, else 22
    ssh_key: str | None = None  # given: only this key is tried (like IdentitiesOnly)
    python: str | None = None  # None: tfplan's own interpreter locally, "python3" over SSH
    accept_new_host_keys: bool = False  # False: unknown host keys are refused (RejectPolicy)
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    kind: str = "auto"  # auto | local | ssh; auto = local iff loopback address and no ssh_port

    def resolved_kind(self) -> str:
        """``local`` or ``ssh`` (or an unknown kind, which the registry reports)."""
        if self.kind != "auto":
            return self.kind
        loopback = self.address in LOOPBACK_NAMES or self.address.startswith("127.")
        return "local" if loopback and self.ssh_port is None else "ssh"


@dataclass(frozen=True)
class LaunchSpec:
    """One process to start. ``workdir`` is the task's own folder (it holds ``exit_code``)."""

    name: str
    command: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    log_path: str


@dataclass(frozen=True)
class Launched:
    pid: int
    pgid: int
    started_at: float  # unix time


@dataclass(frozen=True)
class ProcessInfo:
    """One task as ``ps`` sees it. cpu/rss are summed over the task's process group."""

    pid: int
    alive: bool
    state: str  # ps STAT of the group leader, "zombie" or "missing"
    cpu_percent: float | None  # ps %CPU: CPU time / elapsed time since start
    rss_bytes: int | None
    exit_code: int | None  # known once the task ended by itself (or on SIGTERM)


@dataclass(frozen=True)
class StopResult:
    pid: int
    pgid: int
    outcome: str  # "none" (was not running) | "terminated" | "killed"
    elapsed_secs: float


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: bytes
    stderr: bytes

    def err_line(self) -> str:
        lines = self.stderr.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"exit status {self.returncode}"


class LogStream:
    """A thread delivering whole lines of a followed log to ``on_line``, in order.

    Ends by itself once the task is dead and the log fully read; :meth:`stop` ends it early.
    An exception raised by ``on_line`` ends the stream and is kept in :attr:`error`.
    """

    def __init__(
        self,
        name: str,
        read_chunk: Callable[[], bytes],
        end_input: Callable[[], None],
        force_close: Callable[[], None],
        on_line: Callable[[str], None],
    ) -> None:
        self._read_chunk = read_chunk
        self._end_input = end_input
        self._force_close = force_close
        self._on_line = on_line
        self.error: BaseException | None = None
        self.lines = 0
        self._thread = threading.Thread(target=self._pump, name=f"log:{name}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self._read_chunk()
                if not chunk:
                    break
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    self._deliver(raw)
            if buffer:  # the task ended without a final newline: its last line is whole now
                self._deliver(buffer)
        except BaseException as exc:  # noqa: BLE001 - kept for the caller, the thread must end
            self.error = exc
        finally:
            self._end_input()
            self._force_close()

    def _deliver(self, raw: bytes) -> None:
        self.lines += 1
        self._on_line(raw.decode(errors="replace").rstrip("\r"))

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the stream to end; True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 2.0) -> None:
        """End the stream now (the follower on the host is ended too) and wait for the thread."""
        self._end_input()
        if not self.join(timeout):
            self._force_close()
            self.join(timeout)
