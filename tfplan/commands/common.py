"""Helpers the CLI verbs share: the console, the plan context, composing and planning."""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from tfplan.plan import Plan
from tfplan.state import State
from tfplan.workspace import Workspace

if TYPE_CHECKING:
    from tfplan.config import Config
    from tfplan.planner import PlanContext

# Hydra (about 0.4 s to import) is loaded only by the verbs that compose a config, so that
# status, logs and destroy start fast even on a host whose cores are busy training.

__all__ = ["console", "err_console", "plan_context", "make_plan", "tf_version", "workspace_from"]


def console() -> Console:
    """stdout; when piped, wide enough that tables do not fold (scripts grep them)."""
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=True, width=width)


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def tf_version() -> str:
    """The installed TensorFlow's version, read from package metadata (no import: 2 s saved)."""
    for dist in ("tensorflow-cpu", "tensorflow", "tf-nightly"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def plan_context() -> PlanContext:
    from tfplan.planner import PlanContext

    return PlanContext(cwd=os.getcwd(), local_python=sys.executable, tf_version=tf_version())


def workspace_from(path: str | None) -> Workspace:
    return Workspace(Path(path) if path else None)


def compose(overrides: list[str], config_dir: str | None) -> Config:
    from tfplan.compose import compose_config, to_config

    return to_config(compose_config(overrides, Path(config_dir).absolute() if config_dir else None))


def make_plan(cfg: Config, state: State | None) -> Plan:
    from tfplan.planner import plan

    return plan(cfg, state, plan_context())
