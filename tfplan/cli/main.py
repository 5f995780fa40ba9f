"""The `tfplan` command: parse, dispatch to one verb, and print known errors as one line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from tfplan import __version__
from tfplan.errors import TfplanError

__all__ = ["Terminated", "main", "build_parser"]

# What `kill`, `timeout`, systemd, Slurm and a closed terminal send: an attached apply, a sweep,
# a watch stop what they started, as Ctrl-C does, instead of dying and leaving the cluster and
# its warm seeds running unsupervised. A signal already ignored (nohup) stays ignored.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """A stop signal, raised where Ctrl-C's KeyboardInterrupt would be: the same teardown."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_on_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # (main() called in a thread: the caller's signals are its own)

    def stop(signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_IGN)  # a repeat must not cut the teardown short
        raise Terminated(signum)

    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, stop)


# verb -> the module that defines it. Only the named verb's module is imported: `tfplan plan`
# needs neither the supervisor nor the sweep machinery, and importing every verb cost as much
# as a third of a small plan.
VERBS = {
    "plan": "cmd_plan",
    "show": "cmd_plan",
    "apply": "cmd_apply",
    "status": "cmd_status",
    "explain": "cmd_explain",
    "logs": "cmd_logs",
    "watch": "cmd_watch",
    "destroy": "cmd_destroy",
    "export": "cmd_export",
    "report": "cmd_report",
    "tensorboard": "cmd_tensorboard",
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser: of the verb ``argv`` names only, else of every verb (help, a typo)."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="tfplan",
        description="Plan and apply distributed TensorFlow clusters (ps, workers, chief, evaluator).",
    )
    parser.add_argument("--version", action="version", version=f"tfplan {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    verb = next((a for a in (argv or ()) if not a.startswith("-")), None)
    modules = [VERBS[verb]] if verb in VERBS else list(dict.fromkeys(VERBS.values()))
    for module in modules:
        importlib.import_module(f"tfplan.cli.{module}").add_parsers(subparsers)
    return parser


def parse(parser: argparse.ArgumentParser, given: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, with Hydra overrides allowed on both sides of an option.

    argparse takes the positional overrides as one run, so ``plan cluster=local --no-save
    algo=sync`` would refuse ``algo=sync``; words after an option that are not options join the
    overrides instead. A verb that names an experiment with ``-e ID`` but takes no overrides
    (status, logs, ...) takes ``experiment.id=ID`` too, as plan and apply do: those words are
    kept in ``args.experiment_words`` (see :func:`tfplan.cli.common.settle_experiment`).
    Anything else unknown is argparse's usual error.
    """
    words: list[str] = []
    verb = _verb_parser(parser, given)
    if verb is not None and verb.get_default("experiment_word"):
        from tfplan.cli.common import is_experiment_word

        words = [w for w in given if is_experiment_word(w)]
        given = [w for w in given if not is_experiment_word(w)]
    args, extra = parser.parse_known_args(given)
    args.experiment_words = words
    if extra and hasattr(args, "overrides") and not any(w.startswith("-") for w in extra):
        args.overrides = [*(args.overrides or []), *extra]
        return args
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _verb_parser(
    parser: argparse.ArgumentParser, given: list[str]
) -> argparse.ArgumentParser | None:
    """The parser of the verb ``given`` names, if it names one."""
    verb = next((a for a in given if not a.startswith("-")), None)
    for action in parser._actions:  # argparse lists the verbs' parsers nowhere else
        if isinstance(action, argparse._SubParsersAction) and verb in action.choices:
            found: argparse.ArgumentParser = action.choices[verb]
            return found
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    given = list(argv) if argv is not None else sys.argv[1:]
    args = parse(build_parser(given), given)
    _stop_on_signals()
    try:
        if hasattr(args, "experiment"):
            from tfplan.cli.common import settle_experiment

            settle_experiment(args, args.experiment_words)
        code: int = args.func(args)
        return code
    except TfplanError as error:
        if os.environ.get("TFPLAN_DEBUG") == "1":
            raise
        print(f"error: {error}", file=sys.stderr)
        return 1
    except Terminated as stopped:
        print(f"stopped by {signal.Signals(stopped.signum).name}", file=sys.stderr)
        return 128 + stopped.signum
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`tfplan show --json | head`): not an error of ours. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
