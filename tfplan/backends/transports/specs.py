"""The process backend's data: how to reach a host, what to start there, what came back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import ip_address

__all__ = [
    "is_loopback",
    "CommandResult",
    "HostTarget",
    "LaunchSpec",
    "Launched",
    "ProcessInfo",
    "READOPTED",
    "StopResult",
    "StreamPipe",
]

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def is_loopback(address: str) -> bool:
    """Whether ``address`` is this machine's loopback (localhost, 127.0.0.0/8, ::1)."""
    if address in LOOPBACK_NAMES:
        return True
    try:
        return ip_address(address).is_loopback
    except ValueError:
        return False


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
        return "local" if is_loopback(self.address) and self.ssh_port is None else "ssh"


@dataclass(frozen=True)
class LaunchSpec:
    """One process to start. ``workdir`` is the task's own folder (it holds ``exit_code``).

    ``exit_file``: where the wrapper records the exit status, when not ``<workdir>/exit_code``
    (a warm standby shares its task's workdir but must not share its exit record).

    ``memory_limit``: bytes; the task's processes run in the memory cgroup ``cgroup`` (a plain
    name, :func:`~.cgroups.cgroup_name`) of that limit, entered before the program starts.
    """

    name: str
    command: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    log_path: str
    exit_file: str | None = None
    memory_limit: int | None = None
    cgroup: str = ""


@dataclass(frozen=True)
class Launched:
    pid: int
    pgid: int
    started_at: float  # unix time


# ProcessInfo.state of a task whose wrapper is gone while its program runs on, re-adopted
READOPTED = "re-adopted"


@dataclass(frozen=True)
class ProcessInfo:
    """One task as ``ps`` sees it. cpu/rss are summed over the task's process group."""

    pid: int
    alive: bool
    state: str  # ps STAT of the group leader, "zombie" or "missing"
    cpu_percent: float | None  # ps %CPU: CPU time / elapsed time since start
    rss_bytes: int | None
    exit_code: int | None  # known once the task ended by itself (or on SIGTERM)
    # live processes of the task's group: > 0 with a dead leader means the wrapper died and
    # the program (or a child of it) runs on, orphaned; a stop still reaches it by group
    left: int = 0


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


@dataclass(frozen=True)
class StreamPipe:
    """A long-running script on a host: read its output, write to its input."""

    read: Callable[[], bytes]  # a chunk of stdout; b"" at the end
    write: Callable[[bytes], None]  # to its stdin (raises OSError once it is gone)
    end_input: Callable[[], None]  # close its stdin: the script sees its input end
    force_close: Callable[[], None]  # end it now (and release what it holds)
