"""Asynchronous EASGD (elastic averaging; Zhang, Choromanska & LeCun, Alg. 1).

Each replica trains its own copy x with ``algo.optimizer``; every T-th run it also makes an
elastic exchange with the center: E = alpha * (x - center), computed from the weights *before*
that run's local step (whose gradient is taken at those weights too, as the paper's snapshot
x <- x^i), then x <- x - E after the step and center <- center + E. The copy is never
overwritten by a pull, so replicas explore around the center; x + center is conserved by each
exchange. In one run: ``c = tf.identity(center)``; ``E = alpha * (x - c)``; the local update
waits for E; then ``x -= E`` and ``center += E``. Exchanges come at runs T, 2T, ... of each
replica (the paper counts t from 0 and exchanges at 0, T, ...: the same sequence, since the
exchange at t=0 is a no-op when x starts at the center).

Config keys: ``window`` (T, default 4), ``alpha`` (the moving rate, alpha = lr * rho; default
null = 0.9 / n_replicas, the paper's beta = 0.9 split over the replicas, as [Z]'s ``mva=0.9/p``),
``optimizer`` and ``lr`` (local steps). ``global_step`` += T per exchange.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from recipes.algorithms.base import BuildContext, Params, Problem
from recipes.algorithms.local import (
    LocalOptimizer,
    Window,
    WindowedAlgorithm,
    add_global_steps,
    option,
    read_all,
)
from recipes.errors import ConfigError


def elastic_alpha(ctx: BuildContext) -> float:
    """``algo.alpha``, or 0.9 / n_replicas when unset; must lie in [0, 1]."""
    alpha = option(ctx, "alpha", None)
    alpha = 0.9 / ctx.n_replicas if alpha is None else float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"algo.alpha must be in [0, 1], got {alpha}")
    return alpha


def elastic_difference(center: Params, x: dict[str, Any], alpha: float) -> dict[str, Any]:
    """E = alpha * (x - c) with c = tf.identity(center): one read of the center, on the worker."""
    return {k: alpha * (x[k] - tf.identity(center[k].read_value())) for k in center}


def exchange_ops(
    ctx: BuildContext, center: Params, local: Params, e: dict[str, Any], window: int
) -> list[Any]:
    """x -= E and center += E (the center's add is lock-free), global_step += T."""
    return [
        *[local[k].assign_sub(e[k]) for k in center],
        *[center[k].assign_add(e[k]) for k in center],
        add_global_steps(ctx, window),
    ]


class EASGD(WindowedAlgorithm):
    name = "easgd"
    default_window = 4

    def build_window(
        self, ctx: BuildContext, problem: Problem, center: Params, local: Params, window: int
    ) -> Window:
        alpha = elastic_alpha(ctx)
        loss = problem.loss_fn(local)
        opt = LocalOptimizer(ctx, loss, local)
        local_step = opt.apply()
        e = elastic_difference(center, read_all(local), alpha)
        step_then_exchange = opt.apply(control=list(e.values()))
        with tf.control_dependencies([step_then_exchange]):
            exchange = tf.group(*exchange_ops(ctx, center, local, e, window), name="exchange")
        # The copy starts at the center (x^i = center); later pulls never overwrite it.
        return Window(loss, local_step, exchange, extras={"alpha": alpha})
