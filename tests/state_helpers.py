"""Build states the way apply would record them, for tests of the planner and the renderer."""

from __future__ import annotations

from dataclasses import replace

from tfplan.planning.plan import Plan
from tfplan.planning.state import State, TaskRecord, TaskStatus


def records(plan: Plan, status: str = "running", first_pid: int = 1000) -> tuple[TaskRecord, ...]:
    """Every task of ``plan`` as started on its planned host (process backend handles)."""
    return tuple(
        replace(
            TaskRecord.from_task(
                t,
                plan,
                {"pid": first_pid + i, "pgid": first_pid + i},
                0.0,
                host=t.host,
                address=plan.address_of(t),
            ),
            status=TaskStatus(status),
        )
        for i, t in enumerate(plan.tasks)
    )


def state_from(
    plan: Plan, status: str = "running", serial: int = 3, lineage: str = "lineage-1"
) -> State:
    """A state in which every task of ``plan`` runs (or ended) exactly as planned."""
    return State(
        lineage=lineage,
        serial=serial,
        experiment_id=plan.experiment_id,
        cluster_name=plan.cluster_name,
        output_dir=plan.output_dir,
        tasks=records(plan, status),
        backend=plan.backend,
        policy=plan.policy,
    )
