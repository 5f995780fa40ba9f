"""`tfplan status`, `tfplan logs [TASK] [-f]` and `tfplan destroy`."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any

from rich.table import Table

from tfplan.applier import stop_tasks
from tfplan.commands.common import console, workspace_from
from tfplan.commands.output import LogPrinter, step_progress
from tfplan.errors import ApplyError, StateError, TfplanError
from tfplan.hosts import HostPool
from tfplan.state import State, StateStore, TaskState
from tfplan.supervisor import STEP_PATTERN, Supervisor, collect_status

__all__ = ["add_parsers"]

_TAIL_BYTES = 8192


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = subparsers.add_parser("status", help="every task: host, PID, state, CPU, memory, step")
    status.add_argument("-e", "--experiment", help="experiment id (default: the only one)")
    status.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    status.set_defaults(func=run_status)

    logs = subparsers.add_parser("logs", help="print (or follow) the tasks' logs")
    logs.add_argument("task", nargs="?", help="one task, e.g. worker/1 (default: all)")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the tasks end")
    logs.add_argument("-n", "--lines", type=int, default=0, help="only the last N lines per task")
    logs.add_argument("-e", "--experiment", help="experiment id (default: the only one)")
    logs.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    logs.set_defaults(func=run_logs)

    watch = subparsers.add_parser(
        "watch",
        help="take supervision of running tasks back (after tfplan itself was stopped or killed)",
    )
    watch.add_argument("-e", "--experiment", help="experiment id (default: the only one)")
    watch.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    watch.set_defaults(func=run_watch)

    destroy = subparsers.add_parser("destroy", help="stop every task of an experiment")
    destroy.add_argument("-e", "--experiment", help="experiment id (default: the only one)")
    destroy.add_argument(
        "--auto-approve",
        "-auto-approve",
        action="store_true",
        help="do not ask (only asked on a terminal)",
    )
    destroy.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    destroy.set_defaults(func=run_destroy)


def _load(args: argparse.Namespace) -> tuple[StateStore, State]:
    workspace = workspace_from(args.workspace)
    experiment = workspace.resolve_experiment(args.experiment)
    store = workspace.store(experiment)
    state = store.load()
    if state is None:
        raise StateError(
            f"experiment {experiment!r} has no state in {workspace.root}: nothing was applied"
        )
    return store, state


def run_status(args: argparse.Namespace) -> int:
    _, state = _load(args)
    out = console()
    table = Table(
        title=f"experiment {state.experiment_id} · cluster {state.cluster_name} · serial {state.serial}"
    )
    for column in ("task", "host", "pid", "state", "uptime", "cpu %", "rss", "step", "last line"):
        table.add_column(column, overflow="fold")
    with HostPool(state.hosts) as pool:
        infos = collect_status(state, pool)
        now = time.time()
        for task in sorted(state.tasks, key=_order):
            info = infos.get(task.name)
            status, cpu, rss = task.status, "", ""
            if isinstance(info, BaseException):
                status = "unreachable"
            elif info is not None:
                if info.alive:
                    cpu = f"{info.cpu_percent:.0f}" if info.cpu_percent is not None else ""
                    rss = f"{(info.rss_bytes or 0) / 2**20:.0f} MiB"
                else:
                    status = "succeeded" if info.exit_code == 0 else f"failed ({info.exit_code})"
            step, last = _tail(pool, task)
            uptime = f"{now - task.started_at:.0f}s" if status == "running" else ""
            restarts = f" ↻{task.restarts}" if task.restarts else ""
            table.add_row(
                task.name, task.host, str(task.pid), status + restarts, uptime, cpu, rss, step, last
            )
    out.print(table)
    return 0


def _order(task: TaskState) -> tuple[int, int]:
    return ({"ps": 0, "chief": 1, "worker": 2, "evaluator": 3}.get(task.role, 9), task.index)


def _tail(pool: HostPool, task: TaskState) -> tuple[str, str]:
    """(last global step seen, last line) of the task's log."""
    try:
        data, _ = pool[task.host].read_log(task.log_path, -_TAIL_BYTES)
    except Exception:  # noqa: BLE001 - status shows what it can
        return "", "(log unreadable)"
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    steps = [m.group(1) for line in lines if (m := STEP_PATTERN.search(line))]
    last = lines[-1] if lines else ""
    return (steps[-1] if steps else ""), (last if len(last) <= 80 else last[:77] + "...")


def run_logs(args: argparse.Namespace) -> int:
    store, state = _load(args)
    tasks = [t for t in sorted(state.tasks, key=_order) if args.task in (None, t.name)]
    if not tasks:
        names = ", ".join(t.name for t in state.tasks)
        raise StateError(
            f"no task {args.task!r} in experiment {state.experiment_id}: choose one of {names}"
        )
    printer = LogPrinter(console())
    with HostPool(state.hosts) as pool:
        if args.follow and any(t.status == "running" for t in tasks):
            _follow(state, tasks, store, pool, printer)
            return 0
        for task in tasks:
            data, _ = pool[task.host].read_log(task.log_path, 0)
            lines = data.decode(errors="replace").splitlines()
            for line in lines[-args.lines :] if args.lines else lines:
                printer.emit(task.name, line)
    return 0


def _follow(
    state: State, tasks: list[TaskState], store: StateStore, pool: HostPool, printer: LogPrinter
) -> None:
    names = {t.name for t in tasks}

    def emit(name: str, line: str) -> None:
        if name in names:
            printer.emit(name, line)

    follower = _Follower(store, pool, emit)
    try:
        follower.follow(state, names)
    except KeyboardInterrupt:
        follower.close()


class _Follower(Supervisor):
    """Streams logs until the chosen tasks end, without any lifecycle action."""

    def follow(self, state: State, names: set[str]) -> None:
        subset = replace(state, tasks=tuple(t for t in state.tasks if t.name in names))
        for task in subset.tasks:
            if task.status == "running":
                self._follow(task)
        try:
            while True:
                self._drain()
                infos: dict[str, Any] = collect_status(subset, self.pool)
                if all(
                    i is None or isinstance(i, BaseException) or not i.alive for i in infos.values()
                ):
                    time.sleep(0.3)
                    self._drain()
                    return
                time.sleep(0.3)
        finally:
            self.close()

    def close(self) -> None:
        self._stop_streams()
        self._drain()


def run_watch(args: argparse.Namespace) -> int:
    """Supervise an experiment's tasks exactly as an attached apply does, from its state."""
    store, state = _load(args)
    out = console()
    if not any(t.status == "running" for t in state.tasks):
        out.print(f"Nothing runs in experiment {state.experiment_id}; see `tfplan status`.")
        return 0
    printer = LogPrinter(out)
    with store.lock("watch"), HostPool(state.hosts) as pool:
        state = store.load() or state
        out.print(
            f"Watching {sum(t.status == 'running' for t in state.tasks)} running task(s) of "
            f"experiment {state.experiment_id}"
        )
        with step_progress(out, None) as on_step:
            outcome = Supervisor(store, pool, printer.emit, on_step=on_step).run(state)
    if not outcome.succeeded:
        raise ApplyError(
            f"training failed: {outcome.reason}; see `tfplan logs -e {state.experiment_id}`"
        )
    out.print(f"Training complete: {outcome.reason}.")
    return 0


def _stop_lost(state: State, store: StateStore, pool: HostPool, say: Any) -> list[TaskState]:
    """Stop the tasks left on hosts that were unreachable; return those still out of reach."""
    remaining = []
    for task in state.lost:
        try:
            pool[task.host].stop(
                task.pid, task.pgid, float(task.settings.get("stop_grace_secs", "5"))
            )
            say(f"Stopped {task.name} left on {task.host} (pid {task.pid})")
        except TfplanError as error:
            say(f"{task.name} on {task.host}: {error}")
            remaining.append(task)
    if len(remaining) != len(state.lost):
        store.write(replace(state, lost=tuple(remaining)))
    return remaining


def run_destroy(args: argparse.Namespace) -> int:
    store, state = _load(args)
    out = console()
    running = [t for t in state.tasks if t.status == "running"]
    if running and sys.stdin.isatty() and not args.auto_approve:
        out.print(f"tfplan will stop {len(running)} task(s) of experiment {state.experiment_id}.")
        if input("Only 'yes' will be accepted to approve: ").strip() != "yes":
            out.print("Destroy cancelled.")
            return 1
    started = time.monotonic()
    with store.lock("destroy"), HostPool(state.hosts) as pool:
        state = store.load() or state
        say = lambda line: out.print(f"tfplan | {line}")  # noqa: E731
        state = stop_tasks(state, list(state.tasks), store, pool, say, forget=True)
        left = [
            n
            for n, i in collect_status(state, pool).items()
            if i is not None and not isinstance(i, BaseException) and i.alive
        ]
        if left:
            raise ApplyError(
                f"still running after destroy: {', '.join(left)}; run `tfplan destroy` again"
            )
        unreachable = _stop_lost(state, store, pool, say)
        if unreachable:
            raise ApplyError(
                f"{len(unreachable)} task(s) left on unreachable hosts "
                f"({', '.join(f'{t.name} pid {t.pid} on {t.host}' for t in unreachable)}): "
                "run `tfplan destroy` again once the host answers"
            )
    out.print(
        f"Destroy complete! {len(running)} task(s) stopped, state cleared "
        f"({time.monotonic() - started:.1f}s)."
    )
    return 0
