"""The Plan: plain data that says which tasks run where, and what must change to get there.

A Plan is made by :func:`tfplan.planning.planner.plan` (pure), printed by the CLI, saved to a plan
file, and executed exactly as saved by the engine. It round-trips through JSON unchanged:
``Plan.from_dict(plan.to_dict()) == plan``.

Size: the cluster spec is stored once (implied by the tasks and the hosts), never per task; a
task's TF_CONFIG is derived from it when the task starts (:meth:`Plan.tf_config`), so a plan
file grows linearly with the number of tasks. The file writes the environment every task shares
once, and each task's own variables beside it (docs/plan_format.md).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from tfplan.planning.policy import JobPolicy
from tfplan.planning.tf_config import ClusterSpecText

__all__ = [
    "PLAN_FORMAT_VERSION",
    "UserCode",
    "Action",
    "BackendRef",
    "Change",
    "EmbeddingTable",
    "HostSpec",
    "Plan",
    "Role",
    "ShardPlacement",
    "ShardingPreview",
    "Task",
    "VariableSpec",
]

# 3: the environment every task shares is written once ("env"), each task's "env" holds only its
# own variables; "cluster_spec" is written for readers; "targets" and "left_out" (-target).
PLAN_FORMAT_VERSION = 3
ROLE_ORDER = ("ps", "chief", "worker", "evaluator")


class Role(str, Enum):
    PS = "ps"
    CHIEF = "chief"
    WORKER = "worker"
    EVALUATOR = "evaluator"


class Action(str, Enum):
    CREATE = "create"
    UPDATE = "update"  # in place: only supervisor-side policy changed, the process keeps running
    REPLACE = "replace"  # destroy, then create (the process must restart)
    DESTROY = "destroy"
    NOOP = "no-op"


@dataclass(frozen=True)
class BackendRef:
    """Which backend carries out the plan, and its resolved options (plain data it defines).

    Everything a backend needs to reconnect to what it started is here or in the handles the
    state keeps, so ``status``/``destroy`` in a new process reach the same tasks.
    """

    name: str
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "config": self.config}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackendRef:
        return cls(name=str(data["name"]), config=dict(data.get("config") or {}))


@dataclass(frozen=True)
class HostSpec:
    """A place tasks run, and the address other tasks reach it at.

    ``address`` is None where a scheduler picks the machine at apply time (Slurm): the plan
    shows it as "(known after apply)" and the allocation binds it.
    """

    name: str
    address: str | None


@dataclass(frozen=True)
class Task:
    """One TensorFlow process: where it runs and exactly how it is started.

    ``env`` holds everything exported to the process except TF_CONFIG, which the engine derives
    from the cluster spec when it starts the task (see :meth:`Plan.tf_config`).
    """

    role: Role
    index: int
    host: str  # the host's name (unique in the plan)
    port: int | None  # None for the evaluator, which is not part of the cluster spec
    devices: tuple[str, ...]  # GPU ids; exported as CUDA_VISIBLE_DEVICES ("" hides every GPU)
    command: tuple[str, ...]
    env: dict[str, str]
    workdir: str  # per-task folder on the host: run config, log, exit code
    log_path: str
    is_chief: bool
    fingerprint: str  # digest of everything that forces a restart when it changes
    # Whether the task may use Keras (the user's program or code): a warm process for tasks
    # that never do imports TensorFlow without the Keras 3 its import pulls in (1.5 s of CPU)
    keras: bool = True
    # bytes the task may use (cluster.memory of its role), held by a memory cgroup of its own;
    # None: no limit of its own
    memory_limit: int | None = None

    @property
    def name(self) -> str:
        # ``_value_`` is the member's plain attribute: ``.value`` is a descriptor that costs
        # ~1 µs, and names are asked for millions of times on a cluster of 9,000 tasks.
        return f"{self.role._value_}/{self.index}"

    def to_dict(self, shared_env: dict[str, str] | None = None) -> dict[str, Any]:
        """As plain data; with ``shared_env``, ``env`` holds only what the task adds to it."""
        shared = shared_env or {}
        return {
            "role": self.role.value,
            "index": self.index,
            "host": self.host,
            "port": self.port,
            "devices": list(self.devices),
            "command": list(self.command),
            "env": {k: v for k, v in self.env.items() if k not in shared or shared[k] != v},
            "workdir": self.workdir,
            "log_path": self.log_path,
            "is_chief": self.is_chief,
            "fingerprint": self.fingerprint,
            **({} if self.keras else {"keras": False}),
            **({} if self.memory_limit is None else {"memory_limit": self.memory_limit}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], shared_env: dict[str, str] | None = None) -> Task:
        return cls(
            role=Role(data["role"]),
            index=int(data["index"]),
            host=data["host"],
            port=data["port"],
            devices=tuple(data["devices"]),
            command=tuple(data["command"]),
            env={**(shared_env or {}), **data["env"]},
            workdir=data["workdir"],
            log_path=data["log_path"],
            is_chief=bool(data["is_chief"]),
            fingerprint=data["fingerprint"],
            keras=bool(data.get("keras", True)),
            memory_limit=None if data.get("memory_limit") is None else int(data["memory_limit"]),
        )


@dataclass(frozen=True)
class Change:
    """What happens to one task, and why."""

    task: str  # task name, "worker/1"
    action: Action
    reasons: tuple[str, ...] = ()
    previous: dict[str, Any] = field(default_factory=dict)  # host, port, status from the state
    # what it costs the running job: "rolls back to checkpoint step N: ..." or "no rollback: ..."
    cost: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = {
            "task": self.task,
            "action": self.action.value,
            "reasons": list(self.reasons),
            "previous": self.previous,
        }
        if self.cost:
            data["cost"] = self.cost
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Change:
        return cls(
            task=data["task"],
            action=Action(data["action"]),
            reasons=tuple(data["reasons"]),
            previous=dict(data.get("previous", {})),
            cost=str(data.get("cost", "")),
        )


@dataclass(frozen=True)
class UserCode:
    """A package (or module) of the user's that the tasks import (``model._target_``,
    ``data._target_``, a ``model.loss`` callable): apply ships it beside the recipes, into
    ``<code_dir>/<name>``, on every host."""

    name: str  # the top-level package or module, e.g. "my_pkg"
    source: str  # on the machine that plans: a folder (package) or a .py file (module)
    files: int
    bytes: int
    digest: str  # of its files' names and contents: a change restarts the tasks
    keys: tuple[str, ...]  # the config keys that name it, e.g. ("model._target_",)

    @property
    def is_package(self) -> bool:
        return not self.source.endswith(".py")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "keys": list(self.keys)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UserCode:
        return cls(**{**data, "keys": tuple(data.get("keys", ()))})


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
class DynamicTableSettings:
    """A dynamic table's settings as the plan shows them (``model.dynamic``)."""

    capacity: int  # rows over all parameter servers
    rows_per_shard: int  # on each ps
    ids: str  # int64 | string
    min_count: int
    ttl_steps: int


@dataclass(frozen=True)
class EmbeddingTable:
    """One embedding table of the user's model as the plan shows it (tfplan/planning/tables.py):
    its size, where it and its optimizer slots sit, and what one step moves at the configured
    batch."""

    name: str  # the variable, as the variables are listed (model/<layer>/embeddings)
    layer: str
    feature: str | None  # the model input that feeds it directly, when one does
    rows: int
    width: int
    bytes: int  # the table alone
    slots: int  # the optimizer's slots per row (sgd 0, momentum 1, adagrad 1, adam 2)
    bytes_per_ps: tuple[int, ...]  # table + slots on each ps; empty: every worker holds it all
    # "rows" (only the batch's), "whole" (every step), "window" (a table read whole, in a
    # windowed algorithm's copy: whole per window), "replica" (allreduce: no ps)
    reads: str
    rows_per_step: int | None  # at most, at the configured batch (None: ids per example unknown)
    read_bytes_per_step: int | None  # from the ps to a worker per step, at most
    write_bytes_per_step: int | None  # back, at most (the batch's rows, with their ids)
    dynamic: DynamicTableSettings | None = None  # raw ids mapped to rows (model.dynamic)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bytes_per_ps": list(self.bytes_per_ps)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmbeddingTable:
        dynamic = data.get("dynamic")
        return cls(
            **{
                **data,
                "bytes_per_ps": tuple(data.get("bytes_per_ps", ())),
                "dynamic": None if dynamic is None else DynamicTableSettings(**dynamic),
            }
        )


@dataclass(frozen=True)
class ShardingPreview:
    variables: tuple[VariableSpec, ...]
    placements: tuple[ShardPlacement, ...]
    # where the shapes come from: "" for the built-in models (the config), else e.g. "an
    # inspection build of my_pkg.models.build (cached)"
    source: str = ""
    tables: tuple[EmbeddingTable, ...] = ()  # the user's model's embedding tables

    @property
    def total_bytes(self) -> int:
        return sum(v.bytes for v in self.variables)

    def to_dict(self) -> dict[str, Any]:
        return {
            "variables": [
                {"name": v.name, "shape": list(v.shape), "bytes": v.bytes} for v in self.variables
            ],
            "placements": [
                {
                    "strategy": p.strategy,
                    "assignment": p.assignment,
                    "bytes_per_ps": list(p.bytes_per_ps),
                }
                for p in self.placements
            ],
            "source": self.source,
            "tables": [t.to_dict() for t in self.tables],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardingPreview:
        return cls(
            variables=tuple(
                VariableSpec(v["name"], tuple(v["shape"]), int(v["bytes"]))
                for v in data["variables"]
            ),
            placements=tuple(
                ShardPlacement(p["strategy"], dict(p["assignment"]), tuple(p["bytes_per_ps"]))
                for p in data["placements"]
            ),
            source=str(data.get("source", "")),
            tables=tuple(EmbeddingTable.from_dict(t) for t in data.get("tables", ())),
        )


@dataclass(frozen=True)
class Plan:
    """Everything ``apply`` needs, and nothing it would have to recompute."""

    experiment_id: str
    cluster_name: str
    backend: BackendRef
    hosts: tuple[HostSpec, ...]
    tasks: tuple[Task, ...]  # the desired tasks, in start order (ps first)
    changes: tuple[Change, ...]  # one per task in the union of desired and current
    run_config: dict[str, Any]  # the resolved experiment config each task reads (run.yaml)
    config_digest: str  # digest of run_config
    output_dir: str
    code_dir: str  # where apply puts the recipes package on every host (PYTHONPATH)
    builtin_recipes: bool  # the tasks run tfplan's recipes (ship them, check TensorFlow)
    tf_version: str  # the TensorFlow version every host must have (built-in recipes)
    policy: JobPolicy  # supervisor-side: restarts, hangs, teardown (changing it restarts nothing)
    sharding: ShardingPreview
    warnings: tuple[str, ...]
    state_lineage: str | None  # the state this plan was made against (None: no state yet)
    state_serial: int
    # The user's command with its {placeholders} (recipe=command), filled in again at start
    # when the backend binds the hosts only then (Slurm); empty for the built-in recipes.
    command_template: tuple[str, ...] = ()
    cluster_digest: str = ""  # digest of the cluster spec as planned (in every fingerprint)
    # What the backend will ask its scheduler for, as it would be shown (sbatch options,
    # Kubernetes objects); empty for the process backend. Filled by the backend's dry run.
    request: tuple[str, ...] = ()
    format_version: int = PLAN_FORMAT_VERSION
    # The typed config as plain data, paths absolute, plus the planning context: what the
    # supervisor needs to plan again on its own (e.g. around a host that went down).
    source_config: dict[str, Any] = field(default_factory=dict)
    # -target: the task names and roles this plan was narrowed to (empty: the whole cluster).
    # ``changes`` then holds only the targeted tasks' changes; ``left_out`` counts, by action,
    # the changes of the other tasks that this plan does not make.
    targets: tuple[str, ...] = ()
    left_out: dict[str, int] = field(default_factory=dict)
    # cluster.output_mode: "shared", "per_host" or "auto" (apply finds out; the backend's
    # locate_output). Not "shared": the evaluator was placed beside the chief.
    output_mode: str = "shared"
    # The user's packages the tasks import, shipped beside the recipes (recipe.code_dir).
    user_code: tuple[UserCode, ...] = ()
    # workers join and leave this job while it runs (planning/resize.py): apply tells the
    # running tasks the new membership and asks leaving workers to stop after a push
    elastic: bool = False
    # How the training data is read and split, in one line (filled at plan time by the engine,
    # from the recipes' own TF-free inspection of the files); empty for the bundled sets.
    data_note: str = ""

    # Lookups by name, built once: a plan of 9,000 tasks is asked for each of them.
    @cached_property
    def _hosts_by_name(self) -> dict[str, HostSpec]:
        return {h.name: h for h in self.hosts}

    @cached_property
    def _tasks_by_name(self) -> dict[str, Task]:
        return {t.name: t for t in self.tasks}

    @cached_property
    def _cluster_text(self) -> ClusterSpecText:
        return ClusterSpecText(self._cluster_spec)

    def host(self, name: str) -> HostSpec:
        return self._hosts_by_name[name]

    def task(self, name: str) -> Task:
        return self._tasks_by_name[name]

    def has_task(self, name: str) -> bool:
        return name in self._tasks_by_name

    def address_of(self, task: Task) -> str | None:
        return self.host(task.host).address

    @cached_property
    def _cluster_spec(self) -> dict[str, list[str]]:
        addresses = {h.name: h.address or h.name for h in self.hosts}
        return cluster_spec_of(self.tasks, addresses)

    def cluster_spec(self) -> dict[str, list[str]]:
        """job -> ["address:port", ...] (the evaluator is not part of it); an address that is
        only known after apply shows as the host's name."""
        return {job: list(endpoints) for job, endpoints in self._cluster_spec.items()}

    def tf_config(self, task: Task) -> str:
        """The task's TF_CONFIG as exported (for display; the engine uses the bound hosts)."""
        return self._cluster_text.tf_config(task.role.value, task.index)

    def tf_config_size(self, task: Task) -> int:
        """Bytes of the task's TF_CONFIG, without building it."""
        return self._cluster_text.size(task.role.value, task.index)

    def shared_env(self) -> dict[str, str]:
        """The variables every task exports with the same value (written once in the file)."""
        if not self.tasks:
            return {}
        shared = dict(self.tasks[0].env)
        for task in self.tasks[1:]:
            env = task.env
            shared = {k: v for k, v in shared.items() if env.get(k) == v}
        return shared

    def counts(self) -> dict[Action, int]:
        """How many changes of each action, Terraform's summary line."""
        counts = {action: 0 for action in Action}
        for change in self.changes:
            counts[change.action] += 1
        return counts

    @property
    def has_changes(self) -> bool:
        return any(c.action is not Action.NOOP for c in self.changes)

    @property
    def addresses_known(self) -> bool:
        return all(h.address is not None for h in self.hosts)

    def to_dict(self) -> dict[str, Any]:
        """The plan file's document (docs/plan_format.md); ``cluster_spec`` is derived, written
        for readers, and not read back."""
        env = self.shared_env()
        return {
            "format_version": self.format_version,
            "experiment_id": self.experiment_id,
            "cluster_name": self.cluster_name,
            "backend": self.backend.to_dict(),
            "hosts": [asdict(h) for h in self.hosts],
            "cluster_spec": self.cluster_spec(),
            "env": env,
            "tasks": [t.to_dict(env) for t in self.tasks],
            "changes": [c.to_dict() for c in self.changes],
            "targets": list(self.targets),
            "left_out": dict(self.left_out),
            "run_config": self.run_config,
            "config_digest": self.config_digest,
            "output_dir": self.output_dir,
            "output_mode": self.output_mode,
            "code_dir": self.code_dir,
            "builtin_recipes": self.builtin_recipes,
            "tf_version": self.tf_version,
            "policy": self.policy.to_dict(),
            "sharding": self.sharding.to_dict(),
            "warnings": list(self.warnings),
            "state_lineage": self.state_lineage,
            "state_serial": self.state_serial,
            "request": list(self.request),
            "command_template": list(self.command_template),
            "cluster_digest": self.cluster_digest,
            "source_config": self.source_config,
            "user_code": [c.to_dict() for c in self.user_code],
            "elastic": self.elastic,
            "data_note": self.data_note,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        env = dict(data.get("env") or {})
        return cls(
            format_version=int(data["format_version"]),
            experiment_id=data["experiment_id"],
            cluster_name=data["cluster_name"],
            backend=BackendRef.from_dict(data["backend"]),
            hosts=tuple(HostSpec(**h) for h in data["hosts"]),
            tasks=tuple(Task.from_dict(t, env) for t in data["tasks"]),
            changes=tuple(Change.from_dict(c) for c in data["changes"]),
            run_config=data["run_config"],
            config_digest=data["config_digest"],
            output_dir=data["output_dir"],
            code_dir=data["code_dir"],
            builtin_recipes=bool(data["builtin_recipes"]),
            tf_version=data["tf_version"],
            policy=JobPolicy.from_dict(data["policy"]),
            sharding=ShardingPreview.from_dict(data["sharding"]),
            warnings=tuple(data["warnings"]),
            state_lineage=data["state_lineage"],
            state_serial=int(data["state_serial"]),
            request=tuple(data.get("request", ())),
            command_template=tuple(data.get("command_template", ())),
            cluster_digest=str(data.get("cluster_digest", "")),
            source_config=dict(data.get("source_config", {})),
            targets=tuple(data.get("targets", ())),
            left_out={str(k): int(v) for k, v in dict(data.get("left_out") or {}).items()},
            output_mode=str(data.get("output_mode", "shared")),
            user_code=tuple(UserCode.from_dict(c) for c in data.get("user_code") or ()),
            elastic=bool(data.get("elastic", False)),
            data_note=str(data.get("data_note", "")),
        )

    def to_json(self, indent: int | None = 2) -> str:
        """JSON; ``indent=None`` is the compact form the plan file uses."""
        separators = (",", ":") if indent is None else None
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True, separators=separators)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))


def cluster_spec_of(tasks: Any, addresses: dict[str, str]) -> dict[str, list[str]]:
    """job -> ["address:port", ...] in task-index order, from tasks and host addresses.

    Args:
        tasks: anything with ``role`` (Role or str), ``index``, ``host`` and ``port``.
        addresses: host name -> address.
    """
    spec: dict[str, list[tuple[int, str]]] = {}
    for task in tasks:
        role = task.role._value_ if isinstance(task.role, Role) else str(task.role)
        if role == Role.EVALUATOR.value or task.port is None:
            continue
        spec.setdefault(role, []).append((task.index, f"{addresses[task.host]}:{task.port}"))
    ordered = {role: spec[role] for role in ROLE_ORDER if role in spec}
    return {role: [endpoint for _, endpoint in sorted(items)] for role, items in ordered.items()}
