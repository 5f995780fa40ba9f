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

from recipes.algorithms.base import BuildContext, Params, Problem
from recipes.algorithms.local import (
    LocalOptimizer,
    Window,
    WindowedAlgorithm,
    add_global_steps,
    local_twins,
    option,
)
from recipes.errors import ConfigError
from recipes.vocabulary import PS_OPTIMIZERS

v1 = tf.compat.v1


class Downpour(WindowedAlgorithm):
    name = "downpour"
    default_window = 5

    def build_window(
        self, ctx: BuildContext, problem: Problem, center: Params, local: Params, window: int
    ) -> Window:
        ps_optimizer = str(option(ctx, "ps_optimizer", "sgd")).lower()
        if ps_optimizer not in PS_OPTIMIZERS:
            raise ConfigError(
                f"algo.ps_optimizer={ps_optimizer}: unknown; valid: {', '.join(PS_OPTIMIZERS)}"
            )
        pulled = local_twins(center, "pulled")
        grad_sum = local_twins(center, "grad_sum")
        loss = problem.loss_fn(local)
        local_step = LocalOptimizer(ctx, loss, local).apply(grad_sums=grad_sum)
        with tf.control_dependencies([local_step]):
            push = self._push(ctx, center, local, pulled, grad_sum, ps_optimizer, window)
        with tf.control_dependencies([push]):
            push_pull = self._pull(center, local, pulled, grad_sum)
        # grad_sum starts at zero, pulled and the copy at the center.
        extras = {"pulled": pulled, "grad_sum": grad_sum}
        return Window(loss, local_step, push_pull, start_at_center=[pulled], extras=extras)

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
        step = add_global_steps(ctx, window)
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
