"""Pure: turn a composed config and the current state into a :class:`Plan`.

No I/O, no clock, no randomness, no TensorFlow: everything the world contributes (the current
directory, the local interpreter, the TensorFlow version, the refreshed state) comes in through
:class:`PlanContext` and :class:`State`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tfplan.config import ChiefMode, ClusterConfig, Config, HostConfig
from tfplan.placement import Slot, allocate_ports, host_name, place
from tfplan.plan import Action, Change, HostSpec, Plan, Role, Task
from tfplan.sharding import preview_sharding
from tfplan.state import State, TaskState
from tfplan.tf_config import tf_config_json
from tfplan.validate import count_ps, is_loopback, validate

__all__ = ["PlanContext", "plan", "GRPC_WARNING"]

GRPC_WARNING = (
    "TensorFlow's gRPC servers listen on every interface (*:PORT) and have no authentication: "
    "anyone who can reach {ports} can read and change the model and run operations in the tasks. "
    "Keep the hosts on a private network, or firewall these ports to the cluster's own addresses."
)
_QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class PlanContext:
    """What the planner needs from the world, gathered by the caller."""

    cwd: str  # relative output_dir / workdir are taken from here
    local_python: str  # the interpreter for local hosts that name none
    tf_version: str  # the TensorFlow version the hosts must run


def plan(cfg: Config, state: State | None, ctx: PlanContext) -> Plan:
    """Place every task of ``cfg`` and compute the changes against ``state``.

    Args:
        cfg: the composed, typed config (``OmegaConf.to_object`` of Hydra's composition).
        state: the refreshed current state (task statuses up to date), or None.
        ctx: facts from the caller's environment.

    Returns:
        The plan; ``plan.changes`` has one entry per task in the union of desired and current.

    Raises:
        ConfigError: a value is out of range or does not fit the topology.
        PlanError: the tasks do not fit on the hosts (slots, ports).
    """
    validate(cfg)
    cluster = cfg.cluster
    down = _unreachable_hosts(state)
    slots = place(_without(cluster, down))
    hosts = tuple(_host_spec(cfg, h, ctx) for h in cluster.hosts)
    live = _live_tasks(state, cfg.experiment.id)
    preferred = {(t.name, _host_position(cluster.hosts, t.host)): t.port for t in live if t.port}
    ports = allocate_ports(cluster, slots, preferred, held=_held_ports(slots, live, cluster.hosts))
    cluster_spec = _cluster_spec(slots, ports, hosts)
    output_dir = _absolute(cluster.output_dir, ctx.cwd)
    workdir = _absolute(cluster.workdir, ctx.cwd)
    run_config = _run_config(cfg, output_dir)
    config_digest = _digest(run_config)
    settings = _job_settings(cfg)
    tf_configs = _TfConfigs(cluster_spec)
    tasks = tuple(
        _task(
            cfg,
            slot,
            hosts[slot.host],
            ports.get((slot.role, slot.index)),
            tf_configs,
            workdir,
            output_dir,
            config_digest,
            _task_settings(cfg, slot.role),
        )
        for slot in slots
    )
    changes = _diff(tasks, state)
    return Plan(
        experiment_id=cfg.experiment.id,
        cluster_name=cluster.name,
        hosts=hosts,
        tasks=tasks,
        changes=changes,
        cluster_spec=cluster_spec,
        run_config=run_config,
        output_dir=output_dir,
        code_dir=posixpath.join(workdir, "_code"),
        tf_version=ctx.tf_version,
        settings=settings,
        sharding=preview_sharding(cfg.model, cfg.data, count_ps(cluster)),
        warnings=_warnings(cfg, ports) + _down_warnings(down),
        state_lineage=state.lineage if state is not None else None,
        state_serial=state.serial if state is not None else 0,
        source_config=_source_config(cfg, ctx, output_dir, workdir),
    )


def _unreachable_hosts(state: State | None) -> frozenset[str]:
    """Hosts the refreshed state could not reach: nothing new is placed there."""
    if state is None:
        return frozenset()
    return frozenset(t.host for t in state.tasks if t.status == "unreachable")


def _without(cluster: ClusterConfig, down: frozenset[str]) -> ClusterConfig:
    if not down:
        return cluster
    hosts = [
        dataclasses.replace(h, cpu_slots=0, gpus=0) if host_name(h) in down else h
        for h in cluster.hosts
    ]
    return dataclasses.replace(cluster, hosts=hosts)


def _down_warnings(down: frozenset[str]) -> tuple[str, ...]:
    return tuple(
        f"host {name} is unreachable: its tasks are placed on the other hosts, and since the "
        "cluster spec changes every task restarts from the last checkpoint"
        for name in sorted(down)
    )


def _source_config(cfg: Config, ctx: PlanContext, output_dir: str, workdir: str) -> dict[str, Any]:
    config = _plain(cfg)
    config["cluster"]["output_dir"] = output_dir
    config["cluster"]["workdir"] = workdir
    return {"config": config, "context": dataclasses.asdict(ctx)}


def _job_settings(cfg: Config) -> dict[str, str]:
    """Supervisor-side settings of the whole job (changing them restarts nothing)."""
    life = cfg.lifecycle
    return {
        "on_chief_failure": life.on_chief_failure,
        "ps_grace_secs": str(life.ps_grace_secs),
        "evaluator_grace_secs": str(life.evaluator_grace_secs),
        "stop_grace_secs": str(life.stop_grace_secs),
        "deadline_secs": "" if life.deadline_secs is None else str(life.deadline_secs),
        "host_timeout_secs": str(life.host_timeout_secs),
        "on_host_failure": life.on_host_failure,
    }


def _task_settings(cfg: Config, role: Role) -> dict[str, str]:
    """The job's settings plus this role's restart policy and liveness timeout."""
    life = cfg.lifecycle
    liveness = life.progress_timeout_secs if role in (Role.CHIEF, Role.WORKER) else None
    return {
        **_job_settings(cfg),
        "restart_policy": str(getattr(life.restart, role.value)),
        "backoff_limit": str(life.restart.backoff_limit),
        "backoff_secs": str(life.restart.backoff_secs),
        "progress_timeout_secs": "" if liveness is None else str(liveness),
    }


def _host_spec(cfg: Config, host: HostConfig, ctx: PlanContext) -> HostSpec:
    local = host.executor == "local" or (
        host.executor == "auto" and is_loopback(host.address) and host.ssh_port is None
    )
    default_python = ctx.local_python if local else "python3"
    return HostSpec(
        name=host_name(host),
        address=host.address,
        executor="local" if local else "ssh",
        python=host.python or cfg.cluster.python or default_python,
        ssh_user=host.ssh_user,
        ssh_port=host.ssh_port,
        ssh_key=host.ssh_key,
        accept_new_host_keys=cfg.cluster.ssh_accept_new_host_keys,
        known_hosts=cfg.cluster.ssh_known_hosts,
    )


def _live_tasks(state: State | None, experiment_id: str) -> tuple[TaskState, ...]:
    if state is None:
        return ()
    return tuple(t for t in state.tasks if t.status == "running")


def _held_ports(
    slots: tuple[Slot, ...], live: tuple[TaskState, ...], hosts: list[HostConfig]
) -> dict[int, frozenset[int]]:
    """Ports of running tasks that no desired task keeps (destroyed, or moving to another host):
    they stay bound until apply stops those tasks, so no new task may be given them."""
    desired = {(f"{s.role.value}/{s.index}", s.host) for s in slots}
    held: dict[int, set[int]] = {}
    for task in live:
        position = _host_position(hosts, task.host)
        if task.port and position >= 0 and (task.name, position) not in desired:
            held.setdefault(position, set()).add(task.port)
    return {position: frozenset(ports) for position, ports in held.items()}


class _TfConfigs:
    """Every task's TF_CONFIG (exactly :func:`tf_config_json`'s text) and a digest of it.

    Each TF_CONFIG lists the whole cluster, so encoding and hashing it afresh for every task
    made planning quadratic (9,000 tasks: minutes). The cluster part is encoded and hashed once;
    each task splices in its own small ``task`` part (keys sort "cluster" before "task").
    """

    def __init__(self, cluster_spec: dict[str, list[str]]) -> None:
        cluster = tf_config_json(cluster_spec, "", 0)
        self._head = cluster[: cluster.rindex(',"task":')]
        self.cluster_digest = _digest(self._head)

    def text(self, task_type: str, task_index: int) -> str:
        task = json.dumps(
            {"index": task_index, "type": task_type}, sort_keys=True, separators=(",", ":")
        )
        return f'{self._head},"task":{task}}}'


def _host_position(hosts: list[HostConfig], name: str) -> int:
    for position, host in enumerate(hosts):
        if host_name(host) == name:
            return position
    return -1


def _cluster_spec(
    slots: tuple[Slot, ...], ports: Mapping[tuple[Role, int], int], hosts: tuple[HostSpec, ...]
) -> dict[str, list[str]]:
    spec: dict[str, list[str]] = {}
    for slot in slots:
        if slot.role is Role.EVALUATOR:
            continue
        address = f"{hosts[slot.host].address}:{ports[(slot.role, slot.index)]}"
        spec.setdefault(slot.role.value, []).append(address)
    return spec


def _absolute(path: str, cwd: str) -> str:
    return posixpath.normpath(path if path.startswith("/") else posixpath.join(cwd, path))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _run_config(cfg: Config, output_dir: str) -> dict[str, Any]:
    """What every task reads as run.yaml (docs/contract.md)."""
    return {
        "experiment": {"id": cfg.experiment.id},
        "output_dir": output_dir,
        "algo": _plain(cfg.algo),
        "model": _plain(cfg.model),
        "data": _plain(cfg.data),
        "trainer": _plain(cfg.trainer),
    }


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _task(
    cfg: Config,
    slot: Slot,
    host: HostSpec,
    port: int | None,
    tf_configs: _TfConfigs,
    workdir: str,
    output_dir: str,
    config_digest: str,
    settings: dict[str, str],
) -> Task:
    task_dir = posixpath.join(workdir, f"{slot.role.value}-{slot.index}")
    run_yaml = posixpath.join(task_dir, "run.yaml")
    tf_config = tf_configs.text(slot.role.value, slot.index)
    if cfg.recipe.kind == "command":
        command = tuple(shlex.split(cfg.recipe.command or ""))
    else:
        command = (host.python, "-m", "recipes.train", "--config", run_yaml)
    env = {
        **_QUIET_ENV,
        "TF_CONFIG": tf_config,
        "CUDA_VISIBLE_DEVICES": ",".join(slot.devices),
        "PYTHONPATH": posixpath.join(workdir, "_code"),
        "TFPLAN_TASK": f"{slot.role.value}/{slot.index}",
        "TFPLAN_OUTPUT_DIR": output_dir,
        "TFPLAN_RUN_CONFIG": run_yaml,
    }
    is_chief = slot.role is Role.CHIEF or (
        cfg.cluster.chief is ChiefMode.worker0 and slot.role is Role.WORKER and slot.index == 0
    )
    restart_relevant = {
        "host": host.name,
        "address": host.address,
        "port": port,
        "devices": list(slot.devices),
        "command": list(command),
        # TF_CONFIG is determined by the cluster spec and the task's own type and index
        # (TFPLAN_TASK), so its digest stands for its text
        "env": {**env, "TF_CONFIG": tf_configs.cluster_digest},
        "config_digest": config_digest,
    }
    return Task(
        role=slot.role,
        index=slot.index,
        host=host.name,
        address=host.address,
        port=port,
        devices=slot.devices,
        tf_config=tf_config,
        command=command,
        env=env,
        workdir=task_dir,
        log_path=posixpath.join(task_dir, "task.log"),
        is_chief=is_chief,
        config_digest=config_digest,
        fingerprint=_digest(restart_relevant),
        settings=dict(settings),
    )


def _diff(tasks: tuple[Task, ...], state: State | None) -> tuple[Change, ...]:
    current = {t.name: t for t in state.tasks} if state is not None else {}
    changes = [_change(task, current.get(task.name)) for task in tasks]
    desired = {t.name for t in tasks}
    for name, old in current.items():
        if name not in desired:
            changes.append(
                Change(
                    task=name,
                    action=Action.DESTROY,
                    reasons=("not in the configuration any more",),
                    previous=_previous(old),
                )
            )
    return tuple(changes)


def _previous(old: TaskState) -> dict[str, Any]:
    return {"host": old.host, "port": old.port, "pid": old.pid, "status": old.status}


def _change(task: Task, old: TaskState | None) -> Change:
    if old is None:
        return Change(task=task.name, action=Action.CREATE)
    if old.status == "unreachable":
        return Change(
            task=task.name,
            action=Action.REPLACE,
            reasons=(f"host {old.host} is unreachable",),
            previous=_previous(old),
        )
    if old.status not in ("running", "succeeded"):
        exit_note = f", exit code {old.exit_code}" if old.exit_code is not None else ""
        return Change(
            task=task.name,
            action=Action.REPLACE,
            reasons=(f"the process is not running (status {old.status}{exit_note})",),
            previous=_previous(old),
        )
    if old.fingerprint != task.fingerprint:
        return Change(
            task=task.name,
            action=Action.REPLACE,
            reasons=_restart_reasons(task, old.spec),
            previous=_previous(old),
        )
    if old.settings != task.settings:
        changed = sorted(
            k
            for k in {*old.settings, *task.settings}
            if old.settings.get(k) != task.settings.get(k)
        )
        return Change(
            task=task.name,
            action=Action.UPDATE,
            reasons=tuple(f"{k}: {old.settings.get(k)} -> {task.settings.get(k)}" for k in changed),
            previous=_previous(old),
        )
    return Change(task=task.name, action=Action.NOOP, previous=_previous(old))


def _restart_reasons(task: Task, old: Mapping[str, Any]) -> tuple[str, ...]:
    """Which restart-relevant fields changed, each as ``field: old -> new``."""
    if not old:
        return ("the task's definition changed",)
    new = task.to_dict()
    reasons = []
    for field in ("host", "port", "devices", "command"):
        if old.get(field) != new[field]:
            reasons.append(f"{field}: {_short(old.get(field))} -> {_short(new[field])}")
    if old.get("tf_config") != new["tf_config"]:
        reasons.append("TF_CONFIG changed (the cluster spec is different)")
    if old.get("config_digest") != new["config_digest"]:
        reasons.append("the run config changed")
    old_env = {k: v for k, v in dict(old.get("env", {})).items() if k != "TF_CONFIG"}
    new_env = {k: v for k, v in new["env"].items() if k != "TF_CONFIG"}
    for key in sorted({*old_env, *new_env}):
        if old_env.get(key) != new_env.get(key):
            reasons.append(f"env {key}: {_short(old_env.get(key))} -> {_short(new_env.get(key))}")
    return tuple(reasons) or ("the task's definition changed",)


def _short(value: Any) -> str:
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _warnings(cfg: Config, ports: Mapping[tuple[Role, int], int]) -> tuple[str, ...]:
    used = sorted(set(ports.values()))
    span = f"ports {used[0]}-{used[-1]}" if len(used) > 1 else f"port {used[0]}"
    warnings = [GRPC_WARNING.format(ports=span)]
    if cfg.trainer.checkpoint_steps is None and cfg.trainer.checkpoint_secs is None:
        warnings.append(
            "trainer.checkpoint_steps and trainer.checkpoint_secs are both null: no checkpoints, so "
            "a parameter server that dies takes all training progress with it"
        )
    return tuple(warnings)
