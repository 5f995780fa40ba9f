"""Workers join and leave a running elastic job, in place (the plan said so: ``plan.elastic``).

Nothing that keeps running restarts. Leaving workers are asked to stop after their next push
(SIGUSR2 where the backend's ``signal`` reaches the program, else their names under ``leave``
in ``live.json``: the recipes finish the step, push the window, send their done token and exit
0); one that has not left after :data:`LEAVE_SECS` is stopped as any task is, and what a left
one holds (a Kubernetes Job) is cleaned up as for a stopped task. The job's membership
(every training replica that ever took part: each sends one done token at its end) is told to
the running parameter servers and chief (``live.json`` beside their ``run.yaml``, read by
``recipes/live.py``) before new workers start, so no ps ends while a newcomer still trains.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tfplan.backends.api import Backend, TaskPhase
from tfplan.engine.store import StateStore
from tfplan.errors import TfplanError
from tfplan.planning.plan import Action, Plan
from tfplan.planning.state import State, TaskRecord, TaskStatus

__all__ = [
    "LEAVE_SECS",
    "LIVE_FILE",
    "InPlace",
    "in_place_resize",
    "leave",
    "live_values",
    "members_before",
    "tell_live",
    "told_max_steps",
]

LEAVE_SECS = 60.0  # a leaving worker finishes its step and window, then its done token
LIVE_FILE = "live.json"
TRAINING = ("chief", "worker")

Say = Callable[[str], None]


@dataclass(frozen=True)
class InPlace:
    """What an in-place resize does: the workers that leave and the number that join."""

    leaving: tuple[TaskRecord, ...]
    joining: int


def in_place_resize(plan: Plan, state: State, by_action: Mapping[str, Action]) -> InPlace | None:
    """The in-place part of applying ``plan`` to ``state``; None when the job is not kept
    running (not elastic, or a ps or the chief restarts or goes: then everything starts over)."""
    if not plan.elastic:
        return None
    core = [t for t in state.tasks if t.role == "ps" or t.is_chief]
    stays = (None, Action.NOOP, Action.UPDATE)
    if not core or not all(t.running and by_action.get(t.name) in stays for t in core):
        return None  # a ps or the chief (re)starts: the job starts over, not in place
    leaving = tuple(
        t
        for t in state.running
        if t.role == "worker" and not t.is_chief and by_action.get(t.name) is Action.DESTROY
    )
    joining = sum(
        1 for c in plan.changes if c.action is Action.CREATE and c.task.startswith("worker/")
    )
    if not leaving and not joining:
        return None
    return InPlace(leaving, joining)


def leave(
    state: State,
    tasks: Sequence[TaskRecord],
    store: StateStore,
    backend: Backend,
    say: Say,
    stop: Callable[[State, Sequence[TaskRecord]], State],
    live: Mapping[str, object] | None = None,
    leave_secs: float = LEAVE_SECS,
) -> tuple[State, int]:
    """Ask ``tasks`` to leave, wait for them, forget them. Returns the state and how many did
    not leave cleanly (no done token from them: the membership shrinks by that many).
    ``live``: what the running tasks were last told, kept beside ``leave`` where the backend
    cannot signal."""
    asked = _ask_to_leave(state, tasks, backend, say, live or {})
    pending = {t.name: t for t in asked}
    gone: list[TaskRecord] = []  # ended while leaving
    bad = len(tasks) - len(asked)
    deadline = time.monotonic() + leave_secs
    while pending and time.monotonic() < deadline:
        infos = backend.describe(list(pending.values()))
        for name, info in infos.items():
            if name in pending and info.phase.ended:
                task = pending.pop(name)
                clean = info.phase is TaskPhase.SUCCEEDED
                bad += 0 if clean else 1
                code = info.exit_code
                say(
                    f"{name} left the job (exit code {code})"
                    if clean
                    else f"{name} ended badly while leaving (exit code {code}): no done token"
                )
                gone.append(
                    replace(task, status=TaskStatus.SUCCEEDED if clean else TaskStatus.FAILED)
                )
        if pending:
            time.sleep(0.2)
    state = stop(state, gone)  # ended: nothing to stop, but what it holds is cleaned up
    if pending:
        say(f"{', '.join(pending)}: not gone after {leave_secs:.0f}s; stopping")
        state = stop(state, list(pending.values()))
        bad += len(pending)
    missed = [t for t in tasks if t.name not in {a.name for a in asked}]
    if missed:
        state = stop(state, missed)
    return state, bad


def _ask_to_leave(
    state: State,
    tasks: Sequence[TaskRecord],
    backend: Backend,
    say: Say,
    live: Mapping[str, object],
) -> list[TaskRecord]:
    """SIGUSR2 to each, or (a backend that cannot signal) their names told to every running
    task; the ones asked."""
    if not tasks:
        return []
    if not backend.capabilities.signals:
        names = sorted(t.name for t in tasks)
        try:
            backend.tell(state.running, LIVE_FILE, json.dumps({**live, "leave": names}).encode())
        except TfplanError as error:
            say(f"{', '.join(names)}: could not ask them to leave ({error}); stopping them")
            return []
        for name in names:
            say(f"{name}: asked to leave the job after its next push (told)")
        return list(tasks)
    asked: list[TaskRecord] = []
    for task in tasks:
        try:
            backend.signal(task, "USR2")
            asked.append(task)
            say(f"{task.name}: asked to leave the job after its next push")
        except TfplanError as error:
            say(f"{task.name}: could not ask it to leave ({error}); stopping it")
    return asked


def members_before(state: State) -> int:
    """The replicas that took part so far: the recorded count, or (never resized) the training
    tasks as they started."""
    if state.members:
        return state.members
    return sum(
        1
        for t in state.tasks
        if t.role in TRAINING and t.status in (TaskStatus.RUNNING, TaskStatus.SUCCEEDED)
    )


def live_values(max_steps: int, members: int) -> dict[str, object]:
    """What ``live.json`` says: the step budget and how many done tokens end the job
    (``members``; 0: as TF_CONFIG says)."""
    live: dict[str, object] = {"max_steps": max_steps}
    if members:
        live["replicas"] = members
    return live


def tell_live(
    state: State, store: StateStore, backend: Backend, plan: Plan, members: int, say: Say
) -> State:
    """Tell every running task what changed while it runs (``live.json``, see
    :func:`live_values`); record it."""
    live = live_values(int(plan.run_config["trainer"]["max_steps"]), members)
    backend.tell(state.running, LIVE_FILE, json.dumps(live).encode())
    if members and members != members_before(state):
        say(f"the job has {members} training replica(s) taking part now (told to the ps)")
    return store.write(replace(state, members=members or state.members))


def told_max_steps(plan: Plan, state: State, by_action: Mapping[str, Action]) -> list[TaskRecord]:
    """The running tasks the plan updates in place with a new ``trainer.max_steps`` (their run
    config differs, and nothing else that would restart them)."""
    return [
        t
        for t in state.running
        if by_action.get(t.name) is Action.UPDATE and t.config_digest != plan.config_digest
    ]
