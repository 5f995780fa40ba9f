"""Entry point of every task: ``python -m recipes.train --config run.yaml``.

Dispatches on TF_CONFIG's task type: ``ps`` serves variables until every replica is done,
``worker``/``chief`` train, ``evaluator`` scores checkpoints. The TF2 strategies (``algo=allreduce``,
``algo=pss``, see ``recipes/strategies``) run eagerly and take every role but the evaluator's.
Known errors (``recipes/errors.py``: config, data, NaN loss, a dead peer) print one line on
stderr and exit with their code; an exception of the user's own code (a model or data factory, a
loss) prints that line and the innermost frames of the user's files; ``TFPLAN_DEBUG=1`` shows the
whole traceback of any error.

Exit codes: 0 done; 1 a failure at run time (the user's code raised, or an unexpected error);
2 bad config or data; 3 NaN loss; 4 peer timeout; 5 the group lost a member (allreduce: a peer;
pss: a ps): restart the group, it resumes from the last checkpoint.

Warm standby (``TFPLAN_STANDBY=1``, docs/contract.md): import TensorFlow and everything the task
needs, say so, then wait for SIGUSR1 without binding the task's port; on it, run as the task.
tfplan keeps one per parameter server, so that a restarted ps does not pay the import.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

PROCESS_START = time.time()
# Why here: TensorFlow reads these at import time (see docs/contract.md, TENSORFLOW.md pitfall 8).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import argparse  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

from recipes.config import load_run_config, task_from_env  # noqa: E402
from recipes.errors import ConfigError, report_failure  # noqa: E402
from recipes.scratch import SCRATCH_PREFIX, use_scratch  # noqa: E402

__all__ = ["STANDBY_ENV", "main"]

STANDBY_ENV = "TFPLAN_STANDBY"


def _log(message: str) -> None:
    print(message, flush=True)


def _run(config_path: str) -> int:
    cfg = load_run_config(config_path)
    task = dataclasses.replace(task_from_env(), run_yaml=config_path)
    use_scratch(Path.cwd() / f"{SCRATCH_PREFIX}{task.type}-{task.index}")
    if task.type not in ("ps", "worker", "chief", "evaluator"):
        raise ConfigError(f"unknown task type '{task.type}'; valid: ps, worker, chief, evaluator")
    from recipes.strategies import is_strategy

    strategy = is_strategy(cfg.algo.name) and task.type != "evaluator"
    if task.type != "evaluator" and not strategy and not task.cluster.get("ps"):
        raise ConfigError(
            f"TF_CONFIG's cluster has no 'ps' job; algo={cfg.algo.name} needs one "
            "(algo=allreduce trains without)"
        )
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    if strategy:
        from recipes.strategies import run_task

        return run_task(cfg, task, PROCESS_START, _log)
    exporter = None
    if task.is_chief:
        from recipes.export import start_export

        # before eager execution goes: the exporter forks from here with TensorFlow imported
        exporter = start_export(cfg, config_path, _log)
    tf.compat.v1.disable_eager_execution()
    _quiet_cancelled_threads(tf.errors.CancelledError)
    if task.type == "ps":
        from recipes.ps_snapshots import SnapshotFolder
        from recipes.runtime import run_ps

        folder = SnapshotFolder(cfg.snapshots.folder, cfg.output_dir, task.index)
        if cfg.snapshots.secs > 0:
            folder.prepare(_log)
        return run_ps(task, _log, on_exit=folder.remove)
    if task.type == "evaluator":
        from recipes.evaluator import run_evaluator

        return run_evaluator(cfg, _log, partitions=task.n_ps)
    from recipes.replica import run_replica

    return run_replica(cfg, task, PROCESS_START, _log, exporter)


def _stand_by(config_path: str) -> None:
    """Prepare everything that does not bind the port, then wait for SIGUSR1 (the go signal).

    Why block first: every thread TensorFlow starts inherits the mask, so a SIGUSR1 that comes
    while TensorFlow is still importing stays pending for the wait instead of ending the
    process (its default action). Waiting in ``sigtimedwait`` (woken twice a second to let a
    SIGTERM handler run) costs no measurable CPU.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    began = time.monotonic()
    cfg = load_run_config(config_path)
    task = task_from_env()
    name = f"{task.type}/{task.index}"

    def stopped(signum: int, frame: object) -> None:
        # Stopped without ever serving (the end of a run, often while still importing): a line
        # of its own and exit 0 at once, instead of dying of SIGTERM (its shell wrapper printed
        # "Terminated" into the run's output) or the interpreter's teardown of TensorFlow.
        os.write(
            sys.stdout.fileno(), f"standby for {name}: stopped before it was needed\n".encode()
        )
        os._exit(0)

    signal.signal(signal.SIGTERM, stopped)
    import tensorflow as tf

    from recipes.strategies import is_strategy

    if is_strategy(cfg.algo.name) and task.type != "evaluator":
        from recipes.strategies import run_task  # noqa: F401 - eager, as _run runs it
    else:
        tf.compat.v1.disable_eager_execution()
        if task.type == "ps":
            import recipes.runtime  # noqa: F401 - what run_ps needs, imported ahead
        elif task.type == "evaluator":
            import recipes.evaluator  # noqa: F401
        else:
            import recipes.replica  # noqa: F401
    _log(
        f"standby for {name}: ready in {time.monotonic() - began:.1f}s (TensorFlow imported); "
        "waiting for SIGUSR1"
    )
    # sigtimedwait, not sigwait: the SIGTERM handler can only run between two waits
    while signal.sigtimedwait({signal.SIGUSR1}, 0.5) is None:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # from here on stopped as any task is
    os.environ.pop(STANDBY_ENV, None)
    _log(f"standby for {name}: taking over")


def _quiet_cancelled_threads(cancelled: type) -> None:
    """Why: closing a session cancels the sync chief's queue-runner thread, which then prints a
    harmless CancelledError traceback; every other thread error still prints."""
    default = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if not isinstance(args.exc_value, cancelled):
            default(args)

    threading.excepthook = hook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.train", description=__doc__)
    parser.add_argument(
        "--config",
        default=os.environ.get("TFPLAN_RUN_CONFIG", "run.yaml"),
        help="the resolved run config (run.yaml)",
    )
    args = parser.parse_args(argv)
    try:
        if os.environ.get(STANDBY_ENV) == "1":
            _stand_by(args.config)
        return _run(args.config)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - one line (the user's frames), the traceback on demand
        return report_failure(e)


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Why _exit: a started gRPC server keeps non-daemon threads alive after main returns.
    os._exit(exit_code)
