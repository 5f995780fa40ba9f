"""Launched tasks, one round trip per host for all of its tasks and every host at once: their
state (``describe``), stopping them (``cancel``), a file written to each (``tell``), which of
them listen on their ports, and their logs' tails."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from tfplan.backends.api import CancelResult, TaskInfo, TaskPhase
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.process.shell import run_on_host
from tfplan.backends.transports.pool import TransportPool
from tfplan.backends.transports.scripts import LISTENING_SCRIPT, handle_exit_file, listening_ports
from tfplan.backends.transports.specs import READOPTED, ProcessInfo, StopResult
from tfplan.errors import BackendError
from tfplan.planning.state import TaskRecord

__all__ = ["by_host", "cancel", "describe", "listening", "pid", "read_log_tails", "tell"]


def by_host(tasks: Sequence[TaskRecord]) -> dict[str, list[TaskRecord]]:
    """The tasks of each host, in order: what one round trip per host works on."""
    found: dict[str, list[TaskRecord]] = {}
    for task in tasks:
        found.setdefault(task.host, []).append(task)
    return found


def pid(task: TaskRecord) -> int:
    return int(task.handle["pid"])


def describe(pool: TransportPool, tasks: Sequence[TaskRecord]) -> dict[str, TaskInfo]:
    """What each host's watcher reported where it can answer; otherwise one ``ps`` per
    host for all of its tasks, every host at once."""
    grouped = by_host(tasks)

    def ask(mine: list[TaskRecord]) -> dict[int, ProcessInfo]:
        return pool[mine[0].host].status(
            [pid(t) for t in mine],
            exit_files=[handle_exit_file(t.handle, t.workdir) for t in mine],
        )

    out: dict[str, TaskInfo] = {}
    # what the hosts' watchers reported needs no round trip (nor a thread)
    for host in list(grouped):
        mine = grouped[host]
        heard = pool[host].heard_status(
            [pid(t) for t in mine], [handle_exit_file(t.handle, t.workdir) for t in mine]
        )
        if heard is not None:
            for task in grouped.pop(host):
                out[task.name] = _info(heard.get(pid(task)), host, adopts(task))
    for host, result in run_on_hosts(grouped, ask).items():
        for task in grouped[host]:
            if isinstance(result, Exception):
                out[task.name] = TaskInfo(TaskPhase.UNREACHABLE, host=host, error=str(result))
            else:
                out[task.name] = _info(result.get(pid(task)), host, adopts(task))
    return out


def adopts(task: TaskRecord) -> bool:
    """Whether the task's program can outlive its tracked process and be re-adopted: a cold
    start's (a wrapper, then the program); a forked task's tracked process is its program."""
    return not task.handle.get("forked")


def _info(info: ProcessInfo | None, host: str, adopt: bool = False) -> TaskInfo:
    if info is None:
        return TaskInfo(TaskPhase.FAILED, host=host, detail="missing")
    if not info.alive and info.exit_code is None and info.left:
        if adopt:
            # The wrapper died first and its program runs on: it is followed on, not
            # replaced; its exit status will be unknown (the wrapper recorded it).
            return TaskInfo(
                TaskPhase.RUNNING,
                host=host,
                detail=f"{READOPTED}: {info.left} process(es) of its group",
                readopted=True,
            )
        # A forked task's program died and left processes of its group: stopped by group
        # before the task starts again.
        return TaskInfo(
            TaskPhase.FAILED,
            host=host,
            detail=f"program gone, {info.left} process(es) of its group still running",
        )
    if info.alive:
        return TaskInfo(
            TaskPhase.RUNNING,
            host=host,
            detail=info.state,
            cpu_percent=info.cpu_percent,
            rss_bytes=info.rss_bytes,
            readopted=info.state.startswith(READOPTED),
        )
    phase = TaskPhase.SUCCEEDED if info.exit_code == 0 else TaskPhase.FAILED
    return TaskInfo(phase, exit_code=info.exit_code, host=host, detail=info.state)


def cancel(
    pool: TransportPool, tasks: Sequence[TaskRecord], grace_secs: float
) -> dict[str, CancelResult | Exception]:
    """One script per host stops all of that host's tasks; every host at once."""
    grouped = by_host(tasks)

    def stop(mine: list[TaskRecord]) -> dict[int, object]:
        groups = [(pid(t), int(t.handle["pgid"])) for t in mine]
        return dict(pool[mine[0].host].stop_groups(groups, grace_secs))

    out: dict[str, CancelResult | Exception] = {}
    for host, result in run_on_hosts(grouped, stop).items():
        for task in grouped[host]:
            got = result if isinstance(result, Exception) else result[int(task.handle["pgid"])]
            if isinstance(got, Exception):
                out[task.name] = got
            else:
                assert isinstance(got, StopResult)
                out[task.name] = CancelResult(got.outcome, got.elapsed_secs)
    return out


def tell(pool: TransportPool, tasks: Sequence[TaskRecord], name: str, data: bytes) -> None:
    """One write per task, every host at once.

    Raises:
        BackendError: a host could not be written (the first such).
    """
    grouped = by_host(tasks)

    def write(mine: list[TaskRecord]) -> None:
        for task in mine:
            pool[task.host].write_file(posixpath.join(task.workdir, name), data)

    for host, result in run_on_hosts(grouped, write).items():
        if isinstance(result, BaseException):
            raise BackendError(f"could not write {name} on {host}: {result}")


def listening(pool: TransportPool, tasks: Sequence[TaskRecord]) -> set[str]:
    """The kernel's table of listening TCP sockets, read once per host, every host at
    once; a host that cannot be read counts as unknown (its tasks are left out)."""
    grouped = by_host([t for t in tasks if t.port is not None])

    def look(mine: list[TaskRecord]) -> set[int]:
        return listening_ports(run_on_host(pool, mine[0].host, LISTENING_SCRIPT, "listening"))

    seen: set[str] = set()
    for host, result in run_on_hosts(grouped, look).items():
        if not isinstance(result, BaseException):
            seen.update(t.name for t in grouped[host] if t.port in result)
    return seen


def read_log_tails(
    pool: TransportPool, tasks: Sequence[TaskRecord], max_bytes: int
) -> dict[str, bytes | Exception]:
    """One round trip per host for all of its tasks' logs, every host at once."""
    grouped = by_host(tasks)

    def read(mine: list[TaskRecord]) -> list[bytes]:
        return pool[mine[0].host].read_tails([t.log_path for t in mine], max_bytes)

    out: dict[str, bytes | Exception] = {}
    for host, result in run_on_hosts(grouped, read).items():
        for i, task in enumerate(grouped[host]):
            out[task.name] = result if isinstance(result, Exception) else result[i]
    return out
