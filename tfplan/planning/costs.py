"""Pure: what each change costs a running job, so a person can choose before applying.

A task that is replaced or destroyed while the job trains costs either a rollback (every task
resumes from the last checkpoint: a parameter server's restart, where the chief restores every
variable; an all-reduce group restarting together; ParameterServerStrategy's coordinator) or
nothing (a worker or a chief rejoins at the current global step; the evaluator only reads
checkpoints). A change of the number of workers says how it happens: in place (workers join and
leave, nothing else restarts) or, with the reason (:mod:`tfplan.planning.resize`), by
restarting what runs.

Only the built-in recipes' costs are judged: what a user's program does on a restart is its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tfplan.config.algorithms import ALGORITHMS
from tfplan.planning.plan import Action, Change

__all__ = ["job_cost", "with_costs"]

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
    resize_blocker: str | None,
) -> tuple[Change, ...]:
    """``changes`` with the cost of every replace or destroy of a running task; when the
    number of workers of a running job changes, how: in place (workers join or leave, nothing
    else restarts) or, with ``resize_blocker``'s reason, by restarting what runs.

    Args:
        chiefs: the names of the tasks that are (or were) the chief.
        algo: ``algo.name``.
        builtin: the built-in recipes run (a user's program is not judged).
        checkpoint_step: the global step of the job's last checkpoint, read from its output
            folder; 0 when there is none yet; None when it cannot be read here.
        resize_blocker: why workers cannot join or leave this job in place; None when they can
            (:func:`tfplan.planning.resize.resize_blocker`).
    """
    running = any(c.previous.get("status") == "running" for c in changes)
    workers_changed = running and any(
        c.task.startswith("worker/") and c.action in (Action.CREATE, Action.DESTROY)
        for c in changes
    )
    # a ps or the chief that is down or restarts: the resize goes with that restart, not in place
    core = [
        c.task
        for c in changes
        if (c.task.startswith("ps/") or c.task in chiefs)
        and c.action in (Action.REPLACE, Action.DESTROY)
    ]
    if workers_changed and resize_blocker is None and core:
        resize_blocker = (
            f"{', '.join(core)} restart(s), and the resize goes with it (workers join and "
            "leave in place only while every ps and the chief keep running)"
        )
        changes = [_joins_the_restart(c) for c in changes]
    out = []
    for change in changes:
        if workers_changed and resize_blocker is None and change.task.startswith("worker/"):
            if change.action is Action.CREATE:
                change = dataclasses.replace(
                    change,
                    reasons=("joins the running job at its current global step (in place)",),
                )
            elif change.action is Action.DESTROY:
                change = dataclasses.replace(
                    change,
                    reasons=(
                        *change.reasons,
                        "leaves in place: asked to stop after its next push (SIGUSR2), it sends "
                        "its done token and exits",
                    ),
                )
        if change.action is Action.REPLACE and workers_changed and resize_blocker:
            change = dataclasses.replace(
                change, reasons=(*change.reasons, f"not in place: {resize_blocker}")
            )
        # a ps that is down while the job runs: its restart rolls the job back all the same
        down_ps = running and change.task.startswith("ps/") and change.action is Action.REPLACE
        running_task = change.previous.get("status") == "running" or down_ps
        if not builtin or not running_task or change.action not in (Action.REPLACE, Action.DESTROY):
            out.append(change)
            continue
        role = change.task.split("/", 1)[0]
        if change.action is Action.DESTROY and role in ("worker", "evaluator"):
            cost = f"{NO_ROLLBACK}: the job goes on without it"
        else:
            cost = _cost(role, change.task in chiefs, algo, checkpoint_step)
        out.append(dataclasses.replace(change, cost=cost))
    return tuple(out)


def _joins_the_restart(change: Change) -> Change:
    if change.action is Action.CREATE and change.task.startswith("worker/"):
        return dataclasses.replace(change, reasons=("starts with the restarted job",))
    return change


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
