"""Warm standbys of the parameter servers, for the supervisor: when to start one, which to drop,
and the takeover that makes a standby its ps's next life.

A standby (``lifecycle.ps_standby``, where the backend can) is a second copy of a ps that has
imported TensorFlow and waits for SIGUSR1 (docs/contract.md). A restart of the ps hands over to
it instead of starting a new process: the go signal, then the standby's log becomes the task's.
A standby starts only once training goes on (a step seen since the start or the last takeover,
or after :data:`STANDBY_SETTLE_SECS` for programs that print no steps), so that its TensorFlow
import does not slow the cluster's own start or recovery; one that ends by itself is started
again after a growing delay, and after :data:`STANDBY_MAX_FAILURES` no more.

Every standby started is written to the state at once: whatever ends the run, the teardown (or
``tfplan destroy``) finds and stops it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import replace

from tfplan.backends.api import Backend
from tfplan.engine.applier import stop_standbys
from tfplan.engine.launching import standby_request
from tfplan.engine.logs import LogFanIn
from tfplan.engine.store import StateStore
from tfplan.errors import TfplanError
from tfplan.planning.state import (
    Allocation,
    State,
    TaskRecord,
    TaskStatus,
    standby_name,
    standby_task,
)

__all__ = [
    "PREVIOUS_LOG_SECS",
    "STANDBY_CHECK_SECS",
    "STANDBY_MAX_FAILURES",
    "STANDBY_READY_POLL_SECS",
    "STANDBY_READY_WAIT_SECS",
    "STANDBY_RETRY_SECS",
    "STANDBY_SETTLE_SECS",
    "Standbys",
]

Say = Callable[[str], None]

# Standbys are observed this often; started only once training goes on or, for programs that
# print no steps, after this long.
STANDBY_CHECK_SECS = 2.0
STANDBY_SETTLE_SECS = 30.0
STANDBY_MAX_FAILURES = 3  # standbys of one task that ended by themselves: then none any more
STANDBY_RETRY_SECS = 5.0  # after a standby ended by itself, times its failures so far
# A standby that has printed nothing yet may not have blocked SIGUSR1 yet (the go signal would
# end it): a restart due then waits for its first line, polling this often, at most this long.
STANDBY_READY_POLL_SECS = 0.1
STANDBY_READY_WAIT_SECS = 60.0
PREVIOUS_LOG_SECS = 1.0  # how long the stream of a life that ended may take to deliver its end


class Standbys:
    """The warm standbys of one supervised experiment, and when each ps may have its next one.

    Args:
        store: the experiment's state file (the caller holds its lock).
        backend: what runs the tasks and their standbys.
        logs: the supervisor's log fan-in (a standby's log is followed, and its first line says
            it is ready).
        say: receives tfplan's own messages.
        follow: follows a task's new life (the supervisor's own bookkeeping included).
        started: when supervision started (``time.monotonic()``).
    """

    def __init__(
        self,
        store: StateStore,
        backend: Backend,
        logs: LogFanIn,
        say: Say,
        follow: Callable[[TaskRecord], None],
        started: float,
    ) -> None:
        self.store = store
        self.backend = backend
        self.logs = logs
        self._say = say
        self._follow = follow
        self._started = started
        self._after: dict[str, tuple[float, int | None]] = {}  # task -> (not before, step lines)
        self._failures: dict[str, int] = {}
        self._checked = 0.0
        self._awaiting: dict[str, float] = {}  # task -> when its restart began to wait

    def follow(self, state: State) -> None:
        """Stream the logs of the standbys that already run (supervision taken over)."""
        for standby in state.standbys:
            self.logs.follow(standby)

    def forget_schedule(self) -> None:
        """A re-planned cluster: forget when each task's next standby was due."""
        self._after.clear()

    # -- every tick -----------------------------------------------------------------------

    def tick(self, state: State, pending: Collection[str], going_on: bool) -> State:
        """Observe the standbys now and then, drop those that ended or lost their task, and
        start one for each running ps that has none (once training goes on).

        ``pending``: the tasks about to restart; ``going_on``: the job has not ended (training
        not over, no fatal problem)."""
        now = time.monotonic()
        if state.standbys and now - self._checked >= STANDBY_CHECK_SECS:
            self._checked = now
            state = self._check(state, pending)
        if not (going_on and state.policy.ps_standby and self.backend.capabilities.standby):
            return state
        for task in state.running:
            if task.role != "ps" or task.name in pending:
                continue
            if self.backend.starts_warm(task.host, state.allocation):  # a restart is as quick
                continue
            if state.standby_for(task.name) is not None or not self._due(task, now):
                continue
            state = self._start(state, task)
        return state

    def _due(self, task: TaskRecord, now: float) -> bool:
        """Whether to start ``task``'s standby now: not while the cluster starts or recovers
        (its TensorFlow import would take CPU from them), so only once a training step was
        seen since the start or the last takeover (or after a while, for programs that print
        no steps), and not too soon after one ended by itself."""
        if self._failures.get(task.name, 0) >= STANDBY_MAX_FAILURES:
            return False
        after = self._after.get(task.name)
        if after is None:
            return self.logs.step_lines > 0 or now - self._started >= STANDBY_SETTLE_SECS
        not_before, past_lines = after
        if past_lines is not None and self.logs.step_lines > past_lines:
            return True
        return now >= not_before

    def _start(self, state: State, task: TaskRecord) -> State:
        try:
            request = standby_request(task, state)
            launched = self.backend.launch(request, state.allocation or Allocation())
        except TfplanError as error:
            self._failed(task.name, f"could not start ({error})")
            return state
        standby = replace(
            task,
            name=standby_name(task.name),
            handle=launched.handle,
            host=launched.host,
            address=launched.address or task.address,
            log_path=request.log_path,
            started_at=launched.started_at,
            status=TaskStatus.RUNNING,
            exit_code=None,
        )
        # recorded at once: whatever happens next (Ctrl-C, a teardown), it is in the state, so
        # the end of the run or destroy stops it
        state = self.store.write(state.with_standby(standby))
        self._say(
            f"{task.name}: warm standby started on {launched.host} "
            f"({self.backend.handle_text(standby)})"
        )
        self.logs.follow(standby)
        return state

    def _check(self, state: State, pending: Collection[str]) -> State:
        """Drop standbys that ended by themselves (counted: after a few, none any more) or
        whose task no longer runs (and is not about to restart)."""
        infos = self.backend.describe(list(state.standbys))
        drop: set[str] = set()
        for standby in state.standbys:
            task = state.task(standby_task(standby.name))
            info = infos.get(standby.name)
            if task is None or not (task.running or task.name in pending):
                drop.add(standby.name)
            elif info is not None and info.phase.ended:
                code = "killed or vanished" if info.exit_code is None else info.exit_code
                self._failed(task.name, f"ended ({code})")
                drop.add(standby.name)
        if drop:
            state = stop_standbys(state, self.store, self.backend, self._say, drop)
        return state

    def _failed(self, task: str, why: str) -> None:
        failures = self._failures.get(task, 0) + 1
        self._failures[task] = failures
        if failures >= STANDBY_MAX_FAILURES:
            self._say(
                f"{task}: its warm standby {why}, {failures} times: no standby any more "
                "(a restart starts a new process)"
            )
            return
        retry = STANDBY_RETRY_SECS * failures
        self._after[task] = (time.monotonic() + retry, None)
        self._say(f"{task}: its warm standby {why}; another one in {retry:.0f}s")

    # -- a restart of the ps --------------------------------------------------------------

    def _ready(self, standby: TaskRecord) -> bool:
        """Whether the standby has printed a line: the contract has it block SIGUSR1 before
        anything else, so after its first line the go signal can no longer end it."""
        return standby.name in self.logs.last_line

    def wait_until(self, state: State, task: TaskRecord, now: float) -> float | None:
        """When to look again, if ``task``'s restart should wait a little longer for its
        standby to be ready; None to restart now. Waiting is never slower than a cold start:
        the standby is already importing what a new process would import. Seen on Slurm: a ps
        killed 1 s after its standby's step started, the go signal ended the standby (exit 138)
        and a cold start followed anyway."""
        standby = state.standby_for(task.name)
        if standby is None or self._ready(standby):
            self._awaiting.pop(task.name, None)
            return None
        began = self._awaiting.setdefault(task.name, now)
        if began == now:
            self._say(f"{task.name}: waiting for its warm standby to be ready (still starting)")
        if now - began < STANDBY_READY_WAIT_SECS:
            return now + STANDBY_READY_POLL_SECS
        self._awaiting.pop(task.name, None)
        return None

    def take_over(self, state: State, task: TaskRecord) -> tuple[State, bool]:
        """Make ``task``'s warm standby its next life (its previous life is already gone):
        (state, True). (state, False) when ``task`` must start a new process: it has no
        standby, or its standby is not ready or cannot take over (then it is dropped)."""
        standby = state.standby_for(task.name)
        if standby is None:
            return state, False
        if not self._ready(standby):
            self._say(
                f"{task.name}: its standby printed nothing in {STANDBY_READY_WAIT_SECS:.0f}s "
                "(not ready); starting a new process"
            )
            return stop_standbys(state, self.store, self.backend, self._say, {standby.name}), False
        return self._takeover(state, task, standby)

    def _takeover(self, state: State, task: TaskRecord, standby: TaskRecord) -> tuple[State, bool]:
        """The go signal first (it starts serving at once), then its log becomes the task's,
        the previous one kept as ``<log>.<n>``. (state, False), the standby dropped, when it
        cannot take over."""
        why = None
        try:
            self.backend.signal(standby, "USR1")  # raises when it has no live process
        except TfplanError as error:
            why = f"it could not be signalled: {error}"
        if why is not None:
            self._say(f"{task.name}: its standby cannot take over ({why}); starting a new process")
            return stop_standbys(state, self.store, self.backend, self._say, {standby.name}), False
        keep = f"{task.log_path}.{task.restarts}"
        log_path = task.log_path
        self.logs.stop(standby.name)  # its lines so far come again from the task's log
        self.logs.finish(task.name, PREVIOUS_LOG_SECS)
        try:
            self.backend.move_logs(standby, [(task.log_path, keep), (standby.log_path, log_path)])
        except TfplanError as error:
            self._say(f"{task.name}: its log stays {standby.log_path} ({error})")
            log_path = standby.log_path
        new = replace(
            task,
            handle=standby.handle,
            host=standby.host,
            address=standby.address or task.address,
            log_path=log_path,
            started_at=time.time(),
            status=TaskStatus.RUNNING,
            exit_code=None,
            restarts=task.restarts + 1,
        )
        state = self.store.write(state.with_task(new).without_standbys({standby.name}))
        self._say(
            f"{task.name}: restarted on {new.host} by its warm standby "
            f"({self.backend.handle_text(new)}; restart {new.restarts}; previous log kept as "
            f"{keep})"
        )
        self._follow(new)
        self._after[task.name] = (time.monotonic() + STANDBY_SETTLE_SECS, self.logs.step_lines)
        return state, True
