"""Apply a saved Plan through its backend: stop what must go, check, allocate, stage, start.

Exactly the saved plan is executed; nothing is re-planned. Every started task (and an allocation
as soon as a scheduler accepted it) is written to the state at once, atomically, so a crash of
tfplan itself never loses a handle. A failure part-way stops what this apply started, gives back
what it allocated, and raises :class:`ApplyError` naming the problem.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

from tfplan.backends.api import Backend, CancelResult
from tfplan.backends.transports.preflight import readiness_lines
from tfplan.engine.experiment import keep_logs
from tfplan.engine.launching import PlanLaunches
from tfplan.engine.resizing import (
    in_place_resize,
    leave,
    live_values,
    members_before,
    tell_live,
    told_max_steps,
)
from tfplan.engine.store import StateStore
from tfplan.errors import ApplyError, PreflightError, TfplanError
from tfplan.planning.footprint import plan_checkpoints, room_problem
from tfplan.planning.plan import Action, Plan, Task
from tfplan.planning.state import (
    Allocation,
    State,
    TaskRecord,
    TaskStatus,
    check_plan_is_current,
)

__all__ = [
    "ApplyResult",
    "Progress",
    "apply_plan",
    "release_if_idle",
    "stop_standbys",
    "stop_tasks",
]

Say = Callable[[str], None]
Progress = Callable[[int, int], None]  # (tasks started, tasks to start)


@dataclass(frozen=True)
class ApplyResult:
    state: State
    started: tuple[str, ...]
    stopped: tuple[str, ...]
    updated: tuple[str, ...]


def apply_plan(
    plan: Plan,
    store: StateStore,
    backend: Backend,
    say: Say,
    progress: Progress | None = None,
) -> ApplyResult:
    """Carry out ``plan``; the caller holds ``store.lock()``.

    ``progress(started, total)`` is called as tasks start (a progress bar's feed).

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
        backend=plan.backend,
        policy=plan.policy,
        config=plan.source_config,
    )
    by_action = {c.task: c.action for c in plan.changes}
    unreachable = {c.task for c in plan.changes if c.previous.get("status") == "unreachable"}
    to_stop = [t for t in state.tasks if by_action.get(t.name) in (Action.DESTROY, Action.REPLACE)]
    state = _abandon([t for t in to_stop if t.name in unreachable], state, say)
    to_stop = [t for t in to_stop if t.name not in unreachable]
    to_start = [t for t in plan.tasks if by_action.get(t.name) in (Action.CREATE, Action.REPLACE)]
    resize = in_place_resize(plan, state, by_action)
    told = told_max_steps(plan, state, by_action)
    if resize is not None:  # workers join and leave; the ps, the chief and their standbys stay
        leaving = {t.name for t in resize.leaving}
        to_stop = [t for t in to_stop if t.name not in leaving]

        def stop(current: State, tasks: Sequence[TaskRecord]) -> State:
            return stop_tasks(current, tasks, store, backend, say, forget=True)

        before = members_before(state)  # the leavers count: each sends its done token
        live = live_values(int(plan.run_config["trainer"]["max_steps"]), before)
        state, bad = leave(state, resize.leaving, store, backend, say, stop, live)
        state = tell_live(state, store, backend, plan, before + resize.joining - bad, say)
    elif told:
        state = tell_live(state, store, backend, plan, state.members, say)
    if told:
        say(f"trainer.max_steps is {plan.run_config['trainer']['max_steps']} now (told)")
        state = store.write(
            state.with_tasks([replace(t, config_digest=plan.config_digest) for t in told])
        )
    if resize is None and (to_stop or to_start):
        # a standby was started for the cluster as it was: the supervisor starts new ones
        state = stop_standbys(state, store, backend, say)
    state = stop_tasks(state, to_stop, store, backend, say, forget=True)
    updated = [t.name for t in plan.tasks if by_action.get(t.name) is Action.UPDATE]
    state = store.write(state)
    if state.members and any(t.role.value == "ps" for t in to_start):
        state = store.write(replace(state, members=0))  # a new ps counts as its TF_CONFIG says
    if to_start:
        for line in readiness_lines(backend.preflight(plan, to_start)):
            say(line)
        _check_checkpoint_room(plan, to_start, backend)
        state = _start_all(plan, to_start, state, store, backend, say, progress)
    return ApplyResult(
        state=state,
        started=tuple(t.name for t in to_start),
        stopped=tuple(t.name for t in to_stop),
        updated=tuple(updated),
    )


def _check_checkpoint_room(plan: Plan, tasks: Sequence[Task], backend: Backend) -> None:
    """When the chief starts: the disk of ``output_dir`` on its host has room for the kept
    checkpoints (tfplan/planning/footprint.py; a backend that cannot look says nothing).

    Raises:
        PreflightError: it has not; nothing was started.
    """
    chief = next((t for t in tasks if t.is_chief), None)
    size = plan_checkpoints(plan)
    if chief is None or size is None:
        return
    free = backend.free_bytes(chief.host, plan.output_dir)
    problem = None if free is None else room_problem(size, free, plan.output_dir, chief.host)
    if problem is not None:
        raise PreflightError({chief.host: problem})


def _abandon(tasks: list[TaskRecord], state: State, say: Say) -> State:
    """Tasks on hosts tfplan cannot reach: keep them in ``state.lost`` so that a later
    ``tfplan destroy`` stops them once their host is back."""
    for task in tasks:
        say(
            f"{task.name}: host {task.host} is unreachable; it may still run there "
            "(`tfplan destroy` stops it once the host is back)"
        )
        state = replace(state.without_task(task.name), lost=(*state.lost, task))
    return state


def _start_all(
    plan: Plan,
    tasks: list[Task],
    state: State,
    store: StateStore,
    backend: Backend,
    say: Say,
    progress: Progress | None,
) -> State:
    had_allocation = state.allocation is not None
    holder = [state]

    def submitted(allocation: Allocation) -> None:
        holder[0] = store.write(replace(holder[0], allocation=allocation))

    try:
        allocation = backend.allocate(plan, tasks, state.allocation, say, submitted)
    except BaseException:
        state = holder[0]
        if state.allocation is not None and not had_allocation:
            state = _release(state, store, backend, say)
        raise
    state = store.write(replace(holder[0], allocation=allocation))
    started: list[TaskRecord] = []
    launched: Generator[list[TaskRecord], None, None] | None = None
    try:
        for line in readiness_lines(backend.stage(plan, tasks, allocation) or ()):
            say(line)
        launches = PlanLaunches(plan, allocation)
        notes: dict[str, str] = {}
        launched = _launch_all(tasks, launches, backend, allocation, progress, notes, started)
        for batch in launched:
            state = store.write(state.with_tasks(batch))
            if len(tasks) <= TASK_LINES_UP_TO:
                for record in batch:
                    note = f"; {notes[record.name]}" if record.name in notes else ""
                    say(
                        f"{record.name}: started on {record.host} "
                        f"({backend.handle_text(record)}{note})"
                    )
        if len(tasks) > TASK_LINES_UP_TO:
            hosts = len({r.host for r in started})
            say(f"started {len(started)} tasks on {hosts} host(s)")
            for why in sorted(set(notes.values())):
                say(f"{sum(n == why for n in notes.values())} task(s): {why}")
    except BaseException as error:
        told = _unfailing(say)  # the output may be what failed (a closed pipe): clean up anyway
        if isinstance(error, TfplanError) and not isinstance(error, ApplyError):
            told(f"apply failed: {error}")
        if launched is not None:
            launched.close()  # the starts still under way end, and join ``started``
        state = stop_tasks(state, started, store, backend, told, forget=True)
        if not had_allocation:
            state = _release(state, store, backend, told)
        raise
    return state


def _unfailing(say: Say) -> Say:
    """``say`` that never raises for its output (a closed pipe, a gone terminal)."""

    def told(line: str) -> None:
        try:
            say(line)
        except (OSError, ValueError):  # BrokenPipeError; "I/O operation on closed file"
            pass

    return told


# Each started task is a line up to this many; a larger apply says one line (and the CLI
# shows a progress bar on a terminal).
TASK_LINES_UP_TO = 24


def _launch_all(
    tasks: list[Task],
    launches: PlanLaunches,
    backend: Backend,
    allocation: Allocation,
    progress: Progress | None,
    notes: dict[str, str],
    started: list[TaskRecord],
) -> Generator[list[TaskRecord], None, None]:
    """Start ``tasks``, up to the backend's ``launch_fanout`` at once, in plan order; yield
    the records of those started since the last batch (the caller records them at once).
    ``started`` gets every record, yielded or not: a caller that stops iterating (its output
    gone, Ctrl-C) closes the iterator, which waits for the starts under way, so that it can
    stop every task this apply started.

    The first failure stops further starts; what was already under way is still yielded, then
    ApplyError is raised naming the task that failed. ``notes`` gets what the backend said of
    a start (a cold start where a warm one was asked), by task name.
    """
    plan = launches.plan
    fanout = max(1, min(backend.capabilities.launch_fanout, len(tasks)))
    total = len(tasks)
    done = 0

    def one(task: Task) -> TaskRecord:
        request = launches.request(task)
        try:
            launched = backend.launch(request, allocation)
        except TfplanError as error:
            raise ApplyError(
                f"{task.name} could not start on host {task.host} ({error})"
            ) from error
        if launched.note:
            notes[task.name] = launched.note
        return TaskRecord.from_task(
            task,
            plan,
            launched.handle,
            launched.started_at,
            host=launched.host,
            address=launched.address or launches.address(task),
            command=request.command,
        )

    if progress is not None:
        progress(0, total)
    if fanout == 1:
        for task in tasks:
            try:
                record = one(task)
            except ApplyError as error:
                raise _failed(error, done) from error
            started.append(record)
            done += 1
            if progress is not None:
                progress(done, total)
            yield [record]
        return
    order = {task.name: i for i, task in enumerate(tasks)}
    with ThreadPoolExecutor(max_workers=fanout, thread_name_prefix="launch") as pool:
        waiting = {pool.submit(one, task): task for task in tasks}
        try:
            for batch in _batches(waiting, order, progress, total):
                started.extend(batch)
                yield batch
        except BaseException:
            # The caller gave up (its output gone, Ctrl-C) or a start failed: the starts under
            # way still end, and a task they started must be stopped with the others, not left
            # running unrecorded (seen: a bench killed mid-apply left four forked tasks).
            for pending in waiting:
                pending.cancel()
            for future in list(waiting):
                if not future.cancelled() and future.exception() is None:
                    started.append(future.result())
            raise


def _batches(
    waiting: dict[Future[TaskRecord], Task],
    order: dict[str, int],
    progress: Progress | None,
    total: int,
) -> Iterator[list[TaskRecord]]:
    """The records of the starts in ``waiting`` as they end, in batches (``waiting`` loses each
    start as it ends: what it holds is always what is still under way); the first failure
    cancels those not begun and is raised once the others have ended."""
    failure: ApplyError | None = None
    done = 0
    while waiting:
        finished, _ = wait(waiting, return_when=FIRST_COMPLETED)
        batch = []
        for future in finished:
            del waiting[future]
            problem = future.exception()
            if problem is None:
                batch.append(future.result())
            elif failure is None:
                failure = problem if isinstance(problem, ApplyError) else ApplyError(str(problem))
                for pending in waiting:
                    pending.cancel()
        for future in [f for f in waiting if f.cancelled()]:
            del waiting[future]
        done += len(batch)
        if progress is not None:
            progress(done, total)
        if batch:
            batch.sort(key=lambda r: order[r.name])
            yield batch
    if failure is not None:
        raise _failed(failure, done) from failure


def _failed(error: ApplyError, started: int) -> ApplyError:
    return ApplyError(
        f"{error}; stopped the {started} task(s) this apply had started"
        if started
        else f"{error}; nothing else was started"
    )


def _release(state: State, store: StateStore, backend: Backend, say: Say) -> State:
    """Give the allocation back (a scheduler's job, firewall rules): the backend decides what
    there is to do; the state forgets it only once that worked, so destroy can try again."""
    if state.allocation is None:
        return state
    what = f"allocation {state.allocation.id}" if state.allocation.id else "the allocation"
    try:
        backend.release(state.allocation)
    except TfplanError as error:
        say(f"could not release {what}: {error}; `tfplan destroy` tries again")
        return state
    if state.allocation.id:
        say(f"released {what}")
    return store.write(replace(state, allocation=None))


def release_if_idle(state: State, store: StateStore, backend: Backend, say: Say) -> State:
    """Give the allocation back once no task of the state runs any more (nothing stays queued
    or held after training)."""
    if state.allocation is None or any(t.running for t in state.tasks):
        return state
    keep_logs(state, backend)  # the allocation takes its hosts, and the logs on them, with it
    return _release(state, store, backend, say)


def stop_tasks(
    state: State,
    tasks: Sequence[TaskRecord],
    store: StateStore,
    backend: Backend,
    say: Say,
    forget: bool,
    grace_secs: float | None = None,
) -> State:
    """Stop ``tasks`` through the backend (polite signal, then kill after the grace period),
    all at once; write the state.

    Every task is cancelled whatever its recorded status: a task recorded as failed may have
    left processes behind (its wrapper died, its program runs on), and a cancel of a task with
    nothing left is cheap and harmless (outcome ``none``).

    Args:
        forget: drop the tasks from the state (destroy/replace) rather than mark them stopped.

    Raises:
        ApplyError: a task could not be confirmed stopped (its host is unreachable); the state
            keeps it so that a later destroy can try again.
    """
    if not tasks:
        return state
    grace = grace_secs if grace_secs is not None else state.policy.stop_grace_secs
    began = time.monotonic()
    results = backend.cancel(list(tasks), grace)
    stopped = [
        t
        for t in tasks
        if not isinstance(r := results.get(t.name), Exception)
        and (t.running or (r is not None and r.outcome != "none"))
    ]
    failures: dict[str, str] = {}
    for task in tasks:
        result = results.get(task.name)
        if isinstance(result, Exception):
            failures[f"{task.name} on {task.host}"] = str(result)
            continue
        old = state.task(task.name)
        if old is None:
            continue
        if forget:
            state = state.without_task(task.name)
        elif old.running:
            state = state.with_task(replace(old, status=TaskStatus.STOPPED))
    state = store.write(state)
    names = ", ".join(
        t.name if t.running else f"{t.name} (left over by its {t.status.value} life)"
        for t in stopped
    )
    if len(stopped) > TASK_LINES_UP_TO:
        names = f"{len(stopped)} tasks"
    if names:
        say(f"Stopped {names} ({time.monotonic() - began:.1f}s)")
    if failures:
        detail = "; ".join(f"{h}: {why}" for h, why in sorted(failures.items()))
        raise ApplyError(f"could not stop every task: {detail}; run `tfplan destroy` again")
    return state


STANDBY_GRACE_SECS = 1.0  # a standby holds nothing: SIGTERM ends it at once


def stop_standbys(
    state: State,
    store: StateStore,
    backend: Backend,
    say: Say,
    names: set[str] | frozenset[str] | None = None,
) -> State:
    """Stop warm standbys (those named in ``names``, all when None) and drop them from the
    state. One that cannot be confirmed stopped stays recorded (destroy tries again) and is
    reported; this never raises, so that a teardown goes on."""
    chosen = [s for s in state.standbys if names is None or s.name in names]
    if not chosen:
        return state
    try:
        results: dict[str, CancelResult | Exception] = dict(
            backend.cancel(chosen, STANDBY_GRACE_SECS)
        )
    except TfplanError as error:
        results = {s.name: error for s in chosen}
    gone = {s.name for s in chosen if not isinstance(results.get(s.name), Exception)}
    for standby in chosen:
        failed = results.get(standby.name)
        if isinstance(failed, Exception):
            say(f"could not stop {standby.name} on {standby.host}: {failed}")
    state = store.write(state.without_standbys(gone))
    if gone:
        say(f"Stopped {', '.join(sorted(gone))}")
    return state
