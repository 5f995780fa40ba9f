"""``algo=allreduce``: synchronous data-parallel training with MultiWorkerMirroredStrategy.

Every training task (each ``worker``, plus the ``chief`` when the cluster has one) holds a full
copy of the model; each step every replica takes the gradient of its own minibatch (from its own
shard of the training data), the gradients (and the losses) are averaged by one all-reduce, and
every replica applies the same update, so the copies stay identical. There are no parameter
servers. One global step = one minibatch per replica. The chief (the chief task, or worker 0)
writes checkpoints, summaries and ``result.json``; everyone stops at exactly ``max_steps`` (the
step counter moves in lockstep).

End: after the last step every replica waits at a barrier of TF's coordination service until all
have finished their collectives (a collective pulls data from its sender, so a replica that left
at once broke a slower peer's last step); then the chief writes the final checkpoint and
``result.json``, which describes that checkpoint (its step, its weights restored from disk).

Start and resume: the chief restores the newest checkpoint of ``output_dir`` (if any) and its
values are broadcast to every replica (one all-reduce in which the others contribute zeros), so a
non-chief host does not need to see ``output_dir``.

Fault tolerance: a collective group cannot lose a member. When a peer dies, the survivors' next
all-reduce fails (gRPC reset: about 2 s; a frozen peer: the coordination service's heartbeat,
about 10 s; anything else: a step not done within ``collective_timeout_secs``, kept by one
thread, recipes/strategies/collectives.py), and they exit with code 5 after one
line naming the step and the checkpoint to resume from. The launcher restarts the whole group
(every worker and the chief, after all of them have exited); it resumes from the last checkpoint.
A group that does not form (a peer never starts) ends with code 5 after ``startup_timeout_secs``
(a registration barrier of TF's coordination service).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import tensorflow as tf

from recipes.config import ConfigError, RunConfig, TaskInfo
from recipes.errors import EXIT_GROUP_LOST, TrainingFailed
from recipes.failures import first_line, input_failure
from recipes.inputs import check_static
from recipes.runtime import op_threads
from recipes.strategies.checkpoints import Checkpoints
from recipes.strategies.collectives import StepDeadline, join_slices
from recipes.strategies.common import Log, Progress, stream_seed, write_result
from recipes.strategies.optimizer import Optimizer
from recipes.workload import Workload

__all__ = ["run_allreduce"]

# What a lost peer looks like from inside a collective (reset, heartbeat, timeout, abort).
GROUP_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.InternalError,
    tf.errors.UnknownError,
)


def _check_cluster(task: TaskInfo) -> None:
    if task.type not in ("chief", "worker"):
        raise ConfigError(
            f"algo=allreduce runs chief and worker tasks only, not '{task.type}' "
            "(MultiWorkerMirroredStrategy has no parameter servers: plan with cluster.ps=0)"
        )
    if task.n_ps:
        raise ConfigError(
            f"algo=allreduce: TF_CONFIG lists {task.n_ps} ps task(s), but "
            "MultiWorkerMirroredStrategy uses none: plan with cluster.ps=0"
        )


def _bound_group_start(jobs: dict[str, list[str]], startup: float) -> None:
    """Make the group's formation fail after ``startup`` seconds instead of waiting forever.

    Why: MultiWorkerMirroredStrategy's constructor blocks in C++, holding the GIL (no Python
    watchdog thread runs), until every task has registered with the coordination service; for
    the leader (chief or worker 0) TF sets no deadline. This configures the service exactly as
    MWMS would (it keeps a configuration it finds), plus a registration barrier with a timeout:
    every task, the leader included, then gets DeadlineExceededError. Private TF API: if it
    moves, the group start is unbounded again (the launcher's hang detection remains).
    """
    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
        from tensorflow.python.distribute import multi_worker_util
        from tensorflow.python.eager import context
    except ImportError:  # pragma: no cover - another TF layout
        return
    spec = tf.train.ClusterSpec(jobs)
    ctx = context.context()
    ctx.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(jobs[job]))
            for job in ("chief", "worker")
            if job in jobs
        ],
        cluster_register_timeout_in_ms=int(startup * 1000),
    )
    ctx.coordination_service.cluster_register_with_barrier = True


def _set_threads(task: TaskInfo) -> None:
    """As the TF1 recipes: the host's cores split over the tasks on it (runtime.op_threads).
    Before anything runs an op (TensorFlow refuses the change afterwards)."""
    threads = op_threads(task)
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))


def _strategy(task: TaskInfo, startup: float) -> Any:
    jobs = {job: task.cluster[job] for job in ("chief", "worker") if task.cluster.get(job)}
    _bound_group_start(jobs, startup)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(jobs), task_type=task.type, task_id=task.index, rpc_layer="grpc"
    )
    # No timeout_seconds: TF starts a sleeping thread per collective for it (StepDeadline
    # keeps the timeout with one thread, recipes/strategies/collectives.py)
    options = tf.distribute.experimental.CommunicationOptions()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options
    )
    # Why: TF's coordination agent installs a SIGTERM handler that only records a preemption,
    # so the launcher's SIGTERM would not stop the task. Back to the default: SIGTERM ends it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if strategy.num_replicas_in_sync != task.n_replicas:
        raise ConfigError(
            f"algo=allreduce expects one device per task ({task.n_replicas} replicas), found "
            f"{strategy.num_replicas_in_sync}: give each worker one GPU (CUDA_VISIBLE_DEVICES)"
        )
    return strategy, options


def _end_barrier(timeout: float, log: Log) -> None:
    """Wait until every replica has finished its last collective, then let each one go.

    Why: TF's collectives pull data from the sender (RecvBuf), so a replica that completed the
    last all-reduce and exited at once broke its slower peer's last step ("Socket closed", twice
    in one test session). Another collective would only move the race; the coordination
    service's barrier does not (its leader is the chief, which leaves last anyway). A failure
    here comes after the last step: a warning, not an error.
    """
    try:
        from tensorflow.python.eager import context

        context.context().wait_at_barrier("recipes_allreduce_end", int(timeout * 1000))
    except (ImportError, AttributeError):  # pragma: no cover - another TF layout
        return
    except tf.errors.OpError as e:
        log(
            "warning: the replicas did not all reach the end barrier "
            f"({type(e).__name__}: {first_line(e)}); every step was done"
        )


def run_allreduce(cfg: RunConfig, task: TaskInfo, process_start: float, log: Log = print) -> int:
    """Train this replica of the collective group to ``max_steps``; returns the exit code.

    Raises:
        TrainingFailed: NaN loss (code 3), or the group lost a peer (code 5).
        ConfigError: a ps in the cluster, or a checkpoint of another algorithm or model.
    """
    _check_cluster(task)
    timeout = float(cfg.algo.get("collective_timeout_secs", 30.0))
    startup = float(cfg.algo.get("startup_timeout_secs", 120.0))
    _set_threads(task)
    # Before the group forms, what needs no TensorFlow: a missing file fails in a second. The
    # rest (a factory's dataset, the model) after it: MultiWorkerMirroredStrategy must be made
    # before anything initialises TensorFlow's eager context.
    check_static(cfg.data)
    if task.is_chief:
        os.makedirs(cfg.output_dir, exist_ok=True)
        result_path = os.path.join(cfg.output_dir, "result.json")
        if os.path.exists(result_path):
            os.remove(result_path)  # stale, from an earlier run: the evaluator watches for it
    try:
        strategy, options = _strategy(task, startup)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
        raise TrainingFailed(
            f"allreduce: the collective group of {task.n_replicas} did not form within "
            f"startup_timeout_secs={startup:g} ({type(e).__name__}: {first_line(e)}); is every "
            "chief/worker task running?",
            EXIT_GROUP_LOST,
        ) from None
    work = Workload.of(cfg)
    model = work.model
    opt = Optimizer(cfg.algo.optimizer, cfg.algo.lr)
    tf.random.set_seed(cfg.trainer.seed)
    model.prepare()  # a Keras model is built outside the strategy's scope
    with strategy.scope():
        params = model.create_variables()  # MWMS broadcasts the initial values from task 0
        model_state = model.create_state_variables()
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        slots = opt.create_slots(params)
    state = Checkpoints(
        cfg.output_dir, step, params, slots, task, model_state, cfg.trainer.keep_checkpoints
    )
    names = list(params)
    metric_names = work.metric_names()
    train_vars = [params[k] for k in names]
    every_var = [step, *train_vars, *model_state.values(), *slots.values()]

    @tf.function
    def sync_from_chief() -> None:
        def replica_fn() -> Any:
            keep = tf.constant(1.0 if task.is_chief else 0.0, tf.float64)
            mine = [tf.cast(v, tf.float64) * keep for v in every_var]
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, mine, options=options
            )

        summed = strategy.run(replica_fn)
        for var, value in zip(every_var, summed, strict=True):
            var.assign(tf.cast(value, var.dtype))

    @tf.function
    def train_step(x: Any, y: Any) -> Any:
        def replica_fn(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                out = model.forward(params, x, True, model_state)
                loss = work.objective.loss_of(out, y)
            grads = tape.gradient(loss, train_vars)
            metrics = work.objective.metric_values(out, y)
            reported = tf.stack(
                [tf.cast(loss, tf.float32)]
                + [tf.cast(metrics[m], tf.float32) for m in metric_names]
            )
            # One all-reduce (packed) for the dense gradients and the loss/metrics to report,
            # and one all-gather per row shape for the tables' rows (join_slices).
            joined, split = join_slices(grads, train_vars)
            mean = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.MEAN, [reported, *joined], options=options
            )
            return mean[0], split(mean[1:])

        metrics, grads = strategy.run(replica_fn, args=(x, y))
        opt.apply(params, dict(zip(names, grads, strict=True)), slots, step)
        step.assign_add(1)
        return strategy.experimental_local_results(metrics)[0]

    gs = 0
    deadline = StepDeadline(
        timeout, f"no all-reduce finished within algo.collective_timeout_secs={timeout:g}"
    )
    try:
        restored = state.restore_latest() if task.is_chief else None
        with deadline.step(max(startup, timeout)):  # its first run traces the function
            sync_from_chief()
        gs = int(step.numpy())
        if task.is_chief:
            log(
                f"allreduce: {task.n_replicas} replicas, "
                + (
                    f"resuming from the checkpoint of step={restored}"
                    if restored is not None
                    else "fresh"
                )
            )
        progress = Progress(
            cfg, task.n_replicas * cfg.data.batch_size, process_start, task.is_chief, log
        )
        # A resumed run draws a fresh stream (seeded by its start step), not a replay of the
        # first batches of its shard.
        feed = iter(
            work.train_dataset(
                task.replica_index, task.n_replicas, stream_seed(cfg, task.replica_index, gs)
            )
        )
        runs, t = 0, cfg.trainer
        last_ckpt_time = 0.0
        while gs < t.max_steps:
            bx, by = next(feed)
            with deadline.step(max(startup, timeout) if runs == 0 else None):
                loss, *values = (float(v) for v in train_step(bx, by).numpy())
            gs, runs = int(step.numpy()), runs + 1
            if not np.isfinite(loss):
                raise TrainingFailed(
                    f"loss became NaN near step={gs}: lower algo.lr (now {cfg.algo.lr}) "
                    "or check the data",
                    3,
                )
            progress.update(gs, [loss], dict(zip(metric_names, values, strict=True)))
            if task.is_chief and (
                (t.checkpoint_secs and progress.wall - last_ckpt_time >= t.checkpoint_secs)
                or (not t.checkpoint_secs and gs % (t.checkpoint_steps or t.max_steps) == 0)
            ):
                state.write(gs)
                last_ckpt_time = progress.wall
    except (tf.errors.InvalidArgumentError, StopIteration) as e:
        raise input_failure(e, cfg, gs) from None
    except GROUP_ERRORS as e:
        last = state.last_step if task.is_chief else None
        where = f"the last checkpoint (step={last})" if last is not None else "the last checkpoint"
        raise TrainingFailed(
            f"allreduce: {task.type}/{task.index} lost the collective group near step={gs} "
            f"({type(e).__name__}: {first_line(e)}); restart every chief/worker task together: "
            f"they resume from {where}",
            EXIT_GROUP_LOST,
        ) from None
    finally:
        deadline.close()
    _end_barrier(timeout, log)
    if task.is_chief:
        final = state.last_path if state.last_step == gs else None
        final = final or state.write(gs)
        write_result(cfg, final, work, progress, task.n_replicas, 0, log, op_threads(task))
    progress.close()
    log(f"{task.type}/{task.index} finished after {runs} steps")
    return 0
