"""Hogwild!: asynchronous SGD on variables held by the parameter servers.

The variables go to the ps through ``replica_device_setter`` (without it each worker would train
its own copy, the bug of the seed guide's Hogwild.py); each replica computes a gradient on its
minibatch and applies it with ``use_locking=False``, so concurrent updates race lock-free.
One global step = one minibatch of one replica.
"""

from __future__ import annotations

import tensorflow as tf

from recipes.algorithms.base import Algorithm, BuildContext, Problem, TrainGraph, make_optimizer

v1 = tf.compat.v1


class Hogwild(Algorithm):
    name = "hogwild"

    def build(self, ctx: BuildContext, problem: Problem) -> TrainGraph:
        with v1.device(ctx.ps_device):
            params = problem.create_params(None)
            loss = problem.loss_fn(params)
            opt = make_optimizer(ctx.algo.optimizer, ctx.algo.lr)
            train_op = opt.minimize(
                loss, global_step=ctx.global_step, var_list=list(params.values())
            )
        return TrainGraph(params=params, train_params=params, loss=loss, step_ops=[train_op])
