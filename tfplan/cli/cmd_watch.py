"""`tfplan watch`: supervise an experiment's running tasks exactly as an attached apply does.

For when the process that supervised them is gone (tfplan was killed, the terminal closed). If
a supervisor still runs (a detached apply's background supervisor), watch follows the logs
instead of starting a second one. ``--background`` is how a detached apply starts its own.
"""

from __future__ import annotations

import argparse
import signal
import threading

from tfplan.cli.cmd_logs import follow
from tfplan.cli.common import add_experiment_arguments, backend_of, console, load_experiment
from tfplan.cli.output import LogPrinter, add_all_lines_argument, step_progress
from tfplan.engine.background import supervisor_alive
from tfplan.engine.experiment import ExperimentFolder
from tfplan.engine.lognoise import shows_tf_noise
from tfplan.engine.runner import close_record, supervise_state
from tfplan.engine.supervisor import HandedOver
from tfplan.errors import ApplyError

__all__ = ["add_parsers", "run_watch"]

# A detached apply starts the background supervisor while it still holds the lock.
BACKGROUND_LOCK_WAIT_SECS = 120.0


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watch = subparsers.add_parser(
        "watch",
        help="supervise the running tasks (after tfplan itself was stopped or killed), or follow "
        "the background supervisor of a detached apply",
    )
    watch.add_argument("--background", action="store_true", help=argparse.SUPPRESS)
    add_all_lines_argument(watch)
    add_experiment_arguments(watch)
    watch.set_defaults(func=run_watch)


def run_watch(args: argparse.Namespace) -> int:
    store, state = load_experiment(args)
    out = console()
    if not state.running:
        out.print(f"Nothing runs in experiment {state.experiment_id}; see `tfplan status`.")
        return 0
    printer = LogPrinter(out, args.all_lines or shows_tf_noise(state.config))
    record = state.supervisor
    if not args.background and record is not None and supervisor_alive(record):
        out.print(
            f"Experiment {state.experiment_id} is supervised by pid {record.pid} on "
            f"{record.host}: following its tasks' logs (Ctrl-C stops following only)"
        )
        with backend_of(store, state) as backend:
            follow(backend, state.running, printer)
        return 0
    wait = BACKGROUND_LOCK_WAIT_SECS if args.background else 0.0
    handover = threading.Event()
    if args.background:  # SIGTERM: another tfplan takes over; the tasks run on
        signal.signal(signal.SIGTERM, lambda *_: handover.set())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal of its own to lose
    with store.lock("watch", wait_secs=wait), backend_of(store, state) as backend:
        state = store.load() or state
        if not state.running:
            out.print(f"Nothing runs in experiment {state.experiment_id} any more.")
            return 0
        out.print(
            f"Watching {len(state.running)} running task(s) of experiment {state.experiment_id}"
        )
        try:
            with step_progress(out, None) as on_step:
                outcome = supervise_state(
                    store,
                    backend,
                    state,
                    printer.emit,
                    on_step,
                    detached=args.background,
                    log_path=str(store.folder / "supervisor.log") if args.background else None,
                    handover=handover,
                )
        except HandedOver:
            out.print("Handed over: the tasks run on under another tfplan.")
            return 0
        close_record(
            ExperimentFolder(state.record_dir or state.output_dir),
            store,
            backend,
            "succeeded" if outcome.succeeded else "failed",
            outcome.reason,
            outcome.last_step,
            say=lambda line: out.print(f"tfplan | {line}", highlight=False),
        )
    if not outcome.succeeded:
        raise ApplyError(
            f"training failed: {outcome.reason}; `tfplan explain -e {state.experiment_id}` says "
            f"why, `tfplan logs -e {state.experiment_id}` shows the logs"
        )
    out.print(f"Training complete: {outcome.reason}.")
    return 0
