"""Pure: the diff of the planned tasks against the current state, one :class:`Change` a task.

A planned task with no record in the state is created (``+``); one whose record is running with the
same fingerprint is left alone, or updated in place (``~``) when only what a running job is told
changed (the lifecycle policy, ``trainer.max_steps``); one whose definition changed, or whose
process is not running, is replaced (``-/+``, with the fields that changed as reasons); a record no
planned task has is destroyed (``-``). Two rules then apply to the whole job: an allocation asked
for differently (a Slurm job) restarts every running task, and an ended job given another number of
workers starts again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfplan.planning.memory import limit_text
from tfplan.planning.plan import Action, Change, Task
from tfplan.planning.policy import JobPolicy
from tfplan.planning.state import State, TaskRecord, TaskStatus
from tfplan.planning.topology import Target

__all__ = ["diff"]


def diff(
    tasks: tuple[Task, ...],
    state: State | None,
    policy: JobPolicy,
    target: Target,
    config_digest: str,
    cluster_digest: str,
    max_steps: int,
) -> tuple[Change, ...]:
    """The changes that take ``state`` to the planned ``tasks``.

    Args:
        tasks: the planned tasks, placed and fingerprinted.
        state: the refreshed current state, or None when nothing was applied.
        policy: the config's lifecycle policy (a change of it alone updates a running task).
        target: the backend the tasks are planned for (a new allocation restarts every task).
        config_digest: the run config's digest (a running job is told a new max_steps).
        cluster_digest: the cluster spec's digest (for the reasons of a restart).
        max_steps: the config's ``trainer.max_steps`` (said when it is told).

    Returns:
        One change per task in the union of planned and current: planned tasks in their
        order, then the current ones no longer planned (destroyed).
    """
    changes = _per_task(tasks, state, policy, config_digest, cluster_digest, max_steps)
    changes = _new_allocation(changes, state, target)
    return _ended_resize(changes, state)


def _per_task(
    tasks: tuple[Task, ...],
    state: State | None,
    policy: JobPolicy,
    config_digest: str,
    cluster_digest: str,
    max_steps: int,
) -> tuple[Change, ...]:
    """Each planned task against its record in the state; a record no task has is destroyed."""
    current = {t.name: t for t in state.tasks} if state is not None else {}
    old_policy = state.policy if state is not None else policy
    told = (
        f"trainer.max_steps: {_old_max_steps(state)} -> {max_steps}, told to the running task "
        "(no restart, no rollback)"
    )
    changes = [
        _change(
            task, current.get(task.name), old_policy, policy, config_digest, cluster_digest, told
        )
        for task in tasks
    ]
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


def _old_max_steps(state: State | None) -> Any:
    trainer = ((state.config if state is not None else {}).get("config") or {}).get("trainer")
    return (trainer or {}).get("max_steps", "?")


def _ended_resize(changes: tuple[Change, ...], state: State | None) -> tuple[Change, ...]:
    """Workers cannot join a job that has ended (no ps serves them): with a new number of
    workers, an ended job starts again, every task (an elastic job's tasks would otherwise
    match, their identity leaving the workers out)."""
    resized = any(
        c.task.startswith("worker/") and c.action in (Action.CREATE, Action.DESTROY)
        for c in changes
    )
    if not resized or state is None or not state.tasks or state.running:
        return changes
    reason = "the job has ended: it starts again with the new number of workers"
    return tuple(
        dataclasses.replace(c, action=Action.REPLACE, reasons=(reason,))
        if c.action is Action.NOOP and c.previous
        else c
        for c in changes
    )


def _new_allocation(
    changes: tuple[Change, ...], state: State | None, target: Target
) -> tuple[Change, ...]:
    """Every running task restarts when the allocation it runs in is asked for differently
    (more nodes, other slots, another partition): a new allocation, the old one released."""
    if (
        target.allocates is None
        or state is None
        or state.backend is None
        or state.backend.name != target.backend.name
        or not state.running
    ):
        return changes
    changed = sorted(
        key
        for key in {*state.backend.config, *target.backend.config}
        if state.backend.config.get(key) != target.backend.config.get(key)
    )
    if not changed:
        return changes
    reason = (
        f"the {target.allocates} is asked for differently (cluster.{', cluster.'.join(changed)}): "
        f"every task restarts in a new {target.allocates}"
    )
    running = {t.name for t in state.running}
    return tuple(
        dataclasses.replace(c, action=Action.REPLACE, reasons=(*c.reasons, reason))
        if c.task in running and c.action in (Action.NOOP, Action.UPDATE, Action.REPLACE)
        else c
        for c in changes
    )


def _previous(old: TaskRecord) -> dict[str, Any]:
    return {"host": old.host, "port": old.port, "status": old.status.value}


def _change(
    task: Task,
    old: TaskRecord | None,
    old_policy: JobPolicy,
    policy: JobPolicy,
    config_digest: str,
    cluster_digest: str,
    told: str = "",
) -> Change:
    if old is None:
        return Change(task=task.name, action=Action.CREATE)
    if old.status is TaskStatus.UNREACHABLE:
        return Change(
            task=task.name,
            action=Action.REPLACE,
            reasons=(f"host {old.host} is unreachable",),
            previous=_previous(old),
        )
    if old.status not in (TaskStatus.RUNNING, TaskStatus.SUCCEEDED):
        exit_note = f", exit code {old.exit_code}" if old.exit_code is not None else ""
        return Change(
            task=task.name,
            action=Action.REPLACE,
            reasons=(f"the process is not running (status {old.status.value}{exit_note})",),
            previous=_previous(old),
        )
    if old.fingerprint != task.fingerprint:
        return Change(
            task=task.name,
            action=Action.REPLACE,
            reasons=_restart_reasons(task, old, config_digest, cluster_digest),
            previous=_previous(old),
        )
    changed = list(policy.changes_from(old_policy, task.role.value))
    if old.config_digest != config_digest:  # the fingerprint leaves out what a job is told
        if old.status is not TaskStatus.RUNNING:  # a finished job trains again, from its checkpoint
            return Change(
                task=task.name,
                action=Action.REPLACE,
                reasons=("the run config changed",),
                previous=_previous(old),
            )
        changed.append(told)
    if changed:
        return Change(
            task=task.name, action=Action.UPDATE, reasons=tuple(changed), previous=_previous(old)
        )
    return Change(task=task.name, action=Action.NOOP, previous=_previous(old))


def _restart_reasons(
    task: Task, old: TaskRecord, config_digest: str, cluster_digest: str
) -> tuple[str, ...]:
    """Which restart-relevant fields changed, each as ``field: old -> new``."""
    reasons = []
    if old.planned_host != task.host:
        reasons.append(f"host: {old.planned_host} -> {task.host}")
    for name, before, after in (
        ("port", old.port, task.port),
        ("devices", list(old.devices), list(task.devices)),
        ("command", list(old.command), list(task.command)),
    ):
        if before != after:
            reasons.append(f"{name}: {_short(before)} -> {_short(after)}")
    if old.memory_limit != task.memory_limit:
        reasons.append(f"memory: {limit_text(old.memory_limit)} -> {limit_text(task.memory_limit)}")
    for key in sorted({*old.env, *task.env}):
        if old.env.get(key) != task.env.get(key):
            reasons.append(f"env {key}: {_short(old.env.get(key))} -> {_short(task.env.get(key))}")
    if old.cluster_digest != cluster_digest:
        reasons.append("TF_CONFIG changed (the cluster spec is different)")
    if old.config_digest != config_digest:
        reasons.append("the run config changed")
    return tuple(reasons) or ("the task's definition changed",)


def _short(value: Any) -> str:
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."
