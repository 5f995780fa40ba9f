"""DOWNPOUR: T local steps on a worker-local copy, then push the window's update and pull.

Config keys: ``window`` (T, default 5), ``optimizer`` (the local optimizer), ``lr``, and
``ps_optimizer``:
- ``sgd``: the ps adds the window's parameter delta, center += (local - pulled), i.e. the sum of
  the T local updates (dist-keras' DeltaParameterServer);
- ``adagrad``: the ps applies its own Adagrad (lr = ``lr``) to the sum of the T gradients (the
  DistBelief paper's rule).

Each local step is its own ``session.run`` with its own minibatch, so the forward pass is
re-evaluated on the updated local weights at every step (the seed guide unrolls the window in one
graph and gets T copies of g(theta_pull)). The window is exactly T batches, the first included:
the T-th run does the local step, then the push, then the pull, ordered by control dependencies.

``global_step`` counts local steps of all replicas (+T per push), so ``max_steps`` means the same
number of minibatches for every algorithm; a stop requested mid-window drops the unpushed part.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from recipes.algorithms.base import Algorithm, BuildContext, Params, Problem, TrainGraph
from recipes.algorithms.local import LocalOptimizer, create_local_copy, local_twins

v1 = tf.compat.v1


class Downpour(Algorithm):
    name = "downpour"

    def build(self, ctx: BuildContext, problem: Problem) -> TrainGraph:
        window = int(ctx.algo.get("window", 5))
        ps_optimizer = str(ctx.algo.get("ps_optimizer", "sgd")).lower()
        if window < 1:
            raise ValueError(f"algo.window must be >= 1, got {window}")
        if ps_optimizer not in ("sgd", "adagrad"):
            raise ValueError(f"unknown algo.ps_optimizer '{ps_optimizer}'; valid: sgd, adagrad")
        with v1.device(ctx.ps_device):
            center = problem.create_params(None)
        with v1.device(ctx.worker_device):
            local = create_local_copy(problem)
            pulled = local_twins(center, "pulled")
            grad_sum = local_twins(center, "grad_sum")
            loss = problem.loss_fn(local)
            local_step = LocalOptimizer(ctx, loss, local).apply(grad_sums=grad_sum)
            with tf.control_dependencies([local_step]):
                push = self._push(ctx, center, local, pulled, grad_sum, ps_optimizer, window)
            with tf.control_dependencies([push]):
                push_pull = self._pull(center, local, pulled, grad_sum)
            with tf.control_dependencies([v1.local_variables_initializer()]):
                local_init = self._pull(center, local, pulled, grad_sum)
        return TrainGraph(
            params=center,
            train_params=local,
            loss=loss,
            step_ops=[local_step] * (window - 1) + [push_pull],
            local_init_op=local_init,
            extras={"pulled": pulled, "grad_sum": grad_sum},
        )

    @staticmethod
    def _push(
        ctx: BuildContext,
        center: Params,
        local: Params,
        pulled: Params,
        grad_sum: Params,
        ps_optimizer: str,
        window: int,
    ) -> Any:
        step = ctx.global_step.assign_add(tf.constant(window, ctx.global_step.dtype.base_dtype))
        if ps_optimizer == "sgd":
            # The subtraction runs on the worker (device scope), so only the delta crosses the wire.
            updates = [
                center[k].assign_add(local[k].read_value() - pulled[k].read_value()) for k in center
            ]
        else:
            # The ps optimizer's slots are global (checkpointed), named model/w/Adagrad.
            with v1.device(ctx.ps_device):
                ps_opt = v1.train.AdagradOptimizer(ctx.algo.lr, use_locking=False)
                updates = [
                    ps_opt.apply_gradients([(grad_sum[k].read_value(), center[k]) for k in center])
                ]
        return tf.group(*updates, step, name="push")

    @staticmethod
    def _pull(center: Params, local: Params, pulled: Params, grad_sum: Params) -> Any:
        ops = []
        for k in center:
            value = center[k].read_value()
            ops += [
                local[k].assign(value),
                pulled[k].assign(value),
                grad_sum[k].assign(tf.zeros_like(value)),
            ]
        return tf.group(*ops, name="pull")
