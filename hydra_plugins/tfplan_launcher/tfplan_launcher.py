"""Hydra accepts launchers only from the ``hydra_plugins`` namespace package: this module makes
:class:`tfplan.sweeps.launcher.ClusterLauncher` one (``hydra/launcher=tfplan``)."""

from __future__ import annotations

from tfplan.sweeps.launcher import ClusterLauncher, register_launcher

__all__ = ["TfplanLauncher"]


class TfplanLauncher(ClusterLauncher):
    """Runs each sweep point as a whole cluster, up to ``concurrency`` at once."""


register_launcher()
