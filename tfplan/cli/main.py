"""The `tfplan` command: parse, dispatch to one verb, and print known errors as one line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tfplan import __version__
from tfplan.errors import TfplanError

__all__ = ["main", "build_parser"]


VERBS = (
    "cmd_plan",  # plan, show
    "cmd_apply",
    "cmd_status",
    "cmd_logs",
    "cmd_watch",
    "cmd_destroy",
    "cmd_export",
    "cmd_report",
    "cmd_tensorboard",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="tfplan",
        description="Plan and apply distributed TensorFlow clusters (ps, workers, chief, evaluator).",
    )
    parser.add_argument("--version", action="version", version=f"tfplan {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for verb in VERBS:
        importlib.import_module(f"tfplan.cli.{verb}").add_parsers(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        code: int = args.func(args)
        return code
    except TfplanError as error:
        if os.environ.get("TFPLAN_DEBUG") == "1":
            raise
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
