"""EAMSGD: asynchronous elastic averaging with explicit Nesterov momentum on each replica.

Local rule (paper Alg. 2, confirmed by [Z] ``optim-eamsgd.lua``): v <- delta*v - lr*g(x + delta*v),
x <- x + v; every T-th run also E = alpha * (x - center) from the weights before the step,
x <- x + v - E after it, center += E, as in EASGD (the copy is never overwritten by a pull).

Written out instead of ``MomentumOptimizer(use_nesterov=True)``, which stores the look-ahead
point in the variable, so the elastic term would act on a shifted variable. The look-ahead is
x **+** delta*v: dist-keras' ``EAMSGDWorker`` evaluates the gradient at x - delta*v (and scales
the step by two learning rates); ``lookahead_sign`` exists only so a test can build that bug.

Config keys: ``window`` (T, default 4), ``alpha`` (default null = 0.9 / n_replicas),
``momentum`` (delta, default 0.9 as dist-keras), ``lr``. ``optimizer`` is not used.
"""

from __future__ import annotations

from typing import ClassVar

import tensorflow as tf

from recipes.algorithms.base import Algorithm, BuildContext, Problem, TrainGraph
from recipes.algorithms.easgd import elastic_alpha, elastic_difference, exchange_ops
from recipes.algorithms.local import (
    assign_all,
    create_local_copy,
    local_twins,
    option,
    positive_int,
    read_all,
    window_ops,
)

v1 = tf.compat.v1


class EAMSGD(Algorithm):
    name = "eamsgd"
    lookahead_sign: ClassVar[float] = 1.0

    def build(self, ctx: BuildContext, problem: Problem) -> TrainGraph:
        window = positive_int(ctx, "window", 4)
        alpha = elastic_alpha(ctx)
        delta = float(option(ctx, "momentum", 0.9))
        if not 0.0 <= delta < 1.0:
            raise ValueError(f"algo.momentum must be in [0, 1), got {delta}")
        lr = float(ctx.algo.lr)
        with v1.device(ctx.ps_device):
            center = problem.create_params(None)
        with v1.device(ctx.worker_device):
            local = create_local_copy(problem)
            velocity = local_twins(center, "velocity")
            x, v = read_all(local), read_all(velocity)
            look = {k: x[k] + self.lookahead_sign * delta * v[k] for k in center}
            loss = problem.loss_fn(look)
            keys = list(center)
            grads = dict(zip(keys, tf.gradients(loss, [look[k] for k in keys]), strict=True))
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
            with tf.control_dependencies([v1.local_variables_initializer()]):
                local_init = assign_all([local], read_all(center), "local_init")
        return TrainGraph(
            params=center,
            train_params=local,
            loss=loss,
            step_ops=window_ops(local_step, exchange, window),
            local_init_op=local_init,
            extras={"velocity": velocity, "alpha": alpha, "momentum": delta},
        )
