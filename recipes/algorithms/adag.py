"""ADAG as in Hermans' thesis: AGN whose commit is scaled per weight by how far the center moved.

center += delta * 1 / ((center_now - center_at_pull)^2 / gamma + 1), elementwise ([TH] Eq.
``adag_rewrite``), with delta the AGN delta (theta_T - theta_pull) / T. A weight the other
replicas have moved a lot since this replica pulled gets a small share of this (stale) update; an
unmoved center gives scale 1, i.e. plain AGN. (dist-keras' class ``ADAG`` is AGN; this is the
thesis' distance-based one, ``Experimental*`` in dist-keras.)

The scale is computed on the worker ([TH] Alg. ``adag_3``) from the center as read at the
commit, so a commit moves the parameters twice over the wire (read, then add). Like
dist-keras' parameter server it takes no lock across variables: a commit of another replica
landing between the read and the add makes that scale slightly stale.

Config keys: ``window`` (T, default 4), ``gamma`` (default 1e-4, the thesis' recommendation),
``optimizer`` and ``lr`` (the local steps).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from recipes.algorithms.agn import AGN
from recipes.algorithms.base import BuildContext, Params
from recipes.algorithms.local import add_global_steps, option
from recipes.errors import ConfigError


def adag_scale(center: Any, pulled: Any, gamma: float) -> Any:
    """1 / ((center - pulled)^2 / gamma + 1): 1 when unmoved, in (0, 1], falling with distance."""
    return 1.0 / (tf.square(center - pulled) / gamma + 1.0)


class ADAG(AGN):
    name = "adag"

    def commit(
        self, ctx: BuildContext, center: Params, pulled: Params, delta: dict[str, Any], window: int
    ) -> Any:
        gamma = float(option(ctx, "gamma", 1e-4))
        if gamma <= 0:
            raise ConfigError(f"algo.gamma must be > 0, got {gamma}")
        # On the worker, as [TH] Alg. adag_3: read the center once, send the scaled delta.
        adds = [
            center[k].assign_add(
                delta[k] * adag_scale(center[k].read_value(), pulled[k].read_value(), gamma)
            )
            for k in center
        ]
        return tf.group(*adds, add_global_steps(ctx, window), name="commit")
