"""Watch a running cluster through its backend: stream prefixed logs, track the global step,
restart tasks by their policy, detect hung tasks, and end the job the way its roles say.

Lifecycle (PEERS.md: what TFJob, TonY and RiseML users expect):
- a task that ends is restarted on its host and port when its restart policy says so
  (:mod:`tfplan.planning.policy`), after a doubling backoff; its previous log is kept as
  ``task.log.<n>``, and every process of its previous life is stopped first;
- a task whose wrapper died while its program runs on is re-adopted, not restarted (where the
  backend follows programs, ``TaskInfo.readopted``): followed until its program ends, its exit
  status then unknown (which counts as killed);
- a parameter server has a warm standby (``lifecycle.ps_standby``, where the backend can): a
  second copy that has imported TensorFlow and waits for SIGUSR1; a restart of the ps hands
  over to it instead of starting a new process, and a new standby starts once training goes
  on again (:mod:`tfplan.engine.standbys`);
- in a collective job (all-reduce) a training task that must restart takes the whole group with
  it: every worker restarts together from the last checkpoint;
- a chief or worker that prints no log line for ``progress_timeout_secs`` is hung: it is killed
  and then handled like any task that died;
- the chief succeeds: training is done; the others get their grace period to exit by
  themselves, then they are stopped;
- the chief fails for good: ``on_chief_failure=teardown`` (default) stops every task;
- a parameter server fails for good: the job cannot go on, every task is stopped (fail fast);
- a worker or the evaluator fails for good: reported, training goes on;
- a host that does not answer for ``host_timeout_secs`` has lost its tasks: with
  ``on_host_failure=replace`` the cluster is planned again on the other hosts;
- ``deadline_secs`` passes: every task is stopped and the job fails;
- Ctrl-C: every task is stopped and the state records it.

A task that fails is explained as soon as it is seen, on a helper thread
(:mod:`tfplan.engine.explaining`): a known failure is said in one line, cause and fix, right
after the task's own last lines. A restart due meanwhile does not wait for it.

When the job ends (whichever way), every process of every task is stopped, whatever its
recorded status (a failed task whose program outlived its wrapper included), and every standby.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tfplan.backends.api import Backend, TaskInfo, TaskPhase
from tfplan.engine.applier import apply_plan, release_if_idle, stop_standbys, stop_tasks
from tfplan.engine.explaining import Explainer
from tfplan.engine.joining import JoinWatch
from tfplan.engine.launching import restart_request
from tfplan.engine.logs import Emit, LogFanIn
from tfplan.engine.standbys import PREVIOUS_LOG_SECS, Standbys
from tfplan.engine.store import StateStore
from tfplan.errors import TfplanError
from tfplan.planning.plan import Plan
from tfplan.planning.policy import ChiefFailure, HostFailure, backoff_delay, decide_restart
from tfplan.planning.state import Allocation, State, TaskRecord, TaskStatus

__all__ = ["HandedOver", "Outcome", "Replan", "Supervisor", "ended_status"]

Replan = Callable[[State], Plan | None]

# Importing TensorFlow and joining the cluster can take tens of seconds on a busy host: the
# progress timeout starts with a task's first log line; before it, this much is allowed.
STARTUP_TIMEOUT_SECS = 120.0
TRAINING_ROLES = ("chief", "worker")
# at the end, how long the log streams of the ended tasks get to deliver their last lines
FINAL_LINES_SECS = 2.0


class HandedOver(Exception):
    """Supervision was handed over (SIGTERM to a background supervisor): the tasks run on."""


@dataclass(frozen=True)
class Outcome:
    succeeded: bool
    reason: str
    state: State
    last_step: int | None


def ended_status(info: TaskInfo | None) -> tuple[TaskStatus, int | None] | None:
    """(new status, exit code) when the task has ended, else None."""
    if info is None or not info.phase.ended:
        return None
    status = TaskStatus.SUCCEEDED if info.phase is TaskPhase.SUCCEEDED else TaskStatus.FAILED
    return status, info.exit_code


def _scores(name: str) -> bool:
    """Whether the task is an evaluator (its work goes on after the chief's: the last score)."""
    return name.split("/", 1)[0] == "evaluator"


def _exit(task: TaskRecord) -> str:
    return "killed or vanished" if task.exit_code is None else f"exit code {task.exit_code}"


class Supervisor:
    """Drives one experiment's tasks to the end of training (see the module docstring).

    Args:
        store: the experiment's state file (the caller holds its lock).
        backend: what runs the tasks.
        emit: receives ``(task name, line)`` for every log line, and ``("tfplan", message)``.
        on_step: called with each new highest global step.
        replan: makes a new plan around hosts that went down (``on_host_failure=replace``).
        handover: once set, supervision stops at the next tick with :class:`HandedOver`, leaving
            the tasks running (another tfplan takes over).
        interrupt: once set, the next tick acts as Ctrl-C: every task is stopped and
            KeyboardInterrupt raised (how a sweep stops the points running in other threads).
        poll_secs: how often the tasks are observed.
    """

    def __init__(
        self,
        store: StateStore,
        backend: Backend,
        emit: Emit,
        on_step: Callable[[int], None] | None = None,
        replan: Replan | None = None,
        handover: threading.Event | None = None,
        interrupt: threading.Event | None = None,
        poll_secs: float = 0.5,
    ) -> None:
        self.store = store
        self.backend = backend
        self.emit = emit
        self.logs = LogFanIn(backend, emit, on_step)
        self.replan = replan
        self.handover = handover
        self.interrupt = interrupt
        self.poll_secs = poll_secs
        self._life_started: dict[str, float] = {}
        self._pending: dict[str, float] = {}  # task name -> when to restart it
        self._readopted: set[tuple[str, str]] = set()  # (task, process group) said re-adopted
        self._done_at: float | None = None  # when the chief succeeded
        self._unreachable_since: dict[str, float] = {}  # host -> first failed observation
        self._fatal: str | None = None  # the allocation ended under the job
        self._started = time.monotonic()
        self.standbys = Standbys(store, backend, self.logs, self._say, self._follow, self._started)
        self.explainer = Explainer(backend, self._say, self.logs.ended)
        self._joins = JoinWatch(backend, enabled=False)  # a user's program: see run()

    @property
    def last_step(self) -> int | None:
        return self.logs.last_step

    # -- public ---------------------------------------------------------------------------

    def run(self, state: State) -> Outcome:
        """Supervise until every task has ended; Ctrl-C stops them all and re-raises."""
        recipe = (state.config or {}).get("config", {}).get("recipe", {})
        self._joins.enabled = recipe.get("kind") == "command"
        for task in state.running:
            self._follow(task)
        self.standbys.follow(state)
        try:
            return self._loop(state)
        except KeyboardInterrupt:
            self.logs.drain()
            current = self.store.load() or state
            self._say(f"interrupted: stopping {len(current.running)} task(s)")
            current = stop_standbys(current, self.store, self.backend, self._say)
            current = stop_tasks(
                current, _reachable(current), self.store, self.backend, self._say, forget=False
            )
            release_if_idle(current, self.store, self.backend, self._say)
            raise
        finally:
            self.logs.stop_all()
            self.logs.drain()
            self.explainer.close()

    # -- logs -----------------------------------------------------------------------------

    def _say(self, line: str) -> None:
        self.emit("tfplan", line)

    def _follow(self, task: TaskRecord) -> None:
        self._life_started[task.name] = time.monotonic()
        self.logs.follow(task)

    # -- the loop -------------------------------------------------------------------------

    def _loop(self, state: State) -> Outcome:
        while True:
            if self.handover is not None and self.handover.is_set():
                self.logs.drain()
                raise HandedOver()
            if self.interrupt is not None and self.interrupt.is_set():
                raise KeyboardInterrupt()
            self.logs.drain()
            self.explainer.say_ready()
            state = self._observe(state)
            if self._done_at is None:
                self._joins.look(state.running)
            state = self._kill_hung(state)
            state = self._restart_due(state)
            state, outcome = self._decide(state)
            if outcome is not None:
                return outcome
            going_on = self._done_at is None and self._fatal is None
            state = self.standbys.tick(state, self._pending, going_on)
            self._wait()

    def _wait(self) -> None:
        """Until the next poll, a restart that is due, or a followed log ending (its task's
        process is gone: observe it now rather than up to a poll later)."""
        timeout = self.poll_secs
        if self._pending:
            timeout = max(0.0, min(timeout, min(self._pending.values()) - time.monotonic()))
        if self.logs.ended.wait(timeout):
            self.logs.ended.clear()

    def _observe(self, state: State) -> State:
        """Mark tasks whose process ended, and schedule restarts their policy asks for."""
        running = state.running
        infos = self.backend.describe(running) if running else {}
        before = state.lineage, state.serial
        state = self._hosts_down(state, infos)
        if (state.lineage, state.serial) != before:
            return state  # the tasks changed under the status just read: read again next tick
        self._say_readopted(running, infos)
        ended = [(t, e) for t in running if (e := ended_status(infos.get(t.name))) is not None]
        if not ended:
            return state
        if state.allocation is not None and self._done_at is None and self._fatal is None:
            unexpected = any(not (t.is_chief and s is TaskStatus.SUCCEEDED) for t, (s, _) in ended)
            if unexpected:
                self._fatal = self.backend.allocation_problem(state.allocation)
        for task, (status, code) in ended:
            alone = status is TaskStatus.SUCCEEDED and self._joins.never_listened(task)
            dead = replace(task, status=status, exit_code=code, never_listened=alone)
            state = state.with_task(dead)
            if self._fatal is not None:
                self._say(f"{task.name} {status.value} ({_exit(dead)})")
                continue
            state = self._on_ended(state, dead)
        return self.store.write(state)

    def _say_readopted(self, running: Sequence[TaskRecord], infos: dict[str, TaskInfo]) -> None:
        """Once per life: a task whose tracked process (a wrapper) died while its program runs
        on is followed on, not replaced (the program still serves; a restart would stop it)."""
        for task in running:
            info = infos.get(task.name)
            life = (task.name, str(task.handle.get("pgid")))
            if info is None or not info.readopted or life in self._readopted:
                continue
            self._readopted.add(life)
            what = info.detail.split(": ", 1)[-1]
            self._say(
                f"{task.name}: its wrapper (pid {task.handle.get('pid')}) is gone but its "
                f"program runs on ({what}): re-adopted, not restarted; its exit status will be "
                "unknown (an end before training is done counts as a kill)"
            )

    def _hosts_down(self, state: State, infos: dict[str, TaskInfo]) -> State:
        """Hosts whose observations fail for ``host_timeout_secs`` have lost their tasks:
        re-plan on the other hosts (``on_host_failure=replace``) or let the lifecycle decide."""
        now = time.monotonic()
        silent = {
            t.host: info.error or "no answer"
            for t in state.running
            if (info := infos.get(t.name)) is not None and info.phase is TaskPhase.UNREACHABLE
        }
        for host in list(self._unreachable_since):
            if host not in silent:
                del self._unreachable_since[host]
                self._say(f"host {host} answers again")
        if silent and state.allocation is not None and self._done_at is None and not self._fatal:
            # hosts that stop answering because the allocation itself ended (a Spark driver
            # that died took its executors along): say so now, not after host_timeout_secs
            self._fatal = self.backend.allocation_problem(state.allocation)
            if self._fatal is not None:
                self._say(f"{self._fatal}: its tasks are lost")
                for task in state.running:
                    if task.host in silent:
                        state = state.with_task(replace(task, status=TaskStatus.UNREACHABLE))
                return self.store.write(state)
        down = []
        for host in sorted(silent):
            since = self._unreachable_since.setdefault(host, now)
            if since == now:
                self._say(f"host {host} does not answer ({silent[host]}); waiting")
            if now - since >= state.policy.host_timeout_secs:
                down.append(host)
        if not down:
            return state
        for task in state.running:
            if task.host in down:
                state = state.with_task(replace(task, status=TaskStatus.UNREACHABLE))
        state = self.store.write(state)
        lost = ", ".join(t.name for t in state.tasks if t.host in down)
        self._say(
            f"host(s) {', '.join(down)} unreachable for "
            f"{now - min(self._unreachable_since[h] for h in down):.0f}s: lost {lost}"
        )
        for host in down:
            del self._unreachable_since[host]
        if (
            state.policy.on_host_failure is HostFailure.REPLACE
            and self._done_at is None
            and self.backend.capabilities.replace_lost_hosts
        ):
            return self._replan(state)
        return state

    def _replan(self, state: State) -> State:
        """Plan again (the down hosts get no task) and apply it: every task restarts with the
        new cluster spec, the chief from the last checkpoint."""
        new_plan = self.replan(state) if self.replan is not None else None
        if new_plan is None:
            self._say("cannot re-plan here: run `tfplan plan` and `tfplan apply`")
            return state
        self._say("re-planning the cluster on the hosts that answer")
        self.logs.stop_all()
        self._pending.clear()
        self.standbys.forget_schedule()
        result = apply_plan(new_plan, self.store, self.backend, self._say)
        for task in result.state.running:
            self._follow(task)
        return result.state

    def _on_ended(self, state: State, task: TaskRecord) -> State:
        shown = _exit(task)
        if task.never_listened:
            self.explainer.later(task, state.output_dir or "")
        # after training only an evaluator's failure is still worth a restart: the final
        # checkpoint's score is the work it has left (it may have read one that was deleted)
        after_training = self._done_at is not None and not _scores(task.name)
        if after_training or (task.is_chief and task.status is TaskStatus.SUCCEEDED):
            self._say(f"{task.name} {task.status.value} ({shown})")
            return state
        if task.status is TaskStatus.FAILED:
            self.explainer.later(task, state.output_dir or "")
        policy = state.policy.for_role(task.role)
        decision = decide_restart(
            policy.restart,
            task.exit_code,
            task.restarts,
            policy.backoff_limit,
            state.policy.retry_exit_codes,
        )
        if not decision.restart:
            note = (
                "" if task.status is TaskStatus.SUCCEEDED else f"; not restarted: {decision.reason}"
            )
            if note and task.role in ("worker", "evaluator") and not task.is_chief:
                note += "; the other tasks go on"
            self._say(f"{task.name} {task.status.value} ({shown}){note}")
            return state
        delay = backoff_delay(policy.backoff_secs, task.restarts)
        when = time.monotonic() + delay
        self._pending[task.name] = when
        self._say(
            f"{task.name} {task.status.value} ({shown}): restarting in {delay:.1f}s "
            f"({decision.reason})"
        )
        if state.policy.restart_together and task.role in TRAINING_ROLES:
            state = self._restart_group(state, task, when)
        return state

    def _restart_group(self, state: State, failed: TaskRecord, when: float) -> State:
        """A collective job cannot go on without one of its workers: stop the others and
        restart them all together (each resumes from the last checkpoint)."""
        group = [t for t in state.running if t.role in TRAINING_ROLES and t.name != failed.name]
        if not group:
            return state
        self._say(
            f"{failed.name} holds part of every all-reduce step: restarting "
            f"{', '.join(t.name for t in group)} with it"
        )
        state = stop_tasks(state, group, self.store, self.backend, self._say, forget=False)
        for task in group:
            self._pending[task.name] = when
        return state

    def _kill_hung(self, state: State) -> State:
        if self._done_at is not None:
            return state
        now = time.monotonic()
        hung: list[tuple[TaskRecord, float]] = []
        for task in state.running:
            timeout = state.policy.for_role(task.role).progress_timeout_secs
            if timeout is None:
                continue
            last = self.logs.last_line.get(task.name)
            if last is None:
                last = self._life_started.get(task.name, now)
                timeout = max(timeout, STARTUP_TIMEOUT_SECS)
            if now - last > timeout:
                hung.append((task, now - last))
        if not hung:
            return state
        for task, silent in hung:
            self._say(
                f"{task.name}: no log line for {silent:.0f}s: treating it as hung and killing it"
            )
        hung_tasks = [task for task, _ in hung]
        state = stop_tasks(
            state, hung_tasks, self.store, self.backend, self._say, forget=False, grace_secs=0.5
        )
        for task in hung_tasks:
            dead = replace(task, status=TaskStatus.FAILED, exit_code=None)
            state = self._on_ended(state.with_task(dead), dead)
        return self.store.write(state)

    def _restart_due(self, state: State) -> State:
        now = time.monotonic()
        for name, when in sorted(self._pending.items()):
            task = state.task(name)
            if when > now or task is None:
                continue
            del self._pending[name]
            if self._done_at is not None and not _scores(name):
                continue
            again = self.standbys.wait_until(state, task, now)
            if again is not None:
                self._pending[name] = again
                continue
            try:
                state = self._restart(state, task)
            except TfplanError as error:
                self._say(f"{name}: restart failed ({error})")
        return state

    def _restart(self, state: State, task: TaskRecord) -> State:
        # Every process of the previous life goes first, whichever of them died: a program that
        # outlived its wrapper would otherwise still hold the port.
        leftovers = self.backend.cancel([replace(task, status=TaskStatus.RUNNING)], 0.5)
        error = leftovers.get(task.name)
        if isinstance(error, Exception):
            raise TfplanError(f"its previous process could not be stopped: {error}")
        state, taken = self.standbys.take_over(state, task)
        if taken:
            return state
        request = restart_request(task, state)
        self.logs.finish(task.name, PREVIOUS_LOG_SECS)
        launched = self.backend.launch(request, state.allocation or Allocation())
        new = replace(
            task,
            handle=launched.handle,
            host=launched.host,
            address=launched.address or task.address,
            started_at=launched.started_at,
            status=TaskStatus.RUNNING,
            exit_code=None,
            restarts=task.restarts + 1,
        )
        state = self.store.write(state.with_task(new))
        self._say(
            f"{task.name}: restarted on {launched.host} (restart {new.restarts}; previous log "
            f"kept as {request.keep_log_as}{'; ' + launched.note if launched.note else ''})"
        )
        self._follow(new)
        return state

    def _decide(self, state: State) -> tuple[State, Outcome | None]:
        """The job-level lifecycle: (the state, None) while the job goes on, else how it ended.
        The state comes back: deciding may stop tasks and standbys."""
        now = time.monotonic()
        running = state.running
        chief = next((t for t in state.tasks if t.is_chief), None)
        policy = state.policy
        if chief is not None and chief.status is TaskStatus.SUCCEEDED and self._done_at is None:
            self._done_at = now
            # an evaluator's due restart still goes ahead: scoring the final checkpoint is the
            # work it has left; any other task's would only train on
            self._pending = {n: w for n, w in self._pending.items() if _scores(n)}
            state = stop_standbys(state, self.store, self.backend, self._say)
        if self._done_at is not None:
            overdue = [
                t for t in running if self._past_grace(t, now) >= policy.grace_after_chief(t.role)
            ]
            if overdue:
                names = ", ".join(t.name for t in overdue)
                self._say(f"training is over; stopping {names}, which did not exit by themselves")
                state = stop_tasks(
                    state, overdue, self.store, self.backend, self._say, forget=False
                )
                running = [t for t in running if t not in overdue]
            if not running and not self._pending:
                return state, self._finish(
                    state, True, f"{chief.name if chief else 'chief'} succeeded"
                )
            return state, None
        final = [
            t
            for t in state.tasks
            if t.status in (TaskStatus.FAILED, TaskStatus.UNREACHABLE)
            and t.name not in self._pending
        ]
        failed_chief = next((t for t in final if t.is_chief), None)
        failed_ps = next((t for t in final if t.role == "ps"), None)
        reason = None
        if self._fatal is not None:
            reason = self._fatal
        elif failed_chief is not None:
            reason = f"{failed_chief.name} failed ({_exit(failed_chief)})"
            if policy.on_chief_failure is ChiefFailure.KEEP:
                return state, self._finish(state, False, reason, keep_running=True)
        elif failed_ps is not None:
            reason = f"{failed_ps.name} failed ({_exit(failed_ps)}) and is not restarted"
        elif policy.deadline_secs is not None and now - self._started > policy.deadline_secs:
            reason = f"the deadline of {policy.deadline_secs:.0f}s passed"
        if reason is not None:
            if running:
                self._say(f"{reason}: tearing down the cluster")
            return state, self._finish(state, False, reason)
        if not running and not self._pending:
            return state, self._finish(
                state, False, "every task ended but the chief never succeeded"
            )
        return state, None

    def _past_grace(self, task: TaskRecord, now: float) -> float:
        """Seconds of its grace after the chief a running task has used: counted from the
        chief's success, or for an evaluator restarted since, from its restart (the grace is
        the time to score the last checkpoint, which a new process has not begun)."""
        assert self._done_at is not None
        since = now - self._done_at
        if _scores(task.name):
            since = min(since, max(0.0, time.time() - task.started_at))
        return since

    def _finish(self, state: State, ok: bool, reason: str, keep_running: bool = False) -> Outcome:
        """The end, whichever way: every standby and every process of every task is stopped
        (a running task is torn down, unless ``keep_running``; an ended one may have left its
        program behind), then the allocation is given back."""
        state = stop_standbys(state, self.store, self.backend, self._say)
        sweep = [t for t in _reachable(state) if not (keep_running and t.running)]
        try:
            state = stop_tasks(state, sweep, self.store, self.backend, self._say, forget=False)
        except TfplanError as error:
            self._say(str(error))
        # the last lines of the logs: the streams of the tasks that have ended deliver them
        # and end (at once, mostly: they ended with their processes); not a fixed pause
        self.logs.wait_ended([t.name for t in state.tasks if not t.running], FINAL_LINES_SECS)
        self.logs.drain()
        state = release_if_idle(state, self.store, self.backend, self._say)
        return Outcome(ok, reason, state, self.last_step)


def _reachable(state: State) -> list[TaskRecord]:
    """The tasks a teardown can reach: all but those on hosts that stopped answering (kept in
    the state for destroy)."""
    return [t for t in state.tasks if t.status is not TaskStatus.UNREACHABLE]
