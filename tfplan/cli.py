"""The `tfplan` command: parse, dispatch to one verb, and print known errors as one line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tfplan import __version__
from tfplan.errors import TfplanError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from tfplan.commands import apply as apply_cmd
    from tfplan.commands import inspect as inspect_cmd
    from tfplan.commands import plan as plan_cmd
    from tfplan.commands import report as report_cmd
    from tfplan.commands import tensorboard as tensorboard_cmd

    parser = argparse.ArgumentParser(
        prog="tfplan",
        description="Plan and apply distributed TensorFlow clusters (ps, workers, chief, evaluator).",
    )
    parser.add_argument("--version", action="version", version=f"tfplan {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    plan_cmd.add_parsers(subparsers)
    apply_cmd.add_parsers(subparsers)
    inspect_cmd.add_parsers(subparsers)
    report_cmd.add_parsers(subparsers)
    tensorboard_cmd.add_parsers(subparsers)
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
