"""Synchronous SGD with a learning rate per worker: center -= sum_i lr_i * g_i per round.

TensorFlow's ``SyncReplicasOptimizer`` averages the R gradients of a round, so each replica i
hands it R * lr_i * g_i and the wrapped optimizer is plain SGD at rate 1.0:
(1/R) sum_i R lr_i g_i = sum_i lr_i g_i (the seed guide's ``(lr_i / 1.0) * 2.0`` for R = 2). Only
``make_session_run_hook`` enqueues the initial tokens: the guide also runs
``get_init_tokens_op()`` by hand and starts with 2R tokens, letting a worker run a round ahead.

Config keys: ``lrs`` (one rate per training replica, in replica order: the chief is replica 0),
or, when empty, the rule lr_i = ``lr`` * ``lr_decay`` ** i (default lr_decay 0.5: the chief gets
the largest rate, as in the guide); sync's ``replicas_to_aggregate``, ``backup_workers``,
``run_timeout_secs``, ``stop_grace_secs``. ``optimizer`` must be sgd. One global step = R
minibatches. With backup workers the sum runs over the R gradients that made the round.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from recipes.algorithms.base import Algorithm, BuildContext, Problem, TrainGraph, scaled
from recipes.algorithms.local import option
from recipes.algorithms.sync import replicas_to_aggregate
from recipes.errors import ConfigError
from recipes.sync_rounds import gate_rounds

v1 = tf.compat.v1


def worker_learning_rates(ctx: BuildContext) -> list[float]:
    """Every replica's rate: ``algo.lrs``, or ``lr * lr_decay ** i``."""
    lrs: list[Any] = list(option(ctx, "lrs", None) or [])
    if lrs:
        if len(lrs) != ctx.n_replicas:
            raise ConfigError(f"algo.lrs has {len(lrs)} rates for {ctx.n_replicas} replicas")
        return [float(v) for v in lrs]
    decay = float(option(ctx, "lr_decay", 0.5))
    return [float(ctx.algo.lr) * decay**i for i in range(ctx.n_replicas)]


class SyncLR(Algorithm):
    name = "sync_lr"

    def build(self, ctx: BuildContext, problem: Problem) -> TrainGraph:
        if ctx.algo.optimizer != "sgd":
            raise ConfigError(
                f"sync_lr is SGD with per-worker rates; got algo.optimizer={ctx.algo.optimizer}"
            )
        r = replicas_to_aggregate(ctx)
        lr = worker_learning_rates(ctx)[ctx.replica_index]
        timeout = float(option(ctx, "run_timeout_secs", 30.0))
        with v1.device(ctx.ps_device):
            params = problem.create_params(None)
            loss = problem.loss_fn(params)
            opt = v1.train.SyncReplicasOptimizer(
                v1.train.GradientDescentOptimizer(1.0, use_locking=False),
                replicas_to_aggregate=r,
                total_num_replicas=ctx.n_replicas,
            )
            grads = opt.compute_gradients(loss, var_list=list(params.values()))
            train_op = opt.apply_gradients(
                [(scaled(g, lr * r), v) for g, v in grads], global_step=ctx.global_step
            )
        rounds = gate_rounds(opt)
        return TrainGraph(
            params=params,
            train_params=params,
            loss=loss,
            step_ops=[train_op],
            hooks=[opt.make_session_run_hook(ctx.is_chief), rounds.hook()],
            run_options=v1.RunOptions(timeout_in_ms=int(timeout * 1000)),
            stop_grace_secs=float(option(ctx, "stop_grace_secs", 5.0)),
            batches_per_global_step=r,
            rounds=rounds,
            extras={"optimizer": opt, "lr": lr},
        )
