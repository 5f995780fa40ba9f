"""Synchronous SGD with optional backup workers (TensorFlow's SyncReplicasOptimizer).

Each global step averages the first R gradients computed against the current weights
(R = ``replicas_to_aggregate``, default n_replicas - ``backup_workers``); late (stale) gradients
are dropped by the ps-side accumulators. Only ``make_session_run_hook`` enqueues the initial
tokens (running ``get_init_tokens_op`` as well would double them). ``run_timeout_secs`` bounds
every training run, so a dead peer becomes ``DeadlineExceededError`` (a clear error and a
non-zero exit) instead of a hang; ``stop_grace_secs`` bounds the chief's queue-runner shutdown.
One global step = R minibatches.
"""

from __future__ import annotations

import tensorflow as tf

from recipes.algorithms.base import Algorithm, BuildContext, Problem, TrainGraph, make_optimizer
from recipes.errors import ConfigError
from recipes.sync_rounds import gate_rounds

v1 = tf.compat.v1


def replicas_to_aggregate(ctx: BuildContext) -> int:
    """R from the config; validated against the number of replicas."""
    backups = int(ctx.algo.get("backup_workers", 0))
    r = int(ctx.algo.get("replicas_to_aggregate", ctx.n_replicas - backups))
    if not 1 <= r <= ctx.n_replicas:
        raise ConfigError(
            f"sync: replicas_to_aggregate={r} must be in 1..{ctx.n_replicas} "
            f"(replicas={ctx.n_replicas}, backup_workers={backups})"
        )
    return r


class SyncSGD(Algorithm):
    name = "sync"

    def build(self, ctx: BuildContext, problem: Problem) -> TrainGraph:
        r = replicas_to_aggregate(ctx)
        timeout = float(ctx.algo.get("run_timeout_secs", 30.0))
        with v1.device(ctx.ps_device):
            params = problem.create_params(None)
            loss = problem.loss_fn(params)
            opt = v1.train.SyncReplicasOptimizer(
                make_optimizer(ctx.algo.optimizer, ctx.algo.lr),
                replicas_to_aggregate=r,
                total_num_replicas=ctx.n_replicas,
            )
            train_op = opt.minimize(
                loss, global_step=ctx.global_step, var_list=list(params.values())
            )
        rounds = gate_rounds(opt)
        graph = TrainGraph(
            params=params,
            train_params=params,
            loss=loss,
            step_ops=[train_op],
            hooks=[opt.make_session_run_hook(ctx.is_chief), rounds.hook()],
            run_options=v1.RunOptions(timeout_in_ms=int(timeout * 1000)),
            stop_grace_secs=float(ctx.algo.get("stop_grace_secs", 5.0)),
            batches_per_global_step=r,
            rounds=rounds,
            extras={"optimizer": opt},
        )
        return graph
