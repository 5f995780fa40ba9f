"""Helpers the CLI verbs share: the console, the workspace, composing, approval, the backend of
a stored experiment.

Hydra (about 0.4 s to import) is loaded only by the verbs that compose a config, so that
status, logs and destroy start fast even on a host whose cores are busy training.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tfplan.cli.render import SUMMARY_THRESHOLD, Line, print_lines
from tfplan.engine.store import StateStore
from tfplan.engine.workspace import Workspace
from tfplan.errors import ConfigError, StateError, TfplanError
from tfplan.planning.state import State

if TYPE_CHECKING:
    from rich.console import Console

    from tfplan.backends.api import Backend
    from tfplan.config.schema import Config

# The key of the experiment's id in the config: ``-e ID`` is another way to say it.
EXPERIMENT_KEY = "experiment.id"

__all__ = [
    "EXPERIMENT_KEY",
    "add_experiment_arguments",
    "add_experiment_option",
    "add_size_arguments",
    "add_target_argument",
    "approved",
    "backend_of",
    "compose",
    "console",
    "err_console",
    "is_experiment_word",
    "load_experiment",
    "refuse_targets_in_sweeps",
    "settle_experiment",
    "show_lines",
    "workspace_from",
]


def console() -> Console:
    """stdout; when piped, wide enough that tables do not fold (scripts grep them)."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=True, width=width)


def err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def show_lines(lines: list[Line]) -> None:
    """Rendered lines to stdout: through rich on a terminal (colours), else as plain text,
    without loading rich at all (a tenth of a small plan's time)."""
    if sys.stdout.isatty():
        print_lines(lines, console())
    else:
        sys.stdout.write("".join(f"{text}\n" for _, text in lines))
        sys.stdout.flush()


def workspace_from(path: str | None) -> Workspace:
    return Workspace(Path(path) if path else None)


def compose(overrides: list[str], config_dir: str | None) -> Config:
    from tfplan.config.compose import compose_config, to_config

    return to_config(compose_config(overrides, config_dir))


def approved(out: Console, question: str, auto_approve: bool, flag: str = "--auto-approve") -> bool:
    """Terraform's approval: only ``yes`` approves; without a terminal, ``flag`` is required.

    Raises:
        TfplanError: stdin is not a terminal and ``auto_approve`` is not set.
    """
    if auto_approve:
        return True
    if not sys.stdin.isatty():
        raise TfplanError(f"this needs approval and stdin is not a terminal: pass {flag}")
    out.print(f"\n{question}\n  Only 'yes' will be accepted to approve.\n")
    return input("  Enter a value: ").strip() == "yes"


def load_experiment(args: argparse.Namespace) -> tuple[StateStore, State]:
    """The store and state of ``-e EXPERIMENT`` (or the only experiment) in the workspace.

    Raises:
        StateError: no such experiment, several to choose from, or nothing applied.
    """
    workspace = workspace_from(args.workspace)
    experiment = workspace.resolve_experiment(args.experiment)
    store = workspace.store(experiment)
    state = store.load()
    if state is None:
        raise StateError(
            f"experiment {experiment!r} has no state in {workspace.root}: nothing was applied"
        )
    return store, state


def backend_of(store: StateStore, state: State) -> Backend:
    """The backend that runs the state's tasks (open it in a ``with``)."""
    from tfplan.backends import open_backend

    if state.backend is None:
        raise StateError(f"{store.path} names no backend: nothing was started from it")
    return open_backend(state.backend, store.scratch)


def add_target_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """Terraform's ``-target``, for repairs by hand on a large cluster."""
    parser.add_argument(
        "-target",
        "--target",
        dest="targets",
        action="append",
        default=[],
        metavar="NAME",
        help=f"{what} this task (worker/3) or role (worker) only; repeatable. For exceptional "
        "situations such as repairing a task by hand, not for routine use",
    )


def refuse_targets_in_sweeps(args: argparse.Namespace) -> None:
    """A sweep plans whole clusters, one per point: ``-target`` has nothing to narrow there.

    Raises:
        TfplanError: both were given.
    """
    if getattr(args, "multirun", False) and getattr(args, "targets", None):
        raise TfplanError("-target does not combine with -m: a sweep runs whole clusters")


def add_size_arguments(parser: argparse.ArgumentParser) -> None:
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--full",
        dest="render",
        action="store_const",
        const="full",
        default="auto",
        help="print every task's block with its TF_CONFIG, however large the cluster",
    )
    size.add_argument(
        "--summary",
        dest="render",
        action="store_const",
        const="summary",
        help=f"summarise the tasks to create by role and host (the default above "
        f"{SUMMARY_THRESHOLD} tasks)",
    )


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    """``-e ID`` (or ``experiment.id=ID``, as plan and apply take it) and ``--workspace``."""
    add_experiment_option(parser, "experiment id (default: the only one)", word=True)
    parser.add_argument("--workspace", help="workspace folder (default: .tfplan)")


def add_experiment_option(parser: argparse.ArgumentParser, what: str, word: bool) -> None:
    """``-e ID``. With ``word``, the verb takes no Hydra overrides, and an ``experiment.id=ID``
    among its words means the same (tfplan.cli.main takes it out before argparse sees it, so
    that it is not read as a task or a file); plan and apply read that word as an override."""
    parser.add_argument(
        "-e", "--experiment", metavar="ID", help=f"{what}; experiment.id=ID says the same"
    )
    if word:
        parser.set_defaults(experiment_word=True)


def is_experiment_word(word: str) -> bool:
    """``experiment.id=ID``, as a Hydra override names the experiment (``+``/``++`` too)."""
    key, sep, _ = word.partition("=")
    return bool(sep) and key.lstrip("+") == EXPERIMENT_KEY


def settle_experiment(args: argparse.Namespace, words: list[str]) -> None:
    """One experiment id from ``-e ID`` and ``experiment.id=ID`` (``words`` taken out of the
    command line, or the verb's own overrides): on ``args.experiment``, and for plan and apply
    among their overrides too, where ``-e ID`` means ``experiment.id=ID``.

    Raises:
        ConfigError: they name different experiments.
    """
    overrides: list[str] | None = getattr(args, "overrides", getattr(args, "args", None))
    named = [*words, *(w for w in overrides or [] if is_experiment_word(w))]
    given = [args.experiment] if args.experiment else []
    ids = list(dict.fromkeys([*given, *(w.partition("=")[2] for w in named)]))
    if len(ids) > 1:
        shown = " and ".join(dict.fromkeys([*(f"-e {i}" for i in given), *named]))
        raise ConfigError(
            EXPERIMENT_KEY,
            f"{shown} name different experiments",
            "give the id once, as -e ID or experiment.id=ID",
        )
    if not ids:
        return
    if overrides is not None and not named:
        overrides.append(f"{EXPERIMENT_KEY}={ids[0]}")
    args.experiment = ids[0]
