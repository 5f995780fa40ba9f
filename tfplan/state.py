"""The state file: what tfplan started, where, and under which PID / process group.

Written atomically (temp file in the same folder, fsync, rename) and guarded by an exclusive
lock file held for the whole of an apply or destroy. ``serial`` grows by one on every write;
``lineage`` is fixed when the state is first created, so a plan made against one state can be
refused when applied against another (see :func:`check_plan_is_current`).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tfplan.errors import StaleStateError, StateLockedError
from tfplan.plan import HostSpec, Task

__all__ = [
    "STATE_FILE",
    "LOCK_FILE",
    "State",
    "StateStore",
    "TaskState",
    "check_plan_is_current",
]

STATE_FILE = "state.json"
LOCK_FILE = "state.lock"
STATE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class TaskState:
    """One task as tfplan started it."""

    name: str  # "worker/1"
    role: str
    index: int
    host: str
    address: str
    port: int | None
    pid: int
    pgid: int
    log_path: str
    workdir: str
    fingerprint: str
    started_at: float  # unix time
    status: str = "running"  # running | succeeded | failed | stopped | lost
    exit_code: int | None = None
    restarts: int = 0
    settings: dict[str, str] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)  # the plan's Task.to_dict() it started from

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskState:
        return cls(**data)

    @classmethod
    def from_task(
        cls, task: Task, pid: int, pgid: int, started_at: float, status: str = "running"
    ) -> TaskState:
        """The record of ``task`` once started as process ``pid`` in group ``pgid``."""
        return cls(
            name=task.name,
            role=task.role.value,
            index=task.index,
            host=task.host,
            address=task.address,
            port=task.port,
            pid=pid,
            pgid=pgid,
            log_path=task.log_path,
            workdir=task.workdir,
            fingerprint=task.fingerprint,
            started_at=started_at,
            status=status,
            settings=dict(task.settings),
            spec=task.to_dict(),
        )


@dataclass(frozen=True)
class State:
    lineage: str
    serial: int
    experiment_id: str
    cluster_name: str
    output_dir: str
    tasks: tuple[TaskState, ...]
    hosts: tuple[HostSpec, ...] = ()  # how to reach the hosts the tasks run on
    lost: tuple[TaskState, ...] = ()  # tasks left behind on hosts that became unreachable
    config: dict[str, Any] = field(default_factory=dict)  # the plan's source_config
    supervisor_pid: int | None = None  # the tfplan process supervising, when attached
    version: int = STATE_FORMAT_VERSION

    @classmethod
    def empty(cls, lineage: str | None = None) -> State:
        return cls(
            lineage=lineage or str(uuid.uuid4()),
            serial=0,
            experiment_id="",
            cluster_name="",
            output_dir="",
            tasks=(),
        )

    def task(self, name: str) -> TaskState | None:
        for task in self.tasks:
            if task.name == name:
                return task
        return None

    def with_task(self, task: TaskState) -> State:
        """This state with ``task`` added, or replacing the task of the same name."""
        others = tuple(t for t in self.tasks if t.name != task.name)
        return replace(self, tasks=(*others, task))

    def without_task(self, name: str) -> State:
        return replace(self, tasks=tuple(t for t in self.tasks if t.name != name))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tasks"] = [asdict(t) for t in self.tasks]
        data["hosts"] = [asdict(h) for h in self.hosts]
        data["lost"] = [asdict(t) for t in self.lost]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> State:
        return cls(
            lineage=data["lineage"],
            serial=int(data["serial"]),
            experiment_id=data["experiment_id"],
            cluster_name=data["cluster_name"],
            output_dir=data["output_dir"],
            tasks=tuple(TaskState.from_dict(t) for t in data["tasks"]),
            hosts=tuple(HostSpec(**h) for h in data.get("hosts", [])),
            lost=tuple(TaskState.from_dict(t) for t in data.get("lost", [])),
            config=dict(data.get("config", {})),
            supervisor_pid=data.get("supervisor_pid"),
            version=int(data.get("version", STATE_FORMAT_VERSION)),
        )


def check_plan_is_current(plan_lineage: str | None, plan_serial: int, state: State | None) -> None:
    """Refuse a saved plan when the state moved on since it was made (Terraform's stale plan).

    Raises:
        StaleStateError: the state's lineage or serial differs from the plan's.
    """
    current_serial = state.serial if state is not None else 0
    current_lineage = state.lineage if state is not None else None
    if plan_lineage is not None and current_lineage is not None and plan_lineage != current_lineage:
        raise StaleStateError(
            f"the saved plan was made for state lineage {plan_lineage}, but the workspace holds "
            f"lineage {current_lineage}: run `tfplan plan` again"
        )
    if plan_lineage is None and current_lineage is not None and current_serial > 0:
        raise StaleStateError(
            "the saved plan is stale: it was made before any state existed, but tasks have been applied "
            "since: run `tfplan plan` again"
        )
    if plan_serial != current_serial:
        raise StaleStateError(
            f"the saved plan is stale: it was made at state serial {plan_serial}, the state is now "
            f"at serial {current_serial}: run `tfplan plan` again"
        )


class StateStore:
    """The state file of one workspace folder."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = Path(workspace)
        self.path = self.workspace / STATE_FILE
        self.lock_path = self.workspace / LOCK_FILE

    def load(self) -> State | None:
        """The current state, or None when nothing was ever applied here."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        return State.from_dict(json.loads(text))

    def write(self, state: State) -> State:
        """Write ``state`` atomically with the serial bumped by one; return what was written."""
        written = replace(state, serial=state.serial + 1)
        self.workspace.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".state.", dir=self.workspace)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(written.to_dict(), handle, indent=2, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return written

    @contextmanager
    def lock(self, what: str = "apply") -> Iterator[None]:
        """Hold the workspace lock; a second holder is refused at once, not queued.

        Raises:
            StateLockedError: another tfplan process holds the lock.
        """
        self.workspace.mkdir(parents=True, exist_ok=True)
        handle = open(self.lock_path, "a+")  # noqa: SIM115 - held for the context's lifetime
        try:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another tfplan process"
                raise StateLockedError(
                    f"the workspace {self.workspace} is locked by {holder}: wait for it to finish, "
                    f"or stop it (Ctrl-C) before running {what}"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"tfplan {what} (pid {os.getpid()})")
            handle.flush()
            yield
        finally:
            handle.close()
