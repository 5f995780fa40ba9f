"""`tfplan tensorboard [EXPERIMENT|SWEEP|DIR]`: TensorBoard on a run's folder, URL printed."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from tfplan.cli.common import add_experiment_option, console, workspace_from
from tfplan.errors import ConfigError

__all__ = ["add_parsers", "run_tensorboard"]


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    board = subparsers.add_parser(
        "tensorboard",
        help="start TensorBoard on an experiment or a sweep and print its URL",
        description="TARGET is an experiment id, a sweep id, or a folder (default: the latest "
        "experiment or sweep applied from here). A sweep shows one run per point.",
    )
    board.add_argument("target", nargs="?", metavar="EXPERIMENT|SWEEP|DIR")
    add_experiment_option(board, "the experiment (the same as TARGET)", word=True)
    board.add_argument("--port", type=int, help="default: 6006 when free, else any free port")
    board.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: loopback only)"
    )
    board.add_argument(
        "--detach",
        action="store_true",
        help="leave TensorBoard running and return (stop it with kill PID)",
    )
    board.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    board.set_defaults(func=run_tensorboard)


def run_tensorboard(args: argparse.Namespace) -> int:
    from tfplan.cli.board import start_tensorboard
    from tfplan.engine.experiment import find_output

    out = console()
    workspace = workspace_from(args.workspace)
    target = _target(args.target, args.experiment)
    if target and Path(target).is_dir():
        folder = Path(target).absolute()
        kind = "sweep" if (folder / "sweep.json").is_file() else "experiment"
    else:
        kind, folder = find_output(workspace, target)
    log_path = workspace.root / "tensorboard" / f"{folder.name}.log"
    board = start_tensorboard(folder, log_path, host=args.host, port=args.port)
    out.print(f"TensorBoard on {kind} {folder}: {board.url} (pid {board.process.pid})")
    if args.detach:
        out.print(f"Detached; stop it with: kill {board.process.pid}")
        return 0
    out.print("Press Ctrl-C to stop it.")
    try:
        board.process.wait()
    except KeyboardInterrupt:
        board.process.send_signal(signal.SIGTERM)
        board.process.wait(timeout=10)
        return 0
    return board.process.returncode or 0


def _target(given: str | None, experiment: str | None) -> str | None:
    """TARGET, or the experiment ``-e ID`` (``experiment.id=ID``) names: one of them.

    Raises:
        ConfigError: both were given, naming different things.
    """
    if given and experiment and given != experiment:
        raise ConfigError(
            "experiment.id",
            f"TARGET {given} and experiment {experiment} differ",
            "give one of them: tfplan tensorboard ID (or -e ID)",
        )
    return experiment or given
