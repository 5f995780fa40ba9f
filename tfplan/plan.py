"""The Plan: plain data that says which tasks run where, and what must change to get there.

A Plan is made by :func:`tfplan.planner.plan` (pure), printed by :mod:`tfplan.render`, saved to a
plan file, and executed exactly as saved by :mod:`tfplan.applier`. It round-trips through JSON
unchanged: ``Plan.from_dict(plan.to_dict()) == plan``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "PLAN_FORMAT_VERSION",
    "Action",
    "Change",
    "HostSpec",
    "Plan",
    "Role",
    "ShardPlacement",
    "ShardingPreview",
    "Task",
    "VariableSpec",
]

PLAN_FORMAT_VERSION = 1


class Role(str, Enum):
    PS = "ps"
    CHIEF = "chief"
    WORKER = "worker"
    EVALUATOR = "evaluator"


class Action(str, Enum):
    CREATE = "create"
    UPDATE = "update"  # in place: only supervisor-side settings changed, the process keeps running
    REPLACE = "replace"  # destroy, then create (the process must restart)
    DESTROY = "destroy"
    NOOP = "no-op"


@dataclass(frozen=True)
class HostSpec:
    """How apply reaches one host (resolved: ``executor`` is "local" or "ssh")."""

    name: str
    address: str
    executor: str
    python: str
    ssh_user: str | None = None
    ssh_port: int | None = None
    ssh_key: str | None = None
    accept_new_host_keys: bool = False
    known_hosts: str | None = None


@dataclass(frozen=True)
class Task:
    """One TensorFlow process: where it runs and exactly how it is started."""

    role: Role
    index: int
    host: str  # the host's name (unique in the cluster)
    address: str  # how other tasks (and SSH) reach that host
    port: int | None  # None for the evaluator, which is not part of the cluster spec
    devices: tuple[str, ...]  # GPU ids; exported as CUDA_VISIBLE_DEVICES ("" hides every GPU)
    tf_config: str  # the TF_CONFIG JSON, exactly as exported
    command: tuple[str, ...]
    env: dict[str, str]  # everything exported to the process, TF_CONFIG included
    workdir: str  # per-task folder on the host: run config, log
    log_path: str
    is_chief: bool
    config_digest: str  # digest of run.yaml, which every task reads
    fingerprint: str  # digest of everything that forces a restart when it changes
    settings: dict[str, str] = field(default_factory=dict)  # supervisor-side, updatable in place

    @property
    def name(self) -> str:
        return f"{self.role.value}/{self.index}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["role"] = self.role.value
        data["devices"] = list(self.devices)
        data["command"] = list(self.command)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        return cls(
            role=Role(data["role"]),
            index=int(data["index"]),
            host=data["host"],
            address=data["address"],
            port=data["port"],
            devices=tuple(data["devices"]),
            tf_config=data["tf_config"],
            command=tuple(data["command"]),
            env=dict(data["env"]),
            workdir=data["workdir"],
            log_path=data["log_path"],
            is_chief=bool(data["is_chief"]),
            config_digest=data["config_digest"],
            fingerprint=data["fingerprint"],
            settings=dict(data.get("settings", {})),
        )


@dataclass(frozen=True)
class Change:
    """What happens to one task, and why."""

    task: str  # task name, "worker/1"
    action: Action
    reasons: tuple[str, ...] = ()
    previous: dict[str, Any] = field(default_factory=dict)  # host, port, pid from the state

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "action": self.action.value,
            "reasons": list(self.reasons),
            "previous": self.previous,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Change:
        return cls(
            task=data["task"],
            action=Action(data["action"]),
            reasons=tuple(data["reasons"]),
            previous=dict(data.get("previous", {})),
        )


@dataclass(frozen=True)
class VariableSpec:
    name: str
    shape: tuple[int, ...]
    bytes: int


@dataclass(frozen=True)
class ShardPlacement:
    """Where each variable goes under one strategy, and the bytes each ps ends up holding."""

    strategy: str  # "round_robin" (replica_device_setter's default) | "greedy_bytes"
    assignment: dict[str, int]  # variable name -> ps index
    bytes_per_ps: tuple[int, ...]


@dataclass(frozen=True)
class ShardingPreview:
    variables: tuple[VariableSpec, ...]
    placements: tuple[ShardPlacement, ...]

    @property
    def total_bytes(self) -> int:
        return sum(v.bytes for v in self.variables)


@dataclass(frozen=True)
class Plan:
    """Everything ``apply`` needs, and nothing it would have to recompute."""

    experiment_id: str
    cluster_name: str
    hosts: tuple[HostSpec, ...]
    tasks: tuple[Task, ...]  # the desired tasks, in start order (ps first)
    changes: tuple[Change, ...]  # one per task in the union of desired and current
    cluster_spec: dict[str, list[str]]  # job name -> "host:port" list
    run_config: dict[str, Any]  # the resolved experiment config each task reads
    output_dir: str
    code_dir: str  # where apply puts the recipes package on every host (PYTHONPATH)
    tf_version: str  # the TensorFlow version every host must have
    settings: dict[str, str]  # supervisor-side: lifecycle policies
    sharding: ShardingPreview
    warnings: tuple[str, ...]
    state_lineage: str | None  # the state this plan was made against (None: no state yet)
    state_serial: int
    format_version: int = PLAN_FORMAT_VERSION
    # The typed config as plain data, paths absolute, plus the planning context: what the
    # supervisor needs to plan again on its own (e.g. around a host that went down).
    source_config: dict[str, Any] = field(default_factory=dict)

    def host(self, name: str) -> HostSpec:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def task(self, name: str) -> Task:
        for task in self.tasks:
            if task.name == name:
                return task
        raise KeyError(name)

    def counts(self) -> dict[Action, int]:
        """How many changes of each action, Terraform's summary line."""
        counts = {action: 0 for action in Action}
        for change in self.changes:
            counts[change.action] += 1
        return counts

    @property
    def has_changes(self) -> bool:
        return any(c.action is not Action.NOOP for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "experiment_id": self.experiment_id,
            "cluster_name": self.cluster_name,
            "hosts": [asdict(h) for h in self.hosts],
            "tasks": [t.to_dict() for t in self.tasks],
            "changes": [c.to_dict() for c in self.changes],
            "cluster_spec": self.cluster_spec,
            "run_config": self.run_config,
            "output_dir": self.output_dir,
            "code_dir": self.code_dir,
            "tf_version": self.tf_version,
            "settings": self.settings,
            "sharding": {
                "variables": [
                    {"name": v.name, "shape": list(v.shape), "bytes": v.bytes}
                    for v in self.sharding.variables
                ],
                "placements": [
                    {
                        "strategy": p.strategy,
                        "assignment": p.assignment,
                        "bytes_per_ps": list(p.bytes_per_ps),
                    }
                    for p in self.sharding.placements
                ],
            },
            "warnings": list(self.warnings),
            "state_lineage": self.state_lineage,
            "state_serial": self.state_serial,
            "source_config": self.source_config,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        sharding = data["sharding"]
        return cls(
            format_version=int(data["format_version"]),
            experiment_id=data["experiment_id"],
            cluster_name=data["cluster_name"],
            hosts=tuple(HostSpec(**h) for h in data["hosts"]),
            tasks=tuple(Task.from_dict(t) for t in data["tasks"]),
            changes=tuple(Change.from_dict(c) for c in data["changes"]),
            cluster_spec={k: list(v) for k, v in data["cluster_spec"].items()},
            run_config=data["run_config"],
            output_dir=data["output_dir"],
            code_dir=data["code_dir"],
            tf_version=data["tf_version"],
            settings=dict(data["settings"]),
            sharding=ShardingPreview(
                variables=tuple(
                    VariableSpec(v["name"], tuple(v["shape"]), int(v["bytes"]))
                    for v in sharding["variables"]
                ),
                placements=tuple(
                    ShardPlacement(p["strategy"], dict(p["assignment"]), tuple(p["bytes_per_ps"]))
                    for p in sharding["placements"]
                ),
            ),
            warnings=tuple(data["warnings"]),
            state_lineage=data["state_lineage"],
            state_serial=int(data["state_serial"]),
            source_config=dict(data.get("source_config", {})),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))
