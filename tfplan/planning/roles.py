"""Pure: how many tasks of each role a cluster config asks for, on a given topology."""

from __future__ import annotations

from dataclasses import dataclass

from tfplan.config.schema import ChiefMode, ClusterConfig
from tfplan.errors import ConfigError
from tfplan.planning.topology import Topology

__all__ = ["RoleCounts", "role_counts"]


@dataclass(frozen=True)
class RoleCounts:
    ps: int
    workers: int
    chief: bool  # a separate chief task (else worker 0 is the chief)
    evaluator: bool
    per_gpu: bool  # one worker per GPU of each place

    @property
    def training_replicas(self) -> int:
        """Processes that compute gradients: the workers, plus a separate chief."""
        return self.workers + (1 if self.chief else 0)

    @property
    def total(self) -> int:
        return self.ps + self.training_replicas + (1 if self.evaluator else 0)


def role_counts(cluster: ClusterConfig, topology: Topology) -> RoleCounts:
    """Count the tasks ``cluster`` asks for.

    ``ps: per_host`` is one parameter server per place; ``workers: per_gpu`` is one training
    replica per GPU over all places, so a separate chief takes one GPU and the workers the rest.

    Raises:
        ConfigError: ``ps``/``workers`` is neither a count nor its keyword.
    """
    if cluster.ps == "per_host":
        ps = len(topology.places)
    elif isinstance(cluster.ps, bool) or not isinstance(cluster.ps, int):
        raise ConfigError(
            "cluster.ps",
            f"{cluster.ps!r} is neither a count nor 'per_host'",
            "use e.g. cluster.ps=2",
        )
    else:
        ps = cluster.ps
    separate = cluster.chief is ChiefMode.separate
    per_gpu = cluster.workers == "per_gpu"
    if per_gpu:
        workers = max(0, topology.total_gpus - 1) if separate else topology.total_gpus
    elif isinstance(cluster.workers, bool) or not isinstance(cluster.workers, int):
        raise ConfigError(
            "cluster.workers",
            f"{cluster.workers!r} is neither a count nor 'per_gpu'",
            "use e.g. cluster.workers=4",
        )
    else:
        workers = cluster.workers
    return RoleCounts(
        ps=ps, workers=workers, chief=separate, evaluator=cluster.evaluator, per_gpu=per_gpu
    )
