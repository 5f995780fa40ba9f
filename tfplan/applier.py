"""Apply a saved Plan: stop what must go, preflight the hosts, ship code and configs, start tasks.

Exactly the saved plan is executed; nothing is re-planned. Every started task is written to the
state at once (atomically), so a crash of tfplan itself never loses a PID. A failure part-way
stops what this apply started and raises :class:`ApplyError` naming each host's problem.
"""

from __future__ import annotations

import posixpath
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from tfplan.errors import ApplyError, TfplanError
from tfplan.executors import (
    LaunchSpec,
    PreflightRequest,
    PreflightResult,
    raise_for_preflight,
    run_on_hosts,
)
from tfplan.hosts import HostPool
from tfplan.plan import Action, HostSpec, Plan, Task
from tfplan.state import State, StateStore, TaskState, check_plan_is_current

__all__ = ["ApplyResult", "apply_plan", "stop_tasks", "RECIPES_DIR"]

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"

Say = Callable[[str], None]


@dataclass(frozen=True)
class ApplyResult:
    state: State
    started: tuple[str, ...]
    stopped: tuple[str, ...]
    updated: tuple[str, ...]


def apply_plan(plan: Plan, store: StateStore, pool: HostPool, say: Say) -> ApplyResult:
    """Carry out ``plan``; the caller holds ``store.lock()``.

    Raises:
        StaleStateError: the state moved on since the plan was made.
        PreflightError: a host is not ready; nothing was started.
        ApplyError: a task failed to start; what this apply started has been stopped.
    """
    current = store.load()
    check_plan_is_current(plan.state_lineage, plan.state_serial, current)
    state = current if current is not None else State.empty()
    state = replace(
        state,
        experiment_id=plan.experiment_id,
        cluster_name=plan.cluster_name,
        output_dir=plan.output_dir,
        hosts=_merged_hosts(state, plan),
        config=plan.source_config,
    )
    by_action = {c.task: c.action for c in plan.changes}
    unreachable = {c.task for c in plan.changes if c.previous.get("status") == "unreachable"}
    to_stop = [t for t in state.tasks if by_action.get(t.name) in (Action.DESTROY, Action.REPLACE)]
    state = _abandon([t for t in to_stop if t.name in unreachable], state, say)
    to_stop = [t for t in to_stop if t.name not in unreachable]
    state = stop_tasks(state, to_stop, store, pool, say, forget=True)
    to_start = [t for t in plan.tasks if by_action.get(t.name) in (Action.CREATE, Action.REPLACE)]
    updated = [t for t in plan.tasks if by_action.get(t.name) is Action.UPDATE]
    for task in updated:
        old = state.task(task.name)
        if old is not None:
            state = state.with_task(replace(old, settings=dict(task.settings)))
    state = store.write(replace(state, hosts=plan.hosts))
    if to_start:
        _preflight(plan, to_start, pool, say)
        _ship(plan, to_start, pool, say)
        state = _start_all(plan, to_start, state, store, pool, say)
    return ApplyResult(
        state=state,
        started=tuple(t.name for t in to_start),
        stopped=tuple(t.name for t in to_stop),
        updated=tuple(t.name for t in updated),
    )


def _abandon(tasks: list[TaskState], state: State, say: Say) -> State:
    """Tasks on hosts tfplan cannot reach: keep them in ``state.lost`` so that a later
    ``tfplan destroy`` stops them once their host is back."""
    for task in tasks:
        say(
            f"{task.name}: host {task.host} is unreachable; pid {task.pid} may still run there "
            "(`tfplan destroy` stops it once the host is back)"
        )
        state = replace(state.without_task(task.name), lost=(*state.lost, task))
    return state


def _merged_hosts(state: State, plan: Plan) -> tuple[HostSpec, ...]:
    hosts = {h.name: h for h in state.hosts}
    hosts.update({h.name: h for h in plan.hosts})
    return tuple(hosts.values())


def _preflight(plan: Plan, tasks: list[Task], pool: HostPool, say: Say) -> None:
    hosts = sorted({t.host for t in tasks})
    say(f"Preflight on {len(hosts)} host(s): {', '.join(hosts)}")
    marker = uuid.uuid4().hex

    def check(name: str) -> PreflightResult:
        mine = [t for t in tasks if t.host == name]
        request = PreflightRequest(
            tf_version=plan.tf_version if _needs_tf(plan) else None,
            ports=tuple(t.port for t in mine if t.port is not None),
            writable_dirs=(*(t.workdir for t in mine), plan.code_dir, plan.output_dir),
            shared_dir=plan.output_dir if len(hosts) > 1 else None,
            marker_token=marker,
        )
        return pool[name].preflight(request)

    raise_for_preflight(run_on_hosts({h: h for h in hosts}, check))


def _needs_tf(plan: Plan) -> bool:
    return "recipes.train" in " ".join(plan.tasks[0].command) if plan.tasks else False


def _ship(plan: Plan, tasks: list[Task], pool: HostPool, say: Say) -> None:
    """Copy the recipes package to every host, and each task's run.yaml to its workdir."""
    run_yaml = yaml.safe_dump(plan.run_config, sort_keys=True).encode()
    hosts = sorted({t.host for t in tasks})

    def ship(name: str) -> None:
        executor = pool[name]
        if _needs_tf(plan):
            executor.put_tree(RECIPES_DIR, posixpath.join(plan.code_dir, "recipes"))
        for task in (t for t in tasks if t.host == name):
            executor.write_file(posixpath.join(task.workdir, "run.yaml"), run_yaml)

    results = run_on_hosts({h: h for h in hosts}, ship)
    failures = {h: str(r) for h, r in results.failed.items()}
    if failures:
        detail = "; ".join(f"{h}: {why}" for h, why in sorted(failures.items()))
        raise ApplyError(f"could not copy the code and run config: {detail}")


def _start_all(
    plan: Plan, tasks: list[Task], state: State, store: StateStore, pool: HostPool, say: Say
) -> State:
    started: list[TaskState] = []
    for task in tasks:
        try:
            launched = pool[task.host].start(
                LaunchSpec(
                    name=task.name,
                    command=task.command,
                    env=dict(task.env),
                    workdir=task.workdir,
                    log_path=task.log_path,
                )
            )
        except TfplanError as error:
            say(f"{task.name}: failed to start on {task.host}: {error}")
            state = stop_tasks(state, started, store, pool, say, forget=True)
            raise ApplyError(
                f"{task.name} could not start on host {task.host} ({error}); stopped the "
                f"{len(started)} task(s) this apply had started"
            ) from error
        record = TaskState.from_task(
            task, pid=launched.pid, pgid=launched.pgid, started_at=launched.started_at
        )
        started.append(record)
        state = store.write(state.with_task(record))
        say(f"{task.name}: started on {task.host} (pid {launched.pid})")
    return state


def stop_tasks(
    state: State,
    tasks: list[TaskState],
    store: StateStore,
    pool: HostPool,
    say: Say,
    forget: bool,
    grace_secs: float | None = None,
) -> State:
    """Stop ``tasks`` by process group (TERM, then KILL after the grace period), in parallel
    per host; write the state after each host.

    Args:
        forget: drop the tasks from the state (destroy/replace) rather than mark them stopped.

    Raises:
        ApplyError: a task could not be confirmed stopped (its host is unreachable); the state
            keeps it so that a later destroy can try again.
    """
    if not tasks:
        return state

    def stop_one(task: TaskState) -> str:
        grace = (
            grace_secs
            if grace_secs is not None
            else float(task.settings.get("stop_grace_secs", "5"))
        )
        if task.status == "running":
            pool[task.host].stop(task.pid, task.pgid, grace)
        return task.name

    # Every task is signalled at once, so the grace periods overlap instead of adding up.
    started = time.monotonic()
    results = run_on_hosts({t.name: t for t in tasks}, stop_one)
    failures: dict[str, str] = {}
    for name, result in results.items():
        old = state.task(name)
        if isinstance(result, BaseException):
            failures[f"{name} on {old.host if old else '?'}"] = str(result)
            continue
        if old is None:
            continue
        if forget:
            state = state.without_task(name)
        elif old.status == "running":
            state = state.with_task(replace(old, status="stopped"))
    state = store.write(state)
    was_running = {t.name for t in tasks if t.status == "running"}
    names = ", ".join(
        n for n, r in results.items() if not isinstance(r, BaseException) and n in was_running
    )
    if names:
        say(f"Stopped {names} ({time.monotonic() - started:.1f}s)")
    if failures:
        detail = "; ".join(f"{h}: {why}" for h, why in sorted(failures.items()))
        raise ApplyError(f"could not stop every task: {detail}; run `tfplan destroy` again")
    return state
