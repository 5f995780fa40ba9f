"""The state's data model: what tfplan started, where, and under which backend handle.

Plain data (the planner diffs against it, so it lives below the engine); the engine's
:mod:`tfplan.engine.store` writes it atomically, under a lock. ``serial`` grows by one on every
write; ``lineage`` is fixed when the state is first created, so a plan made against one state is
refused when applied against another (:func:`check_plan_is_current`).

Per task the state keeps O(1) data: the cluster spec is implied by the tasks and the bound
hosts, so TF_CONFIG is never stored per task.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from tfplan.errors import StaleStateError
from tfplan.planning.plan import BackendRef, HostSpec, Plan, Task, cluster_spec_of
from tfplan.planning.policy import JobPolicy

__all__ = [
    "STATE_FORMAT_VERSION",
    "Allocation",
    "State",
    "SupervisorRecord",
    "TaskRecord",
    "TaskStatus",
    "check_plan_is_current",
    "standby_name",
    "standby_task",
]

STATE_FORMAT_VERSION = 2


class TaskStatus(str, Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # stopped by tfplan (teardown, destroy, Ctrl-C)
    UNREACHABLE = "unreachable"  # its host did not answer for host_timeout_secs


@dataclass(frozen=True)
class TaskRecord:
    """One task as tfplan started it, and what it needs to start it again."""

    name: str  # "worker/1"
    role: str
    index: int
    planned_host: str  # the plan's host name (a Slurm node slot such as "node-1")
    host: str  # the host (or node) it runs on
    address: str | None  # where the other tasks reach it
    port: int | None
    handle: dict[str, Any]  # the backend's opaque handle (pid/pgid, Slurm step, pod, ...)
    workdir: str
    log_path: str
    command: tuple[str, ...]
    env: dict[str, str]  # TF_CONFIG excluded: derived from the cluster at each start
    devices: tuple[str, ...]
    is_chief: bool
    fingerprint: str
    config_digest: str  # the run config it read
    cluster_digest: str  # the cluster spec it was planned in
    started_at: float  # unix time
    status: TaskStatus = TaskStatus.RUNNING
    exit_code: int | None = None
    restarts: int = 0
    # ran with a port it never listened on, then ended by itself: it never joined the cluster
    # (a user's program that did not read TF_CONFIG; seen by the supervisor)
    never_listened: bool = False
    memory_limit: int | None = None  # the plan's (Task.memory_limit): its cgroup's limit

    @property
    def running(self) -> bool:
        return self.status is TaskStatus.RUNNING

    @classmethod
    def from_task(
        cls,
        task: Task,
        plan: Plan,
        handle: dict[str, Any],
        started_at: float,
        host: str,
        address: str | None,
        command: tuple[str, ...] | None = None,
    ) -> TaskRecord:
        """The record of the plan's ``task`` once started on ``host`` (where the backend bound
        it), reachable at ``address``, with ``command`` as it was filled in at start."""
        return cls(
            name=task.name,
            role=task.role.value,
            index=task.index,
            planned_host=task.host,
            host=host,
            address=address,
            port=task.port,
            handle=dict(handle),
            workdir=task.workdir,
            log_path=task.log_path,
            command=command or task.command,
            env=dict(task.env),
            devices=task.devices,
            is_chief=task.is_chief,
            fingerprint=task.fingerprint,
            config_digest=plan.config_digest,
            cluster_digest=plan.cluster_digest,
            started_at=started_at,
            memory_limit=task.memory_limit,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.memory_limit is None:
            del data["memory_limit"]  # written only when set, as in the plan
        data["status"] = self.status.value
        data["command"] = list(self.command)
        data["devices"] = list(self.devices)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskRecord:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        fields.update(
            status=TaskStatus(data.get("status", "running")),
            command=tuple(data["command"]),
            devices=tuple(data.get("devices", ())),
            handle=dict(data["handle"]),
            env=dict(data["env"]),
        )
        return cls(**fields)


STANDBY_SUFFIX = "~standby"


def standby_name(task: str) -> str:
    """The name of the warm standby of ``task`` (``ps/0~standby``), as the state records it."""
    return task + STANDBY_SUFFIX


def standby_task(name: str) -> str:
    """The task a standby named ``name`` stands for (``ps/0~standby`` -> ``ps/0``)."""
    return name.removesuffix(STANDBY_SUFFIX)


@dataclass(frozen=True)
class Allocation:
    """Resources a scheduler granted (a Slurm job), and the hosts the plan's places became.

    ``bound``: planned host name -> (real host name, address). The process backend's
    allocation is empty: its hosts are the planned ones.
    """

    id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)  # the backend's own record
    bound: dict[str, tuple[str, str]] = field(default_factory=dict)

    def host_of(self, planned: str) -> str:
        return self.bound[planned][0] if planned in self.bound else planned

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "data": self.data,
            "bound": {k: list(v) for k, v in self.bound.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Allocation:
        return cls(
            id=data.get("id"),
            data=dict(data.get("data") or {}),
            bound={k: (str(v[0]), str(v[1])) for k, v in dict(data.get("bound") or {}).items()},
        )


@dataclass(frozen=True)
class SupervisorRecord:
    """The process supervising the experiment (an attached apply, ``watch``, or the background
    supervisor a detached apply leaves)."""

    pid: int
    host: str  # the machine it runs on (hostname)
    started_at: float
    detached: bool
    log_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SupervisorRecord:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


@dataclass(frozen=True)
class State:
    lineage: str
    serial: int
    experiment_id: str
    cluster_name: str
    output_dir: str
    tasks: tuple[TaskRecord, ...]
    backend: BackendRef | None = None
    allocation: Allocation | None = None
    lost: tuple[TaskRecord, ...] = ()  # tasks left behind on hosts that became unreachable
    policy: JobPolicy = field(default_factory=JobPolicy)
    config: dict[str, Any] = field(default_factory=dict)  # the plan's source_config
    supervisor: SupervisorRecord | None = None
    # warm standbys (one per parameter server at most), named ``<task>~standby``: started
    # processes that wait to take over their task; never part of the cluster spec
    standbys: tuple[TaskRecord, ...] = ()
    version: int = STATE_FORMAT_VERSION
    # Where the launcher keeps the experiment's record ("": output_dir itself), and whether
    # the chief's outputs are copied there when the run ends (this machine does not see
    # output_dir: per-host output, or a shared folder it does not mount).
    record_dir: str = ""
    copy_back: bool = False
    # an elastic job's training replicas that ever took part (each sends one done token), as
    # told to its ps and chief in live.json; 0: never resized (TF_CONFIG's count holds)
    members: int = 0

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

    def task(self, name: str) -> TaskRecord | None:
        for task in self.tasks:
            if task.name == name:
                return task
        return None

    @property
    def running(self) -> list[TaskRecord]:
        return [t for t in self.tasks if t.running]

    def with_task(self, task: TaskRecord) -> State:
        """This state with ``task`` added, or replacing the task of the same name (in place)."""
        if self.task(task.name) is None:
            return replace(self, tasks=(*self.tasks, task))
        return replace(self, tasks=tuple(task if t.name == task.name else t for t in self.tasks))

    def with_tasks(self, tasks: Sequence[TaskRecord]) -> State:
        """:meth:`with_task` for many at once (new ones appended in order)."""
        new = {t.name: t for t in tasks}
        kept = tuple(new.pop(t.name, t) for t in self.tasks)
        return replace(self, tasks=(*kept, *new.values()))

    def without_task(self, name: str) -> State:
        return replace(self, tasks=tuple(t for t in self.tasks if t.name != name))

    def standby_for(self, task: str) -> TaskRecord | None:
        """The warm standby of ``task``, if one was started."""
        name = standby_name(task)
        return next((s for s in self.standbys if s.name == name), None)

    def with_standby(self, standby: TaskRecord) -> State:
        others = tuple(s for s in self.standbys if s.name != standby.name)
        return replace(self, standbys=(*others, standby))

    def without_standbys(self, names: set[str] | frozenset[str] | None = None) -> State:
        """This state without the standbys named in ``names`` (all of them when None)."""
        if names is None:
            return replace(self, standbys=())
        return replace(self, standbys=tuple(s for s in self.standbys if s.name not in names))

    def cluster_spec(self) -> dict[str, list[str]]:
        """job -> ["address:port", ...] of the tasks as they were bound at start."""
        addresses = {t.host: t.address or t.host for t in self.tasks}
        return cluster_spec_of(self.tasks, addresses)

    def hosts(self) -> tuple[HostSpec, ...]:
        seen: dict[str, str | None] = {}
        for task in (*self.tasks, *self.lost):
            seen.setdefault(task.host, task.address)
        return tuple(HostSpec(name, address) for name, address in seen.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "lineage": self.lineage,
            "serial": self.serial,
            "experiment_id": self.experiment_id,
            "cluster_name": self.cluster_name,
            "output_dir": self.output_dir,
            "backend": self.backend.to_dict() if self.backend else None,
            "allocation": self.allocation.to_dict() if self.allocation else None,
            "tasks": [t.to_dict() for t in self.tasks],
            "lost": [t.to_dict() for t in self.lost],
            "policy": self.policy.to_dict(),
            "config": self.config,
            "supervisor": self.supervisor.to_dict() if self.supervisor else None,
            "standbys": [t.to_dict() for t in self.standbys],
            "record_dir": self.record_dir,
            "copy_back": self.copy_back,
            "members": self.members,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> State:
        backend, allocation, supervisor = (
            data.get("backend"),
            data.get("allocation"),
            data.get("supervisor"),
        )
        return cls(
            lineage=data["lineage"],
            serial=int(data["serial"]),
            experiment_id=data["experiment_id"],
            cluster_name=data["cluster_name"],
            output_dir=data["output_dir"],
            tasks=tuple(TaskRecord.from_dict(t) for t in data["tasks"]),
            backend=BackendRef.from_dict(backend) if backend else None,
            allocation=Allocation.from_dict(allocation) if allocation else None,
            lost=tuple(TaskRecord.from_dict(t) for t in data.get("lost", [])),
            policy=JobPolicy.from_dict(data["policy"]) if data.get("policy") else JobPolicy(),
            config=dict(data.get("config") or {}),
            supervisor=SupervisorRecord.from_dict(supervisor) if supervisor else None,
            standbys=tuple(TaskRecord.from_dict(t) for t in data.get("standbys", [])),
            version=int(data.get("version", STATE_FORMAT_VERSION)),
            record_dir=str(data.get("record_dir") or ""),
            copy_back=bool(data.get("copy_back", False)),
            members=int(data.get("members", 0)),
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
            "the saved plan is stale: it was made before any state existed, but tasks have been "
            "applied since: run `tfplan plan` again"
        )
    if plan_serial != current_serial:
        raise StaleStateError(
            f"the saved plan is stale: it was made at state serial {plan_serial}, the state is now "
            f"at serial {current_serial}: run `tfplan plan` again"
        )
