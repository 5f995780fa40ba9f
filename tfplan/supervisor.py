"""Watch a running cluster: stream prefixed logs, track the global step, restart tasks by their
policy, detect hung tasks, and end the job the way its roles say.

Lifecycle (PEERS.md: what TFJob, TonY and RiseML users expect):
- a task that ends is restarted on its host and port when its restart policy says so
  (:mod:`tfplan.policy`), after a doubling backoff; its previous log is kept as ``task.log.<n>``;
- a chief or worker that prints no log line for ``progress_timeout_secs`` is hung: it is killed
  and then handled like any task that died;
- the chief succeeds: training is done; ps and evaluator get ``ps_grace_secs`` to exit by
  themselves, then they are stopped;
- the chief fails for good: ``on_chief_failure=teardown`` (default) stops every task;
- a parameter server fails for good: the job cannot go on, every task is stopped (fail fast);
- a worker or the evaluator fails for good: reported, training goes on;
- ``deadline_secs`` passes: every task is stopped and the job fails;
- Ctrl-C: every task is stopped and the state records it.
"""

from __future__ import annotations

import posixpath
import queue
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tfplan.applier import stop_tasks
from tfplan.errors import TfplanError
from tfplan.executors import LaunchSpec, run_on_hosts
from tfplan.hosts import HostPool
from tfplan.policy import backoff_delay, decide_restart
from tfplan.state import State, StateStore, TaskState

__all__ = ["Outcome", "Supervisor", "STEP_PATTERN", "collect_status", "ended_status", "result_path"]

STEP_PATTERN = re.compile(r"\bstep=(\d+)")

Emit = Callable[[str, str], None]  # (task name, line)


@dataclass(frozen=True)
class Outcome:
    succeeded: bool
    reason: str
    state: State
    last_step: int | None


def collect_status(state: State, pool: HostPool) -> dict[str, Any]:
    """ProcessInfo (or the exception of its host) for every running task, by task name; all
    hosts are asked at once, so one silent host costs one status timeout, not one per host."""
    running = [t for t in state.tasks if t.status == "running"]
    by_host = {h: [t for t in running if t.host == h] for h in sorted({t.host for t in running})}

    def ask(tasks: list[TaskState]) -> Any:
        return pool[tasks[0].host].status([t.pid for t in tasks], [t.workdir for t in tasks])

    out: dict[str, Any] = {}
    for host, result in run_on_hosts(by_host, ask).items():
        for task in by_host[host]:
            out[task.name] = result if isinstance(result, BaseException) else result.get(task.pid)
    return out


def ended_status(info: Any) -> tuple[str, int | None] | None:
    """(new status, exit code) when the process has ended, else None."""
    if info is None or isinstance(info, BaseException) or info.alive:
        return None
    code = info.exit_code
    return ("succeeded" if code == 0 else "failed"), code


def result_path(output_dir: str) -> str:
    return posixpath.join(output_dir, "result.json")


def _is_chief(task: TaskState) -> bool:
    return bool(task.spec.get("is_chief", False))


def _exit(task: TaskState) -> str:
    return "killed or vanished" if task.exit_code is None else f"exit code {task.exit_code}"


def _setting(task: TaskState, key: str, default: float | None) -> float | None:
    value = task.settings.get(key, "")
    return float(value) if value not in ("", None) else default


class Supervisor:
    """Drives one experiment's tasks to the end of training (see the module docstring)."""

    def __init__(
        self,
        store: StateStore,
        pool: HostPool,
        emit: Emit,
        on_step: Callable[[int], None] | None = None,
        poll_secs: float = 0.5,
    ) -> None:
        self.store = store
        self.pool = pool
        self.emit = emit
        self.on_step = on_step or (lambda step: None)
        self.poll_secs = poll_secs
        self.last_step: int | None = None
        self._lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self._streams: dict[str, Any] = {}
        self._last_line: dict[str, float] = {}  # only once the task's current life printed
        self._life_started: dict[str, float] = {}
        self._pending: dict[str, float] = {}  # task name -> when to restart it
        self._done_at: float | None = None  # when the chief succeeded
        self._unreachable_since: dict[str, float] = {}  # host -> first failed status check
        self._started = time.monotonic()

    # -- public ---------------------------------------------------------------------------

    def run(self, state: State) -> Outcome:
        """Supervise until every task has ended; Ctrl-C stops them all and re-raises."""
        for task in state.tasks:
            if task.status == "running":
                self._follow(task)
        try:
            return self._loop(state)
        except KeyboardInterrupt:
            self._drain()
            current = self.store.load() or state
            running = [t for t in current.tasks if t.status == "running"]
            self._say(f"interrupted: stopping {len(running)} task(s)")
            stop_tasks(current, running, self.store, self.pool, self._say, forget=False)
            raise
        finally:
            self._stop_streams()
            self._drain()

    # -- logs -----------------------------------------------------------------------------

    def _say(self, line: str) -> None:
        self.emit("tfplan", line)

    def _follow(self, task: TaskState) -> None:
        name = task.name
        self._life_started[name] = time.monotonic()
        self._last_line.pop(name, None)

        def on_line(line: str, name: str = name) -> None:
            self._lines.put((name, line))

        old = self._streams.pop(name, None)
        if old is not None:
            old.stop()
        try:
            self._streams[name] = self.pool[task.host].stream_log(task.log_path, task.pid, on_line)
        except TfplanError as error:
            self._say(f"{name}: cannot stream its log ({error})")

    def _stop_streams(self) -> None:
        for stream in self._streams.values():
            try:
                stream.stop()
            except Exception:  # noqa: BLE001 - a stream that fails to stop must not mask the outcome
                pass
        self._streams.clear()

    def _drain(self) -> None:
        now = time.monotonic()
        while True:
            try:
                name, line = self._lines.get_nowait()
            except queue.Empty:
                return
            self._last_line[name] = now
            match = STEP_PATTERN.search(line)
            if match:
                step = int(match.group(1))
                if self.last_step is None or step > self.last_step:
                    self.last_step = step
                    self.on_step(step)
            self.emit(name, line)

    # -- the loop -------------------------------------------------------------------------

    def _loop(self, state: State) -> Outcome:
        while True:
            self._drain()
            state = self._observe(state)
            state = self._kill_hung(state)
            state = self._restart_due(state)
            outcome = self._decide(state)
            if outcome is not None:
                return outcome
            time.sleep(self.poll_secs)

    def _observe(self, state: State) -> State:
        """Mark tasks whose process ended, and schedule restarts their policy asks for."""
        infos = collect_status(state, self.pool)
        before = state.lineage, state.serial
        state = self._hosts_down(state, infos)
        if (state.lineage, state.serial) != before:
            return state  # the tasks changed under the status just read: read again next tick
        changed = False
        for task in state.tasks:
            ended = ended_status(infos.get(task.name)) if task.status == "running" else None
            if ended is None:
                continue
            status, code = ended
            state = state.with_task(replace(task, status=status, exit_code=code))
            changed = True
            self._on_ended(replace(task, status=status, exit_code=code))
        return self.store.write(state) if changed else state

    def _hosts_down(self, state: State, infos: dict[str, Any]) -> State:
        """Hosts whose status checks fail for ``host_timeout_secs`` have lost their tasks:
        re-plan on the other hosts (``on_host_failure=replace``) or let the lifecycle decide."""
        now = time.monotonic()
        failing = {t.host for t in state.tasks if isinstance(infos.get(t.name), BaseException)}
        for host in list(self._unreachable_since):
            if host not in failing:
                del self._unreachable_since[host]
                self._say(f"host {host} answers again")
        down = []
        for host in sorted(failing):
            since = self._unreachable_since.setdefault(host, now)
            mine = [t for t in state.tasks if t.host == host and t.status == "running"]
            if since == now:
                self._say(f"host {host} does not answer ({infos[mine[0].name]}); waiting")
            timeout = _setting(mine[0], "host_timeout_secs", 20.0) or 20.0
            if now - since >= timeout:
                down.append(host)
                for task in mine:
                    state = state.with_task(replace(task, status="unreachable"))
        if not down:
            return state
        state = self.store.write(state)
        lost = ", ".join(t.name for t in state.tasks if t.host in down)
        self._say(
            f"host(s) {', '.join(down)} unreachable for "
            f"{now - min(self._unreachable_since[h] for h in down):.0f}s: lost {lost}"
        )
        for host in down:
            del self._unreachable_since[host]
        anyone = next(t for t in state.tasks if t.host in down)
        if anyone.settings.get("on_host_failure", "replace") == "replace" and self._done_at is None:
            return self._replan(state)
        return state

    def _replan(self, state: State) -> State:
        """Plan again from the config the state carries (the down hosts get no task) and apply
        it: every task restarts with the new cluster spec, the chief from the last checkpoint."""
        from tfplan.applier import apply_plan
        from tfplan.compose import config_from_dict
        from tfplan.planner import PlanContext, plan

        if not state.config:
            self._say("the state carries no config to re-plan from: run `tfplan plan` and `apply`")
            return state
        new_plan = plan(
            config_from_dict(state.config["config"]), state, PlanContext(**state.config["context"])
        )
        self._say("re-planning the cluster on the hosts that answer")
        for stream in self._streams.values():
            stream.stop()
        self._streams.clear()
        self._pending.clear()
        result = apply_plan(new_plan, self.store, self.pool, self._say)
        for task in result.state.tasks:
            if task.status == "running":
                self._follow(task)
        return result.state

    def _on_ended(self, task: TaskState) -> None:
        shown = _exit(task)
        if self._done_at is not None or (_is_chief(task) and task.status == "succeeded"):
            self._say(f"{task.name} {task.status} ({shown})")
            return
        decision = decide_restart(
            task.settings.get("restart_policy", "Never"),
            task.exit_code,
            task.restarts,
            int(_setting(task, "backoff_limit", 0) or 0),
        )
        if decision.restart:
            delay = backoff_delay(_setting(task, "backoff_secs", 1.0) or 0.0, task.restarts)
            self._pending[task.name] = time.monotonic() + delay
            self._say(
                f"{task.name} {task.status} ({shown}): restarting in {delay:.1f}s ({decision.reason})"
            )
        else:
            note = "" if task.status == "succeeded" else f"; not restarted: {decision.reason}"
            if note and task.role in ("worker", "evaluator") and not _is_chief(task):
                note += "; the other tasks go on"
            self._say(f"{task.name} {task.status} ({shown}){note}")

    # Importing TensorFlow and joining the cluster can take tens of seconds on a busy host:
    # the progress timeout starts with a task's first log line; before it, this much is allowed.
    STARTUP_TIMEOUT_SECS = 120.0

    def _kill_hung(self, state: State) -> State:
        now = time.monotonic()
        hung: list[tuple[TaskState, float]] = []
        for task in state.tasks:
            timeout = _setting(task, "progress_timeout_secs", None)
            if task.status != "running" or timeout is None or self._done_at is not None:
                continue
            last = self._last_line.get(task.name)
            if last is None:
                last = self._life_started.get(task.name, now)
                timeout = max(timeout, self.STARTUP_TIMEOUT_SECS)
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
            state, hung_tasks, self.store, self.pool, self._say, forget=False, grace_secs=0.5
        )
        for task in hung_tasks:
            dead = replace(task, status="failed", exit_code=None)
            state = state.with_task(dead)
            self._on_ended(dead)
        return self.store.write(state)

    def _restart_due(self, state: State) -> State:
        now = time.monotonic()
        for name, when in sorted(self._pending.items()):
            task = state.task(name)
            if when > now or task is None:
                continue
            del self._pending[name]
            if self._done_at is not None:
                continue
            try:
                state = self._restart(state, task)
            except TfplanError as error:
                self._say(f"{name}: restart failed ({error})")
        return state

    def _restart(self, state: State, task: TaskState) -> State:
        executor = self.pool[task.host]
        rotated = f"{task.log_path}.{task.restarts}"
        executor.run_script(
            f"mv -f {shlex.quote(task.log_path)} {shlex.quote(rotated)} 2>/dev/null; true",
            f"keep the log of {task.name}",
        )
        spec = task.spec
        launched = executor.start(
            LaunchSpec(
                name=task.name,
                command=tuple(spec["command"]),
                env=dict(spec["env"]),
                workdir=task.workdir,
                log_path=task.log_path,
            )
        )
        new = replace(
            task,
            pid=launched.pid,
            pgid=launched.pgid,
            started_at=launched.started_at,
            status="running",
            exit_code=None,
            restarts=task.restarts + 1,
        )
        state = self.store.write(state.with_task(new))
        self._say(
            f"{task.name}: restarted on {task.host} (pid {launched.pid}, restart "
            f"{new.restarts}; previous log kept as {rotated})"
        )
        self._follow(new)
        return state

    def _decide(self, state: State) -> Outcome | None:
        """The job-level lifecycle: None while the job goes on, else how it ended."""
        now = time.monotonic()
        running = [t for t in state.tasks if t.status == "running"]
        chief = next((t for t in state.tasks if _is_chief(t)), None)
        if chief is not None and chief.status == "succeeded" and self._done_at is None:
            self._done_at = now
            self._pending.clear()
        if self._done_at is not None:
            overdue = [t for t in running if now - self._done_at >= self._grace(t, chief)]
            if overdue:
                names = ", ".join(t.name for t in overdue)
                self._say(f"training is over; stopping {names}, which did not exit by themselves")
                state = stop_tasks(state, overdue, self.store, self.pool, self._say, forget=False)
                running = [t for t in running if t not in overdue]
            if not running:
                return self._finish(state, True, f"{chief.name if chief else 'chief'} succeeded")
            return None
        final = [
            t
            for t in state.tasks
            if t.status in ("failed", "unreachable") and t.name not in self._pending
        ]
        failed_chief = next((t for t in final if _is_chief(t)), None)
        failed_ps = next((t for t in final if t.role == "ps"), None)
        deadline = _setting(chief, "deadline_secs", None) if chief else None
        reason = None
        if failed_chief is not None:
            reason = f"{failed_chief.name} failed ({_exit(failed_chief)})"
            if failed_chief.settings.get("on_chief_failure", "teardown") == "keep":
                return self._finish(state, False, reason)
        elif failed_ps is not None:
            reason = f"{failed_ps.name} failed ({_exit(failed_ps)}) and is not restarted"
        elif deadline is not None and now - self._started > deadline:
            reason = f"the deadline of {deadline:.0f}s passed"
        if reason is not None:
            if running:
                self._say(f"{reason}: tearing down the cluster")
                state = stop_tasks(state, running, self.store, self.pool, self._say, forget=False)
            return self._finish(state, False, reason)
        if not running and not self._pending:
            return self._finish(state, False, "every task ended but the chief never succeeded")
        return None

    @staticmethod
    def _grace(task: TaskState, chief: TaskState | None) -> float:
        """How long after the chief's success a task may take to exit by itself."""
        key = "evaluator_grace_secs" if task.role == "evaluator" else "ps_grace_secs"
        default = 120.0 if task.role == "evaluator" else 5.0
        return _setting(chief or task, key, default) or 0.0

    def _finish(self, state: State, ok: bool, reason: str) -> Outcome:
        time.sleep(0.2)  # the last lines of the logs
        self._drain()
        return Outcome(ok, reason, state, self.last_step)
