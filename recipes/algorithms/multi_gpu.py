"""In-graph replication on one machine: one tower per device, gradients averaged, one update.

Each run splits the minibatch into ``towers`` interleaved slices (rows i, i+k, ...), builds the
forward and backward pass of slice i on device i of this task (``/device:GPU:i``, or the task's
logical ``/device:CPU:i``; the replica's server then exposes ``towers`` CPU devices), and applies
the size-weighted mean of the tower gradients, which equals the gradient of the whole minibatch,
to the ps variables with ``algo.optimizer``. The dense parameters are read once per run and
shared by the towers; an embedding table read row by row (``Problem.table_keys``) is not: each
tower gathers its slice's rows on the ps, and the towers' row gradients (``IndexedSlices``,
weighted) are joined into one, so a step moves the batch's rows of a table each way. Unlike the guide's ``Multiple-GPUs-Single-Machine`` (one process per GPU, Hogwild
between them: the planner's ``workers=per_gpu`` does that for every other algorithm), the GPUs
of one machine form one replica. With several worker tasks, each is such a replica and they
update the ps asynchronously, as Hogwild replicas.

Config keys: ``towers`` (default 2), ``device`` (``cpu`` | ``gpu``, default cpu), ``optimizer``,
``lr``. One global step = one minibatch (all towers together).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from recipes.algorithms.base import (
    Algorithm,
    BuildContext,
    Problem,
    TrainGraph,
    dense,
    make_optimizer,
)
from recipes.algorithms.local import positive_int
from recipes.config import AlgoConf
from recipes.errors import ConfigError

v1 = tf.compat.v1


def tower_settings(algo: AlgoConf) -> tuple[int, str]:
    towers = int(algo.get("towers", 2))
    device = str(algo.get("device", "cpu")).lower()
    if towers < 1:
        raise ConfigError(f"algo.towers must be >= 1, got {towers}")
    if device not in ("cpu", "gpu"):
        raise ConfigError(f"algo.device must be cpu or gpu, got {device}")
    return towers, device


def weighted_sum(grads: list[Any], weights: list[Any]) -> Any:
    """``sum(w_i * g_i)``: the towers' row gradients of a table (``IndexedSlices``) joined into
    one (a row two towers touched appears twice; the optimizer's sparse apply sums them), any
    other gradient dense."""
    if all(isinstance(g, tf.IndexedSlices) for g in grads):
        return tf.IndexedSlices(
            tf.concat([g.values * w for g, w in zip(grads, weights, strict=True)], axis=0),
            tf.concat([g.indices for g in grads], axis=0),
            grads[0].dense_shape,
        )
    return tf.add_n([w * dense(g) for g, w in zip(grads, weights, strict=True)])


class MultiGPU(Algorithm):
    name = "multi_gpu"

    def cpu_devices(self, algo: AlgoConf) -> int:
        towers, device = tower_settings(algo)
        return towers if device == "cpu" else 1

    def build(self, ctx: BuildContext, problem: Problem) -> TrainGraph:
        towers, device = tower_settings(ctx.algo)
        positive_int(ctx, "towers", 2)
        if problem.inputs is None or problem.loss_on is None:
            raise ValueError("multi_gpu needs Problem.inputs and Problem.loss_on")
        x, y = problem.inputs
        with v1.device(ctx.ps_device):
            params = problem.create_params(None)
        keys = list(params)
        tables = problem.table_keys() & set(keys)
        with v1.device(ctx.worker_device):
            # one read of each dense parameter, shared by the towers
            values = {k: params[k].read_value() for k in keys if k not in tables}
            n = tf.shape(y)[0]
        losses, grads, weights = [], [], []
        for i in range(towers):
            with (
                v1.device(f"{ctx.worker_device}/device:{device.upper()}:{i}"),
                tf.name_scope(f"tower{i}"),
            ):
                rows = tf.range(i, n, towers)
                x_i = tf.nest.map_structure(lambda t, r=rows: tf.gather(t, r), x)  # dict too
                # The tower's own handle on the values: a gather's gradient is colocated with
                # its params, which must then be on this tower's device. A table is the variable
                # itself: its rows are gathered where it lives, its gradient is those rows.
                mine = {k: params[k] if k in tables else tf.identity(values[k]) for k in keys}
                loss_i = problem.loss_on(mine, x_i, tf.gather(y, rows))
                grads.append(tf.gradients(loss_i, [mine[k] for k in keys]))
                losses.append(loss_i)
                weights.append(tf.cast(tf.size(rows), tf.float32) / tf.cast(n, tf.float32))
        with v1.device(ctx.worker_device):
            loss = tf.add_n([w * t for w, t in zip(weights, losses, strict=True)], name="loss")
            mean: list[Any] = [
                weighted_sum([g[j] for g in grads], weights) for j in range(len(keys))
            ]
        with v1.device(ctx.ps_device):
            opt = make_optimizer(ctx.algo.optimizer, ctx.algo.lr)
            train_op = opt.apply_gradients(
                list(zip(mean, [params[k] for k in keys], strict=True)), global_step=ctx.global_step
            )
        return TrainGraph(
            params=params,
            train_params=params,
            loss=loss,
            step_ops=[train_op],
            extras={"towers": towers, "tower_losses": losses},
        )
