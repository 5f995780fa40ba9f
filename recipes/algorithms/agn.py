"""AGN, accumulated gradient normalization (Hermans' thesis; dist-keras calls it ``ADAG``).

A replica takes T local steps of ``algo.optimizer`` on its copy, then commits the window's delta
divided by T, center += (theta_T - theta_pull) / T, and pulls (the copy is overwritten by the
center). With SGD that is -(1/T) sum_t lr * g(theta_t): the *normalized* accumulated update, so
T=1 is DOWNPOUR. The seed guide's AGN.py sends ``reduce_mean`` of T gradients all taken at the
pulled weights (its window is unrolled in one graph) through a ps Adam, i.e. async Adam; here
each local step is its own run and the forward pass is re-evaluated.

Config keys: ``window`` (T, default 4; dist-keras uses 12 with 10-40 workers), ``optimizer``
and ``lr`` (the local steps). ``global_step`` += T per commit, so ``max_steps`` counts minibatches.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from recipes.algorithms.base import BuildContext, Params, Problem
from recipes.algorithms.local import (
    Window,
    WindowedAlgorithm,
    add_global_steps,
    assign_all,
    local_optimizer_step,
    local_twins,
    read_all,
)


class AGN(WindowedAlgorithm):
    name = "agn"
    default_window = 4

    def build_window(
        self, ctx: BuildContext, problem: Problem, center: Params, local: Params, window: int
    ) -> Window:
        pulled = local_twins(center, "pulled")
        loss = problem.loss_fn(local)
        local_step = local_optimizer_step(ctx, loss, local)
        with tf.control_dependencies([local_step]):
            delta = {
                k: (local[k].read_value() - pulled[k].read_value()) / float(window) for k in center
            }
        commit = self.commit(ctx, center, pulled, delta, window)
        with tf.control_dependencies([commit]):
            exchange = assign_all([local, pulled], read_all(center), "pull")
        return Window(
            loss, local_step, exchange, start_at_center=[pulled], extras={"pulled": pulled}
        )

    def commit(
        self, ctx: BuildContext, center: Params, pulled: Params, delta: dict[str, Any], window: int
    ) -> Any:
        """center += delta (each variable's add is atomic; no lock across variables)."""
        return tf.group(
            *[center[k].assign_add(delta[k]) for k in center],
            add_global_steps(ctx, window),
            name="commit",
        )
