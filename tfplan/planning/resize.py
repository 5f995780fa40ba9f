"""Pure: which jobs can add and remove workers while they run, and what a task must keep.

In asynchronous parameter-server training a worker needs the parameter servers' addresses and
its own; the parameter servers need no list of workers (each worker's session is filtered to
the ps and itself), and they learn how many done tokens end the job from ``live.json``
(``recipes/live.py``). So for an elastic job a task's identity is the ps (and chief) endpoints
and its own, not the whole cluster spec: adding ``worker/2`` changes no running task.

Elastic: the asynchronous built-in algorithms (``Algorithm.elastic``) reading their data
without a split by worker count (``data.shard=none``), or a user's program that says it copes
(``recipe.elastic=true``). Anything else restarts every task when the workers change, and
:func:`resize_blocker` says why, for the plan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from tfplan.config.algorithms import ALGORITHMS
from tfplan.config.schema import Config

__all__ = ["is_elastic", "membership_digest", "resize_blocker"]

# Why a running job of these algorithms cannot take a new number of workers in place.
_FIXED = {
    "sync": "sync aggregates a fixed number of replicas each step (replicas_to_aggregate)",
    "sync_lr": "sync_lr aggregates a fixed number of replicas each step",
    "sagn": "sagn aggregates a fixed number of replicas each round",
    "allreduce": "allreduce's collective group is fixed when it starts",
    "pss": "ParameterServerStrategy's coordinator fixes its cluster when it starts",
    "multi_gpu": "multi_gpu's replicas are fixed when it starts",
}


def resize_blocker(cfg: Config, backend_can: bool = True) -> str | None:
    """Why workers cannot join or leave this job while it runs; None when they can.
    ``backend_can``: the backend can tell running tasks and ask workers to leave."""
    if not backend_can:
        return f"the {cfg.cluster.backend} backend cannot add or remove workers of a running job"
    if cfg.recipe.kind == "command":
        if cfg.recipe.elastic:
            return None
        return (
            "a user's program is restarted when the workers change, unless it says it copes "
            "(recipe.elastic=true)"
        )
    algo = ALGORITHMS.get(cfg.algo.name)
    if algo is None or not algo.elastic:
        return _FIXED.get(cfg.algo.name, f"{cfg.algo.name} fixes its replicas when it starts")
    if cfg.data.shard != "none":
        return (
            f"data.shard={cfg.data.shard} splits the data by the number of workers; with "
            "data.shard=none (every worker reads all of it, in its own order) workers join and "
            "leave in place"
        )
    return None


def is_elastic(cfg: Config, backend_can: bool = True) -> bool:
    return resize_blocker(cfg, backend_can) is None


def membership_digest(cluster: Mapping[str, Sequence[str]], role: str, index: int) -> str:
    """What an elastic job's task depends on in the cluster spec: the ps and chief endpoints,
    and its own (an evaluator has none)."""
    own = list(cluster.get(role, ()))[index : index + 1] if role != "evaluator" else []
    kept = {
        "ps": list(cluster.get("ps", ())),
        "chief": list(cluster.get("chief", ())),
        "self": [role, index, own],
    }
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]
