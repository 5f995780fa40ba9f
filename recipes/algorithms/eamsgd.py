"""EAMSGD: asynchronous elastic averaging with explicit Nesterov momentum on each replica.

Local rule (paper Alg. 2, confirmed by [Z] ``optim-eamsgd.lua``): v <- delta*v - lr*g(x + delta*v),
x <- x + v; every T-th run also E = alpha * (x - center) from the weights before the step,
x <- x + v - E after it, center += E, as in EASGD (the copy is never overwritten by a pull).

Written out instead of ``MomentumOptimizer(use_nesterov=True)``, which stores the look-ahead
point in the variable, so the elastic term would act on a shifted variable. The look-ahead is
x **+** delta*v: dist-keras' ``EAMSGDWorker`` evaluates the gradient at x - delta*v (and scales
the step by two learning rates); ``lookahead_sign`` exists only so a test can build that bug.

Embedding tables (read row by row on the ps, not copied: recipes/algorithms/local.py) take the
same momentum on their rows at every run, TensorFlow's Nesterov ``MomentumOptimizer(lr, delta)``
on the ps (lazy: a row's velocity moves only when a batch reads the row); plain SGD at ``lr``
would move them about 1 / (1 - delta) = 10x slower than the dense part. Here the look-ahead
stored in the variable is harmless: no elastic term acts on a table.

Config keys: ``window`` (T, default 4), ``alpha`` (default null = 0.9 / n_replicas),
``momentum`` (delta, default 0.9 as dist-keras), ``lr``. ``optimizer`` is not used.
"""

from __future__ import annotations

from typing import Any, ClassVar

import tensorflow as tf

from recipes.algorithms.base import BuildContext, Params, Problem, dense
from recipes.algorithms.easgd import elastic_alpha, elastic_difference, exchange_ops
from recipes.algorithms.local import Window, WindowedAlgorithm, local_twins, option, read_all
from recipes.errors import ConfigError

v1 = tf.compat.v1


def momentum(ctx: BuildContext) -> float:
    """``algo.momentum`` (delta), checked."""
    delta = float(option(ctx, "momentum", 0.9))
    if not 0.0 <= delta < 1.0:
        raise ConfigError(f"algo.momentum must be in [0, 1), got {delta}")
    return delta


class EAMSGD(WindowedAlgorithm):
    name = "eamsgd"
    default_window = 4
    lookahead_sign: ClassVar[float] = 1.0

    def table_optimizer(self, ctx: BuildContext) -> Any:
        """The tables' rows: Nesterov momentum at ``lr`` with this algorithm's ``momentum``."""
        return v1.train.MomentumOptimizer(
            float(ctx.algo.lr), momentum(ctx), use_locking=False, use_nesterov=True
        )

    def build_window(
        self, ctx: BuildContext, problem: Problem, center: Params, local: Params, window: int
    ) -> Window:
        alpha = elastic_alpha(ctx)
        delta = momentum(ctx)
        lr = float(ctx.algo.lr)
        velocity = local_twins(center, "velocity")
        x, v = read_all(local), read_all(velocity)
        look = {k: x[k] + self.lookahead_sign * delta * v[k] for k in center}
        loss = problem.loss_fn(look)
        keys = list(center)
        grads = dict(
            zip(keys, [dense(g) for g in tf.gradients(loss, [look[k] for k in keys])], strict=True)
        )
        v_new = {k: delta * v[k] - lr * grads[k] for k in keys}
        local_step = tf.group(
            *[velocity[k].assign(v_new[k]) for k in keys],
            *[local[k].assign(x[k] + v_new[k]) for k in keys],
            name="local_step",
        )
        e = elastic_difference(center, x, alpha)
        with tf.control_dependencies(list(e.values())):
            moved = tf.group(
                *[velocity[k].assign(v_new[k]) for k in keys],
                *[local[k].assign(x[k] + v_new[k]) for k in keys],
            )
        with tf.control_dependencies([moved]):
            exchange = tf.group(*exchange_ops(ctx, center, local, e, window), name="exchange")
        # The velocity starts at zero, the copy at the center.
        extras = {"velocity": velocity, "alpha": alpha, "momentum": delta}
        return Window(loss, local_step, exchange, extras=extras)
