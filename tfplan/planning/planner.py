"""Pure: turn a composed config, a backend's target and the current state into a :class:`Plan`.

No I/O, no clock, no randomness, no TensorFlow, no backend: everything the world contributes (the
current directory, the local interpreter, the TensorFlow version, the backend's topology, the
refreshed state) comes in through :class:`PlanContext`, :class:`Target` and :class:`State`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
from collections import Counter
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from tfplan.config.algorithms import ALGORITHMS, TF2_STRATEGIES
from tfplan.config.callables import named_targets
from tfplan.config.schema import ChiefMode, Config
from tfplan.errors import ConfigError, PlanError
from tfplan.planning.commands import split_command, task_command, with_python
from tfplan.planning.context import PlanContext
from tfplan.planning.costs import with_costs
from tfplan.planning.diff import diff
from tfplan.planning.memory import memory_key, memory_limits, memory_warnings
from tfplan.planning.placement import PortRange, Slot, allocate_ports, place
from tfplan.planning.plan import Action, Change, HostSpec, Plan, Role, Task
from tfplan.planning.policy import (
    ChiefFailure,
    HostFailure,
    JobPolicy,
    RestartPolicy,
    TaskPolicy,
)
from tfplan.planning.resize import is_elastic, membership_digest, resize_blocker
from tfplan.planning.roles import RoleCounts, role_counts
from tfplan.planning.sharding import preview_sharding
from tfplan.planning.state import State, TaskRecord, TaskStatus
from tfplan.planning.targets import resolve_targets
from tfplan.planning.tf_config import (
    ENV_VALUE_LIMIT,
    MAX_ARG_STRLEN,
    ClusterSpecText,
    is_python,
)
from tfplan.planning.topology import Place, Target, Topology
from tfplan.planning.validate import validate

__all__ = ["GRPC_WARNING", "PlanContext", "plan"]

GRPC_WARNING = (
    "TensorFlow's gRPC servers listen on every interface (*:PORT) and have no authentication: "
    "anyone who can reach {ports} can read and change the model and run operations in the tasks. "
    "Keep the hosts on a private network, or firewall these ports to the cluster's own "
    "addresses (cluster.firewall=true does it on the process and slurm backends)."
)
_QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONUNBUFFERED": "1"}


def plan(
    cfg: Config,
    state: State | None,
    ctx: PlanContext,
    target: Target,
    targets: Sequence[str] = (),
    checkpoint_step: int | None = None,
) -> Plan:
    """Place every task of ``cfg`` on the backend's topology and compute the changes.

    Args:
        cfg: the composed, typed config (``OmegaConf.to_object`` of Hydra's composition).
        state: the refreshed current state (task statuses up to date), or None.
        ctx: facts from the caller's environment.
        target: the backend (name and resolved options) and the places it offers.
        targets: ``-target``: task names or roles; only their changes are planned. Every task
            is still placed (the cluster spec is the whole cluster's).
        checkpoint_step: the running job's last checkpoint (0: none yet; None: not known
            here), for what each change costs it (:mod:`tfplan.planning.costs`).

    Returns:
        The plan; ``plan.changes`` has one entry per task in the union of desired and current
        (of the targeted ones only, with ``targets``).

    Raises:
        ConfigError: a value is out of range or does not fit the topology, a task could never
            start (an argument or variable over Linux's limit), or a target names no task.
        PlanError: the tasks do not fit on the hosts (slots, ports).
    """
    topology = target.topology
    counts = role_counts(cfg.cluster, topology)
    validate(cfg, counts)
    down = _unreachable_hosts(state)
    live = state.running if state is not None else []
    if topology.per_task is not None:
        places, slots, ports = _per_task_placement(topology, counts)
    else:
        places = tuple(
            dataclasses.replace(p, cpu_slots=0, gpus=0) if p.name in down else p
            for p in topology.places
        )
        try:
            slots = place(
                places,
                counts,
                (topology.places_key, topology.slots_key),
                _evaluator_with_chief(cfg.cluster.output_mode, places),
            )
        except PlanError as error:
            if target.allocates is None or not live:
                raise
            raise PlanError(
                f"{error}; the running {target.allocates} has no room for more, and a larger "
                "one restarts every task"
            ) from None
        port_range = PortRange(
            cfg.cluster.port_base, cfg.cluster.port_range, cfg.cluster.port_offset
        )
        position = {p.name: i for i, p in enumerate(places)}
        preferred = {(t.name, position.get(t.planned_host, -1)): t.port for t in live if t.port}
        held = _held_ports(slots, live, position)
        ports = allocate_ports(places, port_range, slots, preferred, held)
    hosts = tuple(HostSpec(p.name, p.address) for p in places)
    output_dir = _absolute(cfg.cluster.output_dir, ctx.cwd)
    workdir = _absolute(cfg.cluster.workdir, ctx.cwd)
    run_config = _run_config(cfg, output_dir, ctx.cwd)
    # the user's code is part of what the tasks run: a change to it restarts them
    config_digest = _config_digest(run_config, ctx)
    # what restarts a task: the run config, but a running job of the TF1 recipes is told a new
    # trainer.max_steps (live.json) instead
    told = _max_steps_told(cfg) and target.resize_in_place
    stable_digest = (
        _config_digest({**run_config, "trainer": _without_max_steps(run_config)}, ctx)
        if told
        else config_digest
    )
    policy = job_policy(cfg)
    endpoints = _cluster_spec(slots, ports, places)
    cluster_digest = ClusterSpecText(endpoints).digest
    elastic = is_elastic(cfg, target.resize_in_place)
    # Keras only where the user's program, or code of the user's the recipes call, may use it
    keras = cfg.recipe.kind != "builtin" or bool(named_targets(cfg))
    limits = memory_limits(cfg.cluster.memory or {})
    tasks = tuple(
        _task(
            cfg,
            slot,
            places[slot.host],
            ports.get((slot.role, slot.index)),
            endpoints,
            workdir,
            output_dir,
            stable_digest,
            cluster_digest,
            elastic,
            keras,
            limits,
        )
        for slot in slots
    )
    changes = diff(
        tasks, state, policy, target, config_digest, cluster_digest, cfg.trainer.max_steps
    )
    chiefs = frozenset(
        [t.name for t in tasks if t.is_chief]
        + [t.name for t in (state.tasks if state is not None else ()) if t.is_chief]
    )
    changes = with_costs(
        changes,
        chiefs,
        cfg.algo.name,
        cfg.recipe.kind == "builtin",
        checkpoint_step,
        resize_blocker(cfg, target.resize_in_place),
    )
    changes, left_out = _narrow(changes, targets, tasks, state)
    return Plan(
        experiment_id=cfg.experiment.id,
        cluster_name=cfg.cluster.name,
        backend=target.backend,
        hosts=hosts,
        tasks=tasks,
        changes=changes,
        run_config=run_config,
        config_digest=config_digest,
        output_dir=output_dir,
        code_dir=posixpath.join(workdir, "_code"),
        builtin_recipes=cfg.recipe.kind == "builtin",
        tf_version=ctx.tf_version,
        policy=policy,
        sharding=preview_sharding(cfg.model, cfg.data, counts.ps),
        warnings=(
            _warnings(cfg, ports)
            + memory_warnings(limits, cfg.cluster.chief is ChiefMode.worker0, counts.workers)
            + _down_warnings(down)
            + _launch_warnings(cfg, tasks, ClusterSpecText(endpoints))
            + (_target_warnings(changes, tasks, state) if targets else ())
        ),
        state_lineage=state.lineage if state is not None else None,
        state_serial=state.serial if state is not None else 0,
        source_config=_source_config(cfg, ctx, output_dir, workdir),
        command_template=_command_template(cfg, places),
        cluster_digest=cluster_digest,
        targets=tuple(targets),
        left_out=left_out,
        output_mode=cfg.cluster.output_mode,
        user_code=ctx.user_code,
        elastic=elastic,
    )


def _command_template(cfg: Config, places: Sequence[Place]) -> tuple[str, ...]:
    """The user's command for backends that fill it in once the hosts are known, with
    ``{python}`` already filled where every place has the same interpreter."""
    if cfg.recipe.kind != "command":
        return ()
    words = split_command(cfg.recipe.command or "")
    pythons = {p.python for p in places}
    return with_python(words, pythons.pop()) if len(pythons) == 1 else words


def _evaluator_with_chief(output_mode: str, places: Sequence[Place]) -> str:
    """Where hosts may not share the output folder, the evaluator must read the chief's
    checkpoints on the chief's own host (per_host: required; auto: while there is room)."""
    if output_mode == "shared" or len(places) < 2:
        return ""
    return "require" if output_mode == "per_host" else "prefer"


def _narrow(
    changes: tuple[Change, ...],
    targets: Sequence[str],
    tasks: tuple[Task, ...],
    state: State | None,
) -> tuple[tuple[Change, ...], dict[str, int]]:
    """-target: keep the targeted tasks' changes; count the others' by action (left out)."""
    if not targets:
        return changes, {}
    current = [t.name for t in state.tasks] if state is not None else []
    selected = resolve_targets(targets, [*(t.name for t in tasks), *current])
    kept = tuple(c for c in changes if c.task in selected)
    left = Counter(
        c.action.value for c in changes if c.task not in selected and c.action is not Action.NOOP
    )
    return kept, dict(left)


def _target_warnings(
    kept: tuple[Change, ...], tasks: tuple[Task, ...], state: State | None
) -> tuple[str, ...]:
    """Unlike Terraform, -target pulls in no dependencies (a worker targeted alone must not
    start a ps on every host); say when the targeted tasks will start without their ps."""
    starting = {c.task for c in kept if c.action in (Action.CREATE, Action.REPLACE)}
    if not starting or all(n.startswith("ps/") for n in starting):
        return ()
    running = {t.name for t in state.running} if state is not None else set()
    missing = [
        t.name
        for t in tasks
        if t.role is Role.PS and t.name not in running and t.name not in starting
    ]
    if not missing:
        return ()
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return (
        f"-target: {shown} (parameter servers the targeted tasks need) neither run nor are "
        "targeted: the targeted tasks will wait for them; add -target ps to start them too",
    )


def job_policy(cfg: Config) -> JobPolicy:
    """The typed lifecycle policy of the config (validated)."""
    life = cfg.lifecycle
    restart = life.restart
    algorithm = ALGORITHMS.get(cfg.algo.name) if cfg.recipe.kind == "builtin" else None

    def role(name: str) -> TaskPolicy:
        hangs = name in (Role.CHIEF.value, Role.WORKER.value)
        return TaskPolicy(
            restart=RestartPolicy(str(getattr(restart, name))),
            backoff_limit=restart.backoff_limit,
            backoff_secs=float(restart.backoff_secs),
            progress_timeout_secs=(
                float(life.progress_timeout_secs)
                if hangs and life.progress_timeout_secs is not None
                else None
            ),
        )

    return JobPolicy(
        on_chief_failure=ChiefFailure(life.on_chief_failure),
        ps_grace_secs=float(life.ps_grace_secs),
        evaluator_grace_secs=float(life.evaluator_grace_secs),
        stop_grace_secs=float(life.stop_grace_secs),
        deadline_secs=None if life.deadline_secs is None else float(life.deadline_secs),
        host_timeout_secs=float(life.host_timeout_secs),
        on_host_failure=HostFailure(life.on_host_failure),
        roles={r.value: role(r.value) for r in Role},
        restart_together=algorithm is not None and algorithm.collective,
        retry_exit_codes=algorithm.retry_exit_codes if algorithm is not None else (),
        ps_standby=(
            algorithm is not None and algorithm.ps_standby
            if life.ps_standby is None
            else bool(life.ps_standby)
        ),
    )


def _per_task_placement(
    topology: Topology, counts: RoleCounts
) -> tuple[tuple[Place, ...], tuple[Slot, ...], dict[tuple[Role, int], int]]:
    """One place per task, named after it (Kubernetes pods), all on the same port."""
    per_task = topology.per_task
    assert per_task is not None
    order: list[tuple[Role, int]] = (
        [(Role.PS, i) for i in range(counts.ps)]
        + ([(Role.CHIEF, 0)] if counts.chief else [])
        + [(Role.WORKER, i) for i in range(counts.workers)]
        + ([(Role.EVALUATOR, 0)] if counts.evaluator else [])
    )
    places: list[Place] = []
    slots: list[Slot] = []
    ports: dict[tuple[Role, int], int] = {}
    for position, (role, index) in enumerate(order):
        trains = role in (Role.CHIEF, Role.WORKER)
        gpus = per_task.gpus if trains else 0
        fill = {"role": role.value, "index": index}
        places.append(
            Place(
                name=per_task.name.format(**fill),
                address=per_task.address.format(**fill),
                cpu_slots=1,
                gpus=gpus,
                python=per_task.python,
            )
        )
        slots.append(Slot(role, index, position, tuple(str(g) for g in range(gpus))))
        if role is not Role.EVALUATOR:
            ports[(role, index)] = per_task.port
    return tuple(places), tuple(slots), ports


def _unreachable_hosts(state: State | None) -> frozenset[str]:
    """Hosts the refreshed state could not reach: nothing new is placed there."""
    if state is None:
        return frozenset()
    return frozenset(t.planned_host for t in state.tasks if t.status is TaskStatus.UNREACHABLE)


def _down_warnings(down: frozenset[str]) -> tuple[str, ...]:
    return tuple(
        f"host {name} is unreachable: its tasks are placed on the other hosts, and since the "
        "cluster spec changes every task restarts from the last checkpoint"
        for name in sorted(down)
    )


def _source_config(cfg: Config, ctx: PlanContext, output_dir: str, workdir: str) -> dict[str, Any]:
    config = plain(cfg)
    config["cluster"]["output_dir"] = output_dir
    config["cluster"]["workdir"] = workdir
    context = {**dataclasses.asdict(ctx), "user_code": [c.to_dict() for c in ctx.user_code]}
    return {"config": config, "context": context}


def _held_ports(
    slots: tuple[Slot, ...], live: list[TaskRecord], position: Mapping[str, int]
) -> dict[int, frozenset[int]]:
    """Ports of running tasks that no desired task keeps (destroyed, or moving to another host):
    they stay bound until apply stops those tasks, so no new task may be given them."""
    desired = {(f"{s.role.value}/{s.index}", s.host) for s in slots}
    held: dict[int, set[int]] = {}
    for task in live:
        where = position.get(task.planned_host, -1)
        if task.port and where >= 0 and (task.name, where) not in desired:
            held.setdefault(where, set()).add(task.port)
    return {where: frozenset(ports) for where, ports in held.items()}


def _cluster_spec(
    slots: tuple[Slot, ...], ports: Mapping[tuple[Role, int], int], places: tuple[Place, ...]
) -> dict[str, list[str]]:
    """job -> endpoints; a place whose address is known only after apply is named instead."""
    spec: dict[str, list[str]] = {}
    for slot in slots:
        if slot.role is Role.EVALUATOR:
            continue
        where = places[slot.host]
        spec.setdefault(slot.role.value, []).append(
            f"{where.address or where.name}:{ports[(slot.role, slot.index)]}"
        )
    return spec


def _data_path(path: str, cwd: str) -> str:
    """A data path or glob, absolute; ``~`` is left for the task's host to expand."""
    return path if path.startswith("~") else _absolute(path, cwd)


def _absolute(path: str, cwd: str) -> str:
    return posixpath.normpath(path if path.startswith("/") else posixpath.join(cwd, path))


def plain(value: Any) -> Any:
    """A dataclass tree as plain data (enums by value)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _run_config(cfg: Config, output_dir: str, cwd: str) -> dict[str, Any]:
    """What every task reads as run.yaml (docs/contract.md). The data's paths are made absolute
    against the directory tfplan runs in, as output_dir is: a task runs in its own workdir."""
    data = plain(cfg.data)
    for key in ("train", "eval"):
        value = data.get(key)
        if isinstance(value, str):
            data[key] = _data_path(value, cwd)
        elif isinstance(value, list):
            data[key] = [_data_path(str(v), cwd) for v in value]
    if data.get("path"):
        data["path"] = _data_path(str(data["path"]), cwd)
    return {
        "experiment": {"id": cfg.experiment.id},
        "output_dir": output_dir,
        "algo": plain(cfg.algo),
        "model": plain(cfg.model),
        "data": data,
        "trainer": plain(cfg.trainer),
        # read by the TF1 recipes' chief and ps (recipes/ps_snapshots.py)
        "snapshots": {
            "secs": float(cfg.lifecycle.snapshot_secs),
            "folder": cfg.lifecycle.snapshot_dir,
            "copies": bool(cfg.lifecycle.snapshot_copies),
            "deltas": bool(cfg.lifecycle.snapshot_deltas),
        },
    }


def _config_digest(run_config: dict[str, Any], ctx: PlanContext) -> str:
    # the user's code is part of what the tasks run: a change to it restarts them
    return _digest([run_config, [c.digest for c in ctx.user_code]] if ctx.user_code else run_config)


def _max_steps_told(cfg: Config) -> bool:
    """A running job of these recipes reads a new trainer.max_steps from live.json (the TF1
    replicas: not the TF2 strategies, allreduce and pss)."""
    return cfg.recipe.kind == "builtin" and cfg.algo.name not in TF2_STRATEGIES


def _without_max_steps(run_config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run_config["trainer"].items() if k != "max_steps"}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _task(
    cfg: Config,
    slot: Slot,
    where: Place,
    port: int | None,
    endpoints: dict[str, list[str]],
    workdir: str,
    output_dir: str,
    config_digest: str,
    cluster_digest: str,
    elastic: bool = False,
    keras: bool = True,
    limits: Mapping[str, int | None] | None = None,
) -> Task:
    name = f"{slot.role.value}/{slot.index}"
    task_dir = posixpath.join(workdir, f"{slot.role.value}-{slot.index}")
    run_yaml = posixpath.join(task_dir, "run.yaml")
    is_chief = slot.role is Role.CHIEF or (
        cfg.cluster.chief is ChiefMode.worker0 and slot.role is Role.WORKER and slot.index == 0
    )
    command = task_command(
        cfg, slot.role.value, slot.index, endpoints, where, port, is_chief, output_dir, run_yaml
    )
    env = {
        **_QUIET_ENV,
        **({"TF_USE_LEGACY_KERAS": "1"} if cfg.recipe.legacy_keras else {}),
        **dict(cfg.recipe.env or {}),
        "CUDA_VISIBLE_DEVICES": ",".join(slot.devices),
        "PYTHONPATH": posixpath.join(workdir, "_code"),
        "TFPLAN_TASK": name,
        "TFPLAN_OUTPUT_DIR": output_dir,
        "TFPLAN_RUN_CONFIG": run_yaml,
    }
    _check_startable(name, command, env)
    memory_limit = (limits or {}).get(memory_key(slot.role.value, is_chief))
    restart_relevant: dict[str, Any] = {
        "host": where.name,
        "address": where.address,
        "port": port,
        "devices": list(slot.devices),
        "command": list(command),
        "env": env,
        "config_digest": config_digest,
        # TF_CONFIG is the cluster spec plus the task's own type and index (TFPLAN_TASK); an
        # elastic job's task depends only on the ps, the chief and itself (planning/resize.py)
        "cluster": (
            membership_digest(endpoints, slot.role.value, slot.index) if elastic else cluster_digest
        ),
    }
    if memory_limit is not None:  # only when set: a task without one keeps its fingerprint
        restart_relevant["memory_limit"] = memory_limit
    return Task(
        role=slot.role,
        index=slot.index,
        host=where.name,
        port=port,
        devices=slot.devices,
        command=command,
        env=env,
        workdir=task_dir,
        log_path=posixpath.join(task_dir, "task.log"),
        is_chief=is_chief,
        fingerprint=_digest(restart_relevant),
        keras=keras,
        memory_limit=memory_limit,
    )


def _warnings(cfg: Config, ports: Mapping[tuple[Role, int], int]) -> tuple[str, ...]:
    used = sorted(set(ports.values()))
    warnings = []
    if used and not getattr(cfg.cluster, "firewall", False):
        span = f"ports {used[0]}-{used[-1]}" if len(used) > 1 else f"port {used[0]}"
        warnings.append(GRPC_WARNING.format(ports=span))
    if cfg.trainer.checkpoint_steps is None and cfg.trainer.checkpoint_secs is None:
        warnings.append(
            "trainer.checkpoint_steps and trainer.checkpoint_secs are both null: no checkpoints, so "
            "a parameter server that dies takes all training progress with it"
        )
    return tuple(warnings)


def _check_startable(name: str, command: tuple[str, ...], env: Mapping[str, str]) -> None:
    """Refuse what could never start: Linux's execve takes no single argument or environment
    string over MAX_ARG_STRLEN (128 KiB). TF_CONFIG is not among them: it is delivered through
    a file when it is too large (tfplan.backends.delivery)."""
    for position, word in enumerate(command):
        if len(word) * 4 < MAX_ARG_STRLEN:  # UTF-8 takes at most 4 bytes a character
            continue
        size = len(word.encode()) + 1
        if size > MAX_ARG_STRLEN:
            raise ConfigError(
                "recipe.command",
                f"argument {position} of {name}'s command is {size} bytes once its "
                f"placeholders are filled in ({word[:40]}...), over Linux's limit of "
                f"{MAX_ARG_STRLEN} bytes for one argument: the task could never start",
                "on a cluster this large, read the hosts from TF_CONFIG instead of {ps_hosts} "
                "and {worker_hosts}",
            )
    for key, value in env.items():
        if (len(key) + len(value)) * 4 < MAX_ARG_STRLEN:
            continue
        size = len(key.encode()) + len(value.encode()) + 2
        if size > MAX_ARG_STRLEN:
            raise ConfigError(
                f"recipe.env.{key}",
                f"{size} bytes, over Linux's limit of {MAX_ARG_STRLEN} bytes for one "
                "environment variable: the task could never start",
                "pass it in a file instead",
            )


# A command word this large is copied into every task: the plan grows with tasks squared.
LARGE_WORD = 4096


def _launch_warnings(
    cfg: Config, tasks: tuple[Task, ...], text: ClusterSpecText
) -> tuple[str, ...]:
    """What the size of the cluster means for starting a user's command."""
    if cfg.recipe.kind != "command" or not tasks:
        return ()
    warnings = []
    first = tasks[0]
    largest = max(len(word) for word in first.command)
    if largest > LARGE_WORD:
        warnings.append(
            f"recipe.command: its host-list placeholders make every task's command "
            f"{largest // 1024} KiB, so the plan and the state grow with the square of the "
            "cluster; read the hosts from TF_CONFIG instead"
        )
    size = max(text.size(t.role.value, t.index) for t in (tasks[0], tasks[-1]))
    if size > ENV_VALUE_LIMIT and not is_python(first.command[0]):
        warnings.append(
            f"recipe.command: {first.command[0]!r} is not a Python interpreter, and TF_CONFIG "
            f"({size // 1024} KiB) is over Linux's 128 KiB limit for one environment "
            "variable: the tasks get TF_CONFIG_FILE, the path of a file holding it, instead. "
            "Read TF_CONFIG from that file, or start the program as `python script.py` "
            "(tfplan then sets TF_CONFIG inside it)"
        )
    return tuple(warnings)
