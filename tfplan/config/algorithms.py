"""The one list of training algorithms tfplan knows: name, config schema, and what each needs.

Pure data, no TensorFlow: validation, the Hydra schemas, the planner and the tests read it. The
recipes (which never import tfplan) dispatch on the same names; a test keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tfplan.config.schema import (
    AdagConfig,
    AgnConfig,
    AlgoConfig,
    AllreduceConfig,
    DownpourConfig,
    DownpourEasyConfig,
    DynSgdConfig,
    EamsgdConfig,
    EasgdConfig,
    HogwildConfig,
    MultiGpuConfig,
    PssConfig,
    SagnConfig,
    SyncConfig,
    SyncLrConfig,
)

__all__ = ["ALGORITHMS", "Algorithm", "algorithm_names"]


@dataclass(frozen=True)
class Algorithm:
    """One built-in algorithm.

    Attributes:
        name: ``algo=<name>`` and ``algo.name``.
        schema: its structured config (``conf/algo/<name>.yaml`` extends it).
        sync: it trains in synchronous rounds of every replica (``algo.sync`` must be true).
        needs_ps: it keeps its variables on parameter servers (``cluster.ps >= 1``).
        collective: its workers all-reduce every step (a lost worker stops the group, so the
            group restarts together).
        chief: its chief must be a task of its own (``cluster.chief=separate``).
        retry_exit_codes: exit codes below 128 that mean "restart me" rather than "I gave up"
            (the TF2 strategies exit 5 when their group lost a member).
        ps_standby: a warm standby per ps by default (``lifecycle.ps_standby=null``): the TF1
            recipes, whose workers wait for a restarted ps; not pss, whose coordinator exits
            5 on a lost ps and restarts (its own import dominates the recovery).
        elastic: asynchronous updates on the ps, each worker on its own: workers can join and
            leave a running job in place (with ``data.shard=none``, docs/resize.md).
        summary: one line for docs and error messages.
    """

    name: str
    schema: type[AlgoConfig]
    sync: bool
    needs_ps: bool
    summary: str
    collective: bool = False
    chief: bool = False
    retry_exit_codes: tuple[int, ...] = ()
    ps_standby: bool = True
    elastic: bool = False


def _ps(name: str, schema: type[AlgoConfig], summary: str, sync: bool = False) -> Algorithm:
    return Algorithm(name, schema, sync=sync, needs_ps=True, summary=summary)


def _elastic(name: str, schema: type[AlgoConfig], summary: str) -> Algorithm:
    return Algorithm(name, schema, sync=False, needs_ps=True, summary=summary, elastic=True)


ALGORITHMS: Mapping[str, Algorithm] = {
    a.name: a
    for a in (
        _elastic("hogwild", HogwildConfig, "asynchronous SGD on shared ps variables"),
        _elastic("downpour", DownpourConfig, "T local steps, then the window's delta pushed"),
        _ps("sync", SyncConfig, "SyncReplicasOptimizer: averaged gradients each step", True),
        _elastic("downpour_easy", DownpourEasyConfig, "DOWNPOUR with a ps-side optimizer"),
        _elastic("agn", AgnConfig, "accumulated gradient normalization (delta / T)"),
        _ps("sagn", SagnConfig, "synchronous AGN rounds", True),
        _ps("sync_lr", SyncLrConfig, "sync SGD with one learning rate per replica", True),
        _elastic("dynsgd", DynSgdConfig, "commits scaled by 1 / (staleness + 1)"),
        _elastic("adag", AdagConfig, "AGN with per-weight staleness scaling"),
        _elastic("easgd", EasgdConfig, "elastic averaging with a centre variable"),
        _elastic("eamsgd", EamsgdConfig, "elastic averaging with Nesterov momentum"),
        _ps("multi_gpu", MultiGpuConfig, "in-graph towers per worker, averaged"),
        Algorithm(
            "allreduce",
            AllreduceConfig,
            sync=True,
            needs_ps=False,
            summary="TF2 MultiWorkerMirroredStrategy: synchronous all-reduce, no ps",
            collective=True,
            retry_exit_codes=(5,),
        ),
        Algorithm(
            "pss",
            PssConfig,
            sync=False,
            needs_ps=True,
            summary="TF2 ParameterServerStrategy: the chief coordinates, asynchronous",
            chief=True,
            retry_exit_codes=(5,),
            ps_standby=False,
        ),
    )
}
# The algorithms the recipes train with a TF2 strategy (recipes/strategies), not a TF1
# MonitoredTrainingSession: no live.json max_steps, no in-memory snapshots
TF2_STRATEGIES = frozenset({"allreduce", "pss"})


def algorithm_names() -> tuple[str, ...]:
    return tuple(ALGORITHMS)
