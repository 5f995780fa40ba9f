"""``algo=pss``: TF2 ParameterServerStrategy with a ClusterCoordinator.

Roles: the ``chief`` task is the coordinator (it trains nothing itself: it creates the variables
on the parameter servers, schedules one step function per minibatch on whichever worker is free,
checkpoints, logs and writes ``result.json``); ``ps`` and ``worker`` tasks only run a TensorFlow
server. Workers apply their updates to the ps variables asynchronously (as ``hogwild``). One
global step = one minibatch. Minibatches come from one stream over the whole training split (a
fresh seeded permutation per epoch) that the coordinator ships with each scheduled function;
that is sharding by example: whichever worker is free takes the next batches. One scheduled
function trains ``steps_per_closure`` (K, default 8) minibatches in a row, each one update of the
ps variables read afresh (so the same rule as K=1); K amortises the coordinator's per-dispatch
cost, which halved throughput at K=1 (docs/bench_strategies.md).

Stopping: the coordinator schedules exactly the steps left to ``max_steps``, in chunks that end
on every log, summary and checkpoint boundary; it waits for each chunk (``join``), so
checkpoints land on exact multiples of ``checkpoint_steps``. A function retried after a worker
died in it may have applied some of its K steps already: the count can then pass ``max_steps``
by up to K per such retry.

Servers end by themselves: each owns a ``FIFOQueue(shared_name="pss_done")`` and polls its size
in its own graph session; the coordinator, after ``result.json``, enqueues one token into every
worker's and every ps's queue through a plain graph session on that task, never closed (closing
one whose server had already exited blocked forever) (an eager op would not
do: the eager service keeps each client's resources apart from the server's sessions), and the
server exits 0 about 0.2 s later. A server also exits 0 on SIGTERM. If the coordinator dies for
good, the servers keep waiting for a restarted one: the launcher must stop them.

Failures: a dead worker is the coordinator's business (it reschedules the step on another worker
and takes the worker back when it is restarted). A dead ps fails the coordinator: it exits with
code 5, and a restarted chief (with the ps restarted) resumes from the last checkpoint.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from recipes.config import ConfigError, RunConfig, TaskInfo
from recipes.errors import EXIT_GROUP_LOST, TrainingFailed
from recipes.failures import first_line, input_failure
from recipes.runtime import op_threads
from recipes.strategies.checkpoints import Checkpoints
from recipes.strategies.common import Log, Progress, stream_seed, write_result
from recipes.strategies.optimizer import Optimizer
from recipes.strategies.table_upkeep import TableUpkeep
from recipes.workload import Workload

__all__ = ["run_pss", "run_pss_server", "send_done_tokens"]

v1 = tf.compat.v1
DONE_QUEUE = "pss_done"
STEPS_PER_CLOSURE = 8  # minibatches per scheduled function (conf/algo/pss.yaml's default)
POLL_SECS = 0.2


def _check_cluster(task: TaskInfo) -> None:
    if not task.has_chief_job:
        raise ConfigError(
            "algo=pss needs a separate chief task, the coordinator: plan with "
            "cluster.chief=separate"
        )
    if not task.n_ps or not task.cluster.get("worker"):
        raise ConfigError(
            "algo=pss needs at least one ps and one worker task "
            f"(TF_CONFIG has {task.n_ps} ps, {len(task.cluster.get('worker', []))} workers)"
        )
    if task.type not in ("chief", "ps", "worker"):
        raise ConfigError(f"algo=pss runs chief, ps and worker tasks, not '{task.type}'")


def _cluster_spec(task: TaskInfo) -> Any:
    return tf.train.ClusterSpec({job: task.cluster[job] for job in ("chief", "ps", "worker")})


def _done_queue() -> Any:
    return tf.queue.FIFOQueue(8, [tf.int32], shapes=[[]], shared_name=DONE_QUEUE, name=DONE_QUEUE)


def run_pss(cfg: RunConfig, task: TaskInfo, process_start: float, log: Log = print) -> int:
    """A pss task: the coordinator (chief) or a server (ps, worker); returns the exit code."""
    _check_cluster(task)
    if task.type == "chief":
        return run_coordinator(cfg, task, process_start, log)
    return run_pss_server(task, log)


def run_pss_server(task: TaskInfo, log: Log = print) -> int:
    """Serve until the coordinator's done token arrives (or SIGTERM); returns 0."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    threads = op_threads(task)
    # Why at least 3 inter-op threads: with 1, the step functions deadlocked (TENSORFLOW.md,
    # pitfall 9; reproduced here with separate processes on 2 cores).
    config = v1.ConfigProto(
        inter_op_parallelism_threads=max(3, threads) if threads else 0,
        intra_op_parallelism_threads=threads,
    )
    server = tf.distribute.Server(
        _cluster_spec(task),
        job_name=task.type,
        task_index=task.index,
        config=config,
        protocol="grpc",
        start=True,
    )
    with tf.Graph().as_default():
        with v1.device(task.device):
            size = _done_queue().size()
        poll_config = v1.ConfigProto(device_filters=[task.device])
        with v1.Session(server.target, config=poll_config) as sess:
            log(
                f"{task.type}/{task.index} serving on {task.cluster[task.type][task.index]} for "
                "the pss coordinator; exits when it is done"
            )
            # Poll, never block in dequeue: a blocked C++ call would delay the SIGTERM handler.
            while int(sess.run(size)) < 1:
                time.sleep(POLL_SECS)
    log(f"{task.type}/{task.index} done: the coordinator finished")
    sys.stdout.flush()
    os._exit(0)  # the gRPC server has no clean shutdown and would keep the process alive


# Token sessions are never closed: the server exits as soon as its token is in, and closing a
# gRPC session whose server is gone blocked the coordinator forever (seen in 1 of about 10
# runs). Kept referenced so that garbage collection does not close them either.
_TOKEN_SESSIONS: list[Any] = []


def _send_token(job: str, k: int, address: str, timeout: float) -> None:
    device = f"/job:{job}/replica:0/task:{k}"
    graph = tf.Graph()
    with graph.as_default():
        with v1.device(device):
            enqueue = _done_queue().enqueue(tf.constant(1, tf.int32))
    sess = v1.Session(
        f"grpc://{address}", graph=graph, config=v1.ConfigProto(device_filters=[device])
    )
    _TOKEN_SESSIONS.append(sess)
    sess.run(enqueue, options=v1.RunOptions(timeout_in_ms=int(timeout * 1000)))


def send_done_tokens(task: TaskInfo, log: Log = print, timeout: float = 10.0) -> list[str]:
    """Enqueue a done token on every worker and ps, each from its own thread, and wait at most
    ``timeout`` seconds; returns the tasks that missed it (the launcher has to stop those)."""
    targets = [(j, k, a) for j in ("worker", "ps") for k, a in enumerate(task.cluster.get(j, []))]
    errors: dict[str, str] = {}

    def send(job: str, k: int, address: str) -> None:
        try:
            _send_token(job, k, address, timeout)
        except tf.errors.OpError as e:
            errors[f"{job}/{k}"] = type(e).__name__

    threads = [
        threading.Thread(
            target=send, args=target, daemon=True, name=f"token-{target[0]}{target[1]}"
        )
        for target in targets
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout + 5.0
    missed = []
    for (job, k, _), thread in zip(targets, threads, strict=True):
        thread.join(max(0.0, deadline - time.monotonic()))
        name = f"{job}/{k}"
        if thread.is_alive() or name in errors:
            missed.append(name)
            why = errors.get(name, f"no answer within {timeout + 5:g}s")
            log(
                f"warning: could not tell {name} to stop ({why}); the launcher will have to stop it"
            )
    return missed


def wait_for_servers(task: TaskInfo, timeout: float, log: Log) -> None:
    """Until every ps and worker accepts a TCP connection. Why: ParameterServerStrategy fails
    the whole job when the first steps reach a server that is not up yet.

    Raises:
        TrainingFailed: some server did not come up within ``timeout`` (code 5).
    """
    deadline = time.monotonic() + timeout
    pending = [(job, k, a) for job in ("ps", "worker") for k, a in enumerate(task.cluster[job])]
    said = False
    while pending:
        job, k, address = pending[0]
        host, port = address.rsplit(":", 1)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                pending.pop(0)
                continue
        except OSError:
            pass
        if time.monotonic() > deadline:
            names = ", ".join(f"{j}/{i}" for j, i, _ in pending)
            raise TrainingFailed(
                f"pss: {names} not reachable within startup_timeout_secs={timeout:g}",
                EXIT_GROUP_LOST,
            )
        if not said:
            log(f"waiting for the servers to start ({job}/{k} at {address} first)")
            said = True
        time.sleep(0.2)


def _beside(strategy: Any) -> Callable[[Any], AbstractContextManager[Any]]:
    """How to create variables and resources beside a variable (a dynamic table's shard: its
    ids, last-seen steps and free rows beside its rows): the strategy's ``colocate_vars_with``
    (its round robin ignores device scopes) and the variable's device for the rest (the shard's
    index, a hash table, and its lock)."""

    @contextmanager
    def beside(var: Any) -> Iterator[None]:
        with strategy.extended.colocate_vars_with(var), tf.device(var.device):
            yield

    return beside


def paused(upkeep: Optional[TableUpkeep]) -> AbstractContextManager[Any]:
    """No dynamic-table maintenance inside (a checkpoint being written)."""
    return nullcontext() if upkeep is None else upkeep.paused()


def _boundaries(cfg: RunConfig, gs: int) -> int:
    """The next global step at which the coordinator must look: a log, summary or checkpoint
    boundary, or max_steps."""
    t = cfg.trainer
    every = [t.log_steps, t.summary_steps]
    if not t.checkpoint_secs and t.checkpoint_steps:
        every.append(t.checkpoint_steps)
    nxt = [(gs // n + 1) * n for n in every if n and n > 0]
    return min([t.max_steps, *nxt])


def run_coordinator(cfg: RunConfig, task: TaskInfo, process_start: float, log: Log = print) -> int:
    """Coordinate training to ``max_steps``, then stop every server; returns the exit code.

    Raises:
        TrainingFailed: NaN loss (3), a ps lost or a server that never came up (5).
    """
    startup = float(cfg.algo.get("startup_timeout_secs", 120.0))
    work = Workload.of(cfg, task.n_ps)  # before the servers: a missing file fails in a second
    os.makedirs(cfg.output_dir, exist_ok=True)
    result_path = os.path.join(cfg.output_dir, "result.json")
    if os.path.exists(result_path):
        os.remove(result_path)  # stale, from an earlier run: the evaluator watches for it
    wait_for_servers(task, startup, log)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        _cluster_spec(task), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # see allreduce.py: TF may swallow SIGTERM
    model = work.model
    opt = Optimizer(cfg.algo.optimizer, cfg.algo.lr)
    tf.random.set_seed(cfg.trainer.seed)
    model.prepare()  # a Keras model is built outside the strategy's scope
    with strategy.scope():
        params = model.create_variables(colocate=_beside(strategy))
        model_state = model.create_state_variables()
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        slots = opt.create_slots(params, colocate=strategy.extended.colocate_vars_with)
    tables: dict[str, Any] = getattr(model, "dynamic_tables", dict)()
    state = Checkpoints(
        cfg.output_dir,
        step,
        params,
        slots,
        task,
        model_state,
        cfg.trainer.keep_checkpoints,
        tables,
        opt.slot_fills(),
    )
    upkeep = TableUpkeep(tables, step, slots, opt.slot_fills(), cfg.output_dir) if tables else None
    names = list(params)
    metric_names = work.metric_names()
    train_vars = [params[k] for k in names]
    n_workers = len(task.cluster["worker"])

    per_closure = int(cfg.algo.get("steps_per_closure", STEPS_PER_CLOSURE))
    if per_closure < 1:
        raise ConfigError(f"algo.steps_per_closure={per_closure}: use at least 1")

    dataset = work.train_dataset(0, 1, stream_seed(cfg, 0, 0))
    stacked = tf.nest.map_structure(
        lambda s: tf.TensorSpec([None, *s.shape], s.dtype), dataset.element_spec
    )

    @tf.function(input_signature=list(stacked))
    def train_steps(xs: Any, ys: Any) -> Any:
        """K minibatches in a row on one worker, each one async update of the ps."""

        def replica_fn(xs: Any, ys: Any) -> Any:
            total = tf.zeros([1 + len(metric_names)], tf.float32)
            k = tf.shape(ys)[0]
            for i in tf.range(k):
                x = tf.nest.map_structure(lambda t, i=i: t[i], xs)
                with tf.GradientTape() as tape:
                    out = model.forward(params, x, True, model_state)
                    loss = work.objective.loss_of(out, ys[i])
                grads = tape.gradient(loss, train_vars)
                opt.apply(params, dict(zip(names, grads, strict=True)), slots, step)
                step.assign_add(1)
                metrics = work.objective.metric_values(out, ys[i])
                total += tf.stack(
                    [tf.cast(loss, tf.float32)]
                    + [tf.cast(metrics[m], tf.float32) for m in metric_names]
                )
            return total / tf.cast(k, tf.float32)

        return strategy.run(replica_fn, args=(xs, ys))

    gs = 0
    t = cfg.trainer
    try:
        restored = state.restore_latest()
        for line in state.resharded:
            log(line)
        if upkeep is not None:
            upkeep.start()
        gs = int(step.numpy())
        log(
            f"pss: coordinator with {task.n_ps} ps and {n_workers} workers, "
            + (
                f"resuming from the checkpoint of step={restored}"
                if restored is not None
                else "fresh"
            )
        )
        progress = Progress(cfg, cfg.data.batch_size, process_start, True, log)
        if gs:  # a resumed run draws a fresh stream, not a replay of the first batches
            dataset = work.train_dataset(0, 1, stream_seed(cfg, 0, gs))
        feed = iter(dataset)
        runs, last_ckpt_time = 0, 0.0
        while gs < t.max_steps:
            # The first chunk is one step, for the first-step line; then up to the next boundary.
            target = gs + 1 if runs == 0 else _boundaries(cfg, gs)
            pending = []
            left = target - gs
            while left > 0:
                batch = [next(feed) for _ in range(min(per_closure, left))]
                left -= len(batch)
                xs = tf.nest.map_structure(lambda *t: tf.stack(t), *[b[0] for b in batch])
                ys = tf.stack([b[1] for b in batch])
                pending.append(coordinator.schedule(train_steps, args=(xs, ys)))
            coordinator.join()
            runs += target - gs
            metrics = np.array([rv.fetch() for rv in pending[-20:]], dtype=np.float64)
            gs = int(step.numpy())
            if not np.all(np.isfinite(metrics[:, 0])):
                raise TrainingFailed(
                    f"loss became NaN near step={gs}: lower algo.lr (now {cfg.algo.lr}) "
                    "or check the data",
                    3,
                )
            progress.update(
                gs, metrics[:, 0], dict(zip(metric_names, metrics[-1, 1:], strict=True))
            )
            if (t.checkpoint_secs and progress.wall - last_ckpt_time >= t.checkpoint_secs) or (
                not t.checkpoint_secs and gs % (t.checkpoint_steps or t.max_steps) == 0
            ):
                with paused(upkeep):
                    state.write(gs)
                last_ckpt_time = progress.wall
        if upkeep is not None:  # the final checkpoint: the tables as training left them
            upkeep.stop()
        final = state.last_path if state.last_step == gs else None
        final = final or state.write(gs)
    except (tf.errors.InvalidArgumentError, StopIteration) as e:
        raise input_failure(e, cfg, gs) from None
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as e:
        where = f"step={state.last_step}" if state.last_step is not None else "its start"
        raise TrainingFailed(
            f"pss: lost a parameter server near step={gs} ({type(e).__name__}: "
            f"{first_line(e)}); restart it and the chief: training resumes from {where}",
            EXIT_GROUP_LOST,
        ) from None
    finally:
        if upkeep is not None:
            upkeep.stop()
    write_result(cfg, final, work, progress, n_workers, task.n_ps, log, op_threads(task))
    progress.close()
    send_done_tokens(task, log)
    log(f"chief/0 finished after {runs} steps; servers told to stop")
    return 0
