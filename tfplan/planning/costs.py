"""Pure: what each change costs a running job, so a person can choose before applying.

A task that is replaced or destroyed while the job trains costs either a rollback (every task
resumes from the last checkpoint: a parameter server's restart, where the chief restores every
variable; an all-reduce group restarting together; ParameterServerStrategy's coordinator) or
nothing (a worker or a chief rejoins at the current global step; the evaluator only reads
checkpoints). A change of the number of workers that restarts the running tasks also says why
it cannot happen in place (the synchronous algorithms aggregate a fixed number of replicas; the
TF2 strategies fix their cluster when they start).

Only the built-in recipes are judged: what a user's program does on a restart is its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tfplan.config.algorithms import ALGORITHMS
from tfplan.planning.plan import Action, Change

__all__ = ["RESIZE_FIXED", "job_cost", "with_costs"]

# Why a running job of these algorithms cannot take a new number of workers in place.
RESIZE_FIXED = {
    "sync": "sync aggregates a fixed number of replicas each step (replicas_to_aggregate)",
    "sync_lr": "sync_lr aggregates a fixed number of replicas each step",
    "sagn": "sagn aggregates a fixed number of replicas each round",
    "allreduce": "allreduce's collective group is fixed when it starts",
    "pss": "ParameterServerStrategy's coordinator fixes its cluster when it starts",
    "multi_gpu": "multi_gpu's replicas are fixed when it starts",
}

NO_ROLLBACK = "no rollback"


def rollback_text(checkpoint_step: int | None) -> str:
    if checkpoint_step is None:
        return "rolls back to the last checkpoint"
    if checkpoint_step == 0:
        return "rolls back to step 0 (no checkpoint yet)"
    return f"rolls back to checkpoint step {checkpoint_step}"


def _cost(role: str, is_chief: bool, algo: str, checkpoint_step: int | None) -> str:
    """The cost of restarting (or removing) one running task of the built-in recipes."""
    spec = ALGORITHMS.get(algo)
    back = rollback_text(checkpoint_step)
    if role == "ps":
        return f"{back}: a parameter server restarts empty and the chief restores every variable"
    if role == "evaluator":
        return f"{NO_ROLLBACK}: the evaluator only reads checkpoints"
    if spec is not None and spec.collective:
        return f"{back}: the all-reduce group restarts together"
    if spec is not None and spec.chief and is_chief:
        return f"{back}: the coordinator restarts the job"
    if is_chief:
        return f"{NO_ROLLBACK}: the chief rejoins at the current global step"
    return f"{NO_ROLLBACK}: a worker rejoins at the current global step"


def with_costs(
    changes: Sequence[Change],
    chiefs: frozenset[str],
    algo: str,
    builtin: bool,
    checkpoint_step: int | None,
) -> tuple[Change, ...]:
    """``changes`` with the cost of every replace or destroy of a running task, and, when the
    number of workers changes and restarts what runs, why it cannot happen in place.

    Args:
        chiefs: the names of the tasks that are (or were) the chief.
        algo: ``algo.name``.
        builtin: the built-in recipes run (a user's program is not judged).
        checkpoint_step: the global step of the job's last checkpoint, read from its output
            folder; 0 when there is none yet; None when it cannot be read here.
    """
    if not builtin:
        return tuple(changes)
    workers_changed = any(
        c.task.startswith("worker/") and c.action in (Action.CREATE, Action.DESTROY)
        for c in changes
    )
    fixed = RESIZE_FIXED.get(algo) if workers_changed else None
    out = []
    for change in changes:
        if change.action not in (Action.REPLACE, Action.DESTROY):
            out.append(change)
            continue
        if change.previous.get("status") != "running":
            out.append(change)
            continue
        role = change.task.split("/", 1)[0]
        if change.action is Action.DESTROY and role in ("worker", "evaluator"):
            cost = f"{NO_ROLLBACK}: the job goes on without it"
        else:
            cost = _cost(role, change.task in chiefs, algo, checkpoint_step)
        reasons = change.reasons
        if fixed and change.action is Action.REPLACE:
            reasons = (*reasons, f"not in place: {fixed}")
        out.append(dataclasses.replace(change, reasons=reasons, cost=cost))
    return tuple(out)


def job_cost(changes: Sequence[Change]) -> str | None:
    """One line for the whole plan: the worst cost of its changes, with the tasks it comes
    from; None when no change touches a running task."""
    costed = [c for c in changes if c.cost]
    if not costed:
        return None
    rollbacks = [c for c in costed if not c.cost.startswith(NO_ROLLBACK)]
    if rollbacks:
        first = rollbacks[0].cost.split(":", 1)[0]
        names = ", ".join(c.task for c in rollbacks[:4]) + (", ..." if len(rollbacks) > 4 else "")
        return f"The running job {first} (because of {names})."
    return (
        f"The running job keeps its global step: {NO_ROLLBACK} ({len(costed)} running "
        "task(s) stop or restart)."
    )
