"""Make a plan: ask the backend where the cluster can run, plan on it, attach its dry run.

The planner is pure and knows no backend; this is where the two meet (the CLI, sweeps and the
supervisor's re-plan all come through here).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from tfplan.errors import ConfigError
from tfplan.planning.context import PlanContext
from tfplan.planning.plan import Plan
from tfplan.planning.state import State

if TYPE_CHECKING:
    from tfplan.config.schema import Config

__all__ = ["make_plan", "plan_context", "replan_from_state", "tf_version"]


TF_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tf-nightly")


def tf_version() -> str:
    """The installed TensorFlow's version, read from package metadata (no import: 2 s saved).

    The version is in the name of the ``.dist-info`` folder; importlib.metadata, which reads
    it otherwise, costs more to import than a small plan takes to make."""
    for dist in TF_DISTRIBUTIONS:
        prefix = dist.replace("-", "_") + "-"
        for entry in sys.path:
            try:
                names = os.listdir(entry or ".")
            except OSError:
                continue
            for name in names:
                if name.startswith(prefix) and name.endswith(".dist-info"):
                    return name[len(prefix) : -len(".dist-info")]
    from importlib import metadata

    for dist in TF_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def plan_context() -> PlanContext:
    return PlanContext(cwd=os.getcwd(), local_python=sys.executable, tf_version=tf_version())


def make_plan(
    cfg: Config,
    state: State | None,
    ctx: PlanContext | None = None,
    targets: Sequence[str] = (),
) -> Plan:
    """The plan of ``cfg`` against ``state`` on the backend ``cfg.cluster.backend`` names,
    narrowed to ``targets`` (``-target``: task names or roles) when given.

    Raises:
        ConfigError: a bad value (the backend's own options included), naming the key, or a
            target that names no task.
        PlanError: the tasks do not fit.
    """
    from tfplan.backends import backend_class
    from tfplan.planning.planner import plan

    backend = backend_class(cfg.cluster.backend)
    if cfg.cluster.firewall and not backend.capabilities.firewall:
        raise ConfigError(
            "cluster.firewall",
            f"the {backend.name} backend cannot install firewall rules",
            "set cluster.firewall=false and restrict the ports with what that platform offers "
            "(e.g. a NetworkPolicy on Kubernetes)",
        )
    if cfg.cluster.output_mode == "per_host" and not backend.capabilities.per_host_output:
        raise ConfigError(
            "cluster.output_mode",
            f"per_host, but the {backend.name} backend needs output_dir on one folder every "
            "task shares",
            "set cluster.output_mode=auto (or shared) and mount output_dir on every node"
            + (" (cluster.options.output_volume)" if backend.name == "kubernetes" else ""),
        )
    ctx = ctx or plan_context()
    made = plan(cfg, state, ctx, backend.target(cfg.cluster, ctx), targets)
    request = backend.dryrun(made)
    return replace(made, request=request) if request else made


def replan_from_state(state: State) -> Plan | None:
    """Plan again from the config the state carries (after hosts went down); None when the
    state carries none. The planning context is the one of the original plan."""
    if not state.config:
        return None
    from tfplan.config.compose import config_from_dict

    cfg = config_from_dict(state.config["config"])
    return make_plan(cfg, state, PlanContext(**state.config["context"]))
