"""SAGN, synchronous AGN: T local steps per replica, then one synchronous round on the mean.

center <- Opt(center, (1/R) sum_k (1/T) sum_t g_{k,t}), then every replica pulls. Each replica
takes T local steps of ``algo.optimizer`` on its copy (one run each, so every gradient is taken
at the current local weights; the seed guide's SAGN.py unrolls the window in one graph, gets T
copies of g(theta_pull) and is plain SSGD with Adam), sums the gradients, and in its T-th run
hands sum/T to TensorFlow's ``SyncReplicasOptimizer`` around ``ps_optimizer``; the pull waits for
the round (the token dequeue), so it reads the aggregated center. T=1 with SGD is SSGD.

The chief enqueues **no** initial tokens (``make_session_run_hook(is_chief, num_tokens=0)``):
every token then comes after a round's update, so every pull reads that round's center. With
TF's R initial tokens (what ``sync`` does) the first dequeue does not wait: the first pull would
read the center before the first round, and each replica's second window, computed from that
stale copy with local step 0, would be dropped as stale.

Config keys: ``window`` (T, default 2; the guide uses 5), ``optimizer`` (local), ``ps_optimizer``
(default sgd; any of sgd/adagrad/adam/momentum), ``lr`` (both), and sync's
``replicas_to_aggregate``, ``backup_workers``, ``run_timeout_secs``, ``stop_grace_secs``.
One global step = one round = R*T minibatches.
"""

from __future__ import annotations

import tensorflow as tf

from recipes.algorithms.base import BuildContext, Params, Problem, make_optimizer
from recipes.algorithms.local import (
    LocalOptimizer,
    Window,
    WindowedAlgorithm,
    assign_all,
    local_twins,
    option,
    read_all,
)
from recipes.algorithms.sync import replicas_to_aggregate
from recipes.sync_rounds import gate_rounds

v1 = tf.compat.v1


class SAGN(WindowedAlgorithm):
    name = "sagn"
    default_window = 2

    def build_window(
        self, ctx: BuildContext, problem: Problem, center: Params, local: Params, window: int
    ) -> Window:
        r = replicas_to_aggregate(ctx)
        timeout = float(option(ctx, "run_timeout_secs", 30.0))
        grad_sum = local_twins(center, "grad_sum")
        loss = problem.loss_fn(local)
        local_step = LocalOptimizer(ctx, loss, local).apply(grad_sums=grad_sum)
        with tf.control_dependencies([local_step]):
            mean = {k: grad_sum[k].read_value() / float(window) for k in center}
        with v1.device(ctx.ps_device):
            sync_opt = v1.train.SyncReplicasOptimizer(
                make_optimizer(str(option(ctx, "ps_optimizer", "sgd")), ctx.algo.lr),
                replicas_to_aggregate=r,
                total_num_replicas=ctx.n_replicas,
            )
            round_op = sync_opt.apply_gradients(
                [(mean[k], center[k]) for k in center], global_step=ctx.global_step
            )
        rounds = gate_rounds(sync_opt)
        with tf.control_dependencies([round_op]):
            values = read_all(center)
            zeros = {k: tf.zeros_like(values[k]) for k in center}
            exchange = tf.group(
                assign_all([local], values, "pull"),
                assign_all([grad_sum], zeros, "reset"),
                name="exchange",
            )
        return Window(
            loss,
            local_step,
            exchange,
            extras={"optimizer": sync_opt, "grad_sum": grad_sum},
            graph_fields={
                "hooks": [
                    sync_opt.make_session_run_hook(ctx.is_chief, num_tokens=0),
                    rounds.hook(),
                ],
                "rounds": rounds,
                "run_options": v1.RunOptions(timeout_in_ms=int(timeout * 1000)),
                "stop_grace_secs": float(option(ctx, "stop_grace_secs", 5.0)),
                "batches_per_global_step": r * window,
            },
        )
