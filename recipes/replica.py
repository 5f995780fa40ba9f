"""A training replica (worker or chief): build the graph, train, report, send done tokens.

The algorithm (``recipes.algorithms``) builds the replica's graph; this module adds everything the
algorithms share: data sharding, summaries, hooks, the session, progress lines, the chief's final
checkpoint, held-out evaluation and ``result.json``, and the done tokens that let the ps exit.

How a run ends (docs/runtime.md): every replica stops at ``max_steps`` and sends its done
token; the chief first waits (at most ``PEERS_DONE_WAIT_SECS``) for the other replicas' tokens,
so that nobody pushes any more, saves a final checkpoint at the step the ps then hold (unless its
checkpoint hook already saved that step), and describes exactly that checkpoint in
``result.json``: its ``global_step`` is the one stored in the checkpoint, and the accuracy and
losses are those of the checkpoint's weights, restored from disk.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from recipes.algorithms import get_algorithm
from recipes.algorithms.base import BuildContext, Problem, TrainGraph
from recipes.config import RunConfig, TaskInfo
from recipes.dynamic_reshard import Resharder
from recipes.dynamic_table import MaintenanceHook
from recipes.errors import EXIT_NAN_LOSS, EXIT_PEER_TIMEOUT, TrainingFailed
from recipes.evaluator import CheckpointScorer, result_scores
from recipes.export import Exporter, finish_export
from recipes.failures import input_failure
from recipes.inputs import graph_feeds
from recipes.live import Live
from recipes.ps_saving import ps_see_output
from recipes.ps_snapshots import PsSnapshots, SnapshotHook
from recipes.reporting import ProgressLog, result_record, write_result
from recipes.runtime import (
    RoleSessionCreator,
    chief_saver,
    done_queue_sizes,
    done_token_ops,
    joining_config,
    make_server,
    op_threads,
    replicas_now,
    session_config,
    touches_ps,
    wait_for_done_tokens,
    wait_for_peers,
)
from recipes.snapshot_paths import TABLE_BYTES
from recipes.streamed_saver import CHUNK_BYTES
from recipes.traffic import traced_options, traffic_line
from recipes.workload import Workload, saver_names

__all__ = [
    "ReplicaGraph",
    "build_replica_graph",
    "hooked_step",
    "run_replica",
]

v1 = tf.compat.v1
Log = Callable[[str], None]

# How long the chief waits, after its own session closed, for the other replicas' done tokens.
# They normally arrive within a step; a replica that is restarting needs TensorFlow's import and
# a join (seconds), and one that died for good never sends its token: past this bound the chief
# goes on, and a step such a replica pushes later is in neither the final checkpoint nor
# result.json (which still agree with each other). ``TFPLAN_DONE_WAIT_SECS`` overrides it.
PEERS_DONE_WAIT_SECS = 10.0


def peers_done_wait_secs() -> float:
    env = os.environ.get("TFPLAN_DONE_WAIT_SECS", "").strip()
    return max(0.0, float(env)) if env else PEERS_DONE_WAIT_SECS


def step_pause_secs() -> float:
    """``TFPLAN_STEP_PAUSE_SECS``: a sleep after each step (0 when unset). For demos and tests
    whose events (a join, a kill, a told end) must happen while a job trains without end: the
    job still trains, on a fraction of the CPU, instead of taking every core while it waits."""
    env = os.environ.get("TFPLAN_STEP_PAUSE_SECS", "").strip()
    return max(0.0, float(env)) if env else 0.0


@dataclass
class ReplicaGraph:
    train: TrainGraph
    features: Any  # this run's batch, from the replica's tf.data iterator
    labels: Any
    global_step: Any
    probe: Any
    done_ops: list[Any]
    done_sizes: list[Any]
    summary_op: Any  # the chief's; None in the other replicas
    local_init_op: Any  # the algorithm's local init (or the default one) and the input's
    saver_names: dict[str, Any]  # checkpoint name -> variable (workload.saver_names)
    # the chief's: the dynamic tables' maintenance (whether due, the op) and their names
    maintenance: Optional[tuple[Any, Any, list[str]]] = None


def placement_line(named: dict[str, Any], n_ps: int) -> str:
    """Where the model's variables are, as placed: ``model variables: 6 (1.7 KiB) on ps/0
    1.4 KiB, ps/1 300 B`` (what the plan's preview predicted)."""
    per_ps = [0] * n_ps
    count = 0
    for name, value in named.items():
        if not name.startswith("model/"):
            continue
        for var in value if isinstance(value, list) else [value]:  # a split table's slices
            task = tf.DeviceSpec.from_string(var.device).task or 0
            size = var.dtype.base_dtype.size
            for d in var.shape:
                size *= int(d)
            per_ps[min(task, n_ps - 1)] += size
            count += 1
    spread = ", ".join(f"ps/{k} {_size(b)}" for k, b in enumerate(per_ps))
    return f"model variables: {count} ({_size(sum(per_ps))}) on {spread}"


def saving_line(on_ps: bool, output_dir: str) -> str:
    """The chief's line on who writes the checkpoints (recipes/ps_saving.py)."""
    if on_ps:
        return f"checkpoints: each ps saves its own variables into {output_dir} (every ps sees it)"
    return (
        f"checkpoints: the chief saves them into {output_dir} on its host, streamed from the ps"
        f" {_size(CHUNK_BYTES)} at a time (a ps does not see it: no shared output folder)"
    )


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def input_seed(cfg: RunConfig, task: TaskInfo) -> int:
    """The seed of this replica's shuffle: one stream per replica."""
    return cfg.trainer.seed * 1000 + task.replica_index


def shard_of(cfg: RunConfig, task: TaskInfo) -> tuple[int, int]:
    """(shard index, number of shards) of this replica's training data: its own, or with
    ``data.shard=none`` all of it (every replica in its own order: what replicas that join and
    leave a running job need, as no split by their count stays right)."""
    if cfg.data.shard == "none":
        return 0, 1
    return task.replica_index, task.n_replicas


def build_replica_graph(cfg: RunConfig, task: TaskInfo, work: Workload) -> ReplicaGraph:
    """Build this replica's whole graph in the default graph.

    The minibatches come from a ``tf.data`` iterator on this replica's own device (its shard of
    the training data): each ``session.run`` that trains takes exactly one batch, as one feed did.
    """
    v1.set_random_seed(cfg.trainer.seed)
    setter = v1.train.replica_device_setter(
        worker_device=task.device, cluster=tf.train.ClusterSpec(task.cluster)
    )
    with v1.device(setter):
        global_step = v1.train.get_or_create_global_step()
    with v1.device(task.device):
        dataset = work.train_dataset(*shard_of(cfg, task), input_seed(cfg, task))
        iterator = v1.data.make_initializable_iterator(dataset)
        features, labels = iterator.get_next(name="batch")
    ctx = BuildContext(
        algo=cfg.algo,
        n_replicas=task.n_replicas,
        replica_index=task.replica_index,
        is_chief=task.is_chief,
        worker_device=task.device,
        ps_device=setter,
        global_step=global_step,
    )
    problem = Problem(
        create_params=work.model.create_params,
        loss_fn=lambda p: work.loss(p, features, labels),
        inputs=(features, labels),
        loss_on=lambda p, bx, by: work.loss(p, bx, by),
        table_keys=getattr(work.model, "table_keys", frozenset),
    )
    train = get_algorithm(cfg.algo.name).build(ctx, problem)
    with v1.device(task.device):
        # Only the chief writes summaries (its SummarySaverHook): their metrics take a forward
        # pass of their own (inference mode), which the other replicas would build and never
        # run (a second model graph: about a second of CPU for a CTR model of 26 tables)
        summary_op = None
        if task.is_chief:
            _, metrics = work.scores(train.train_params, features, labels)
            summary_op = v1.summary.merge(
                [
                    v1.summary.scalar("loss", train.loss),
                    *(v1.summary.scalar(name, value) for name, value in metrics.items()),
                    v1.summary.scalar("learning_rate", tf.constant(cfg.algo.lr, tf.float32)),
                ]
            )
        probe = v1.report_uninitialized_variables(v1.global_variables())
        local_init = train.local_init_op
        if local_init is None:
            local_init = v1.train.Scaffold.default_local_init_op()
        # the model's own lookup tables (a Keras IntegerLookup's, StringLookup's): each worker
        # holds its own, filled at its local init (an algorithm's local init op leaves them out)
        local_init = tf.group(
            local_init, v1.tables_initializer(), iterator.initializer, name="local_init_with_input"
        )
    maintenance = None
    if task.is_chief and hasattr(work.model, "table_maintenance"):
        with v1.device(setter):
            ops = work.model.table_maintenance()
        if ops is not None:
            maintenance = (*ops, [f"model/{p}" for p in work.model.dynamic_paths()])
    done_ops = done_token_ops(task.n_ps, task.n_replicas)
    done_sizes = done_queue_sizes(task.n_ps, task.n_replicas)
    names = saver_names(global_step, train.params, work.model.state_variables())
    return ReplicaGraph(
        train,
        features,
        labels,
        global_step,
        probe,
        done_ops,
        done_sizes,
        summary_op,
        local_init,
        names,
        maintenance,
    )


class _SaveTimer(v1.train.CheckpointSaverListener):  # type: ignore[name-defined]
    """Tells ``progress`` how long each checkpoint took to write, so the job's examples/s is
    its training's: a final checkpoint of a 10^7-row table (650 MB) took longer than the
    last hundred steps and, counted, made the chief report a fifth of the job's speed."""

    def __init__(self, progress: ProgressLog) -> None:
        self.progress = progress
        self.began = 0.0

    def before_save(self, session: Any, global_step_value: int) -> None:
        self.began = time.monotonic()

    def after_save(self, session: Any, global_step_value: int) -> None:
        self.progress.pause(time.monotonic() - self.began)


class _CheckpointHook(v1.train.CheckpointSaverHook):  # type: ignore[name-defined]
    """TensorFlow's checkpoint hook without its ``graph.pbtxt``: at the session's start it
    writes the whole GraphDef as text (pure-Python protobuf formatting, about a tenth of a small
    run's chief CPU, seconds for a large Keras graph), a file nothing reads. TensorBoard's graph
    still comes from the events file, and every checkpoint but the first (written in the
    same call) keeps its ``.meta``.

    Nor its read of the global step after every step: TensorFlow's hook, not knowing how many
    steps one run makes, asks the ps for the step after each run (``steps_per_run`` of a
    million, "never skips checking"): a round trip per step, a quarter of a small run's chief
    CPU. One step per run is what a chief's run makes; the step read before the run (which other
    workers' updates may have passed) still triggers the save, at most one chief step late."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._set_steps_per_run(1)

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._save_graph_def = False
        try:
            super().after_create_session(session, coord)
        finally:
            self._save_graph_def = True


class _StepRateHook(v1.train.StepCounterHook):  # type: ignore[name-defined]
    """TensorFlow's ``global_step/sec`` summary, also written once at the end when the chief saw
    too few steps for the usual two triggers ``every_n_steps`` apart: a short run, or a chief
    that a faster worker outpaced (downpour on a busy machine: the chief's session observed the
    global step only a few times), still records the rate it trained at."""

    def begin(self) -> None:
        super().begin()
        self._first: tuple[float, int] | None = None
        self._wrote = False

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self._first is None:
            self._first = (time.monotonic(), int(run_values.results))
        super().after_run(run_context, run_values)

    def _log_and_record(self, elapsed_steps: int, elapsed_time: float, global_step: int) -> None:
        self._wrote = True
        super()._log_and_record(elapsed_steps, elapsed_time, global_step)

    def end(self, session: Any) -> None:
        if self._wrote or self._first is None or self._summary_writer is None:
            return
        started, first_step = self._first
        try:
            step = int(session.run(self._global_step_tensor))
        except tf.errors.OpError:  # a ps already gone: no rate rather than a failed end
            return
        elapsed = time.monotonic() - started
        if step > first_step and elapsed > 0:
            self._log_and_record(step - first_step, elapsed, step)
            self._summary_writer.flush()


def _hooks(
    cfg: RunConfig,
    g: ReplicaGraph,
    scaffold: Any,
    is_chief: bool,
    max_steps: int,
    progress: ProgressLog,
) -> list[Any]:
    t = cfg.trainer
    hooks = [
        v1.train.StopAtStepHook(last_step=max_steps),
        v1.train.NanTensorHook(g.train.loss, fail_on_nan_loss=True),
        *g.train.hooks,
    ]
    if is_chief:
        ckpt = (
            {"save_secs": t.checkpoint_secs}
            if t.checkpoint_secs
            else {"save_steps": t.checkpoint_steps or t.max_steps}
        )
        listeners = [_SaveTimer(progress)]
        if g.maintenance is not None:  # before the checkpoint hook: its end comes first
            due, op, paths = g.maintenance
            upkeep = MaintenanceHook(due, op, paths, g.global_step, cfg.output_dir)
            hooks.append(upkeep)
            listeners.append(upkeep.saving())  # no save while a maintenance runs
        hooks += [
            _CheckpointHook(cfg.output_dir, scaffold=scaffold, listeners=listeners, **ckpt),
            v1.train.SummarySaverHook(
                save_steps=t.summary_steps, output_dir=cfg.output_dir, summary_op=g.summary_op
            ),
            _StepRateHook(every_n_steps=t.summary_steps, output_dir=cfg.output_dir),
        ]
    return hooks


def hooked_step(
    sess: Any,
    fetches: list[Any],
    options: Any,
    global_step: Any,
    max_steps: int,
    run_metadata: Any = None,
) -> list[Any] | None:
    """``sess.run(fetches)``; None when it ran past its timeout because the job had already
    reached ``max_steps``. Why: a synchronous replica waits for a token that only another
    aggregation gives; when the others made the last steps without it (under load, one replica
    can do a step's every gradient), none comes, and the run timeout would end the replica as
    if a peer were dead (exit 4) although the job is done."""
    try:
        return list(sess.run(fetches, options=options, run_metadata=run_metadata))
    except tf.errors.DeadlineExceededError:
        probe = v1.RunOptions(timeout_in_ms=5000)
        reached = int(sess._tf_sess().run(global_step, options=probe))  # noqa: SLF001 - no hooks
        if reached >= max_steps:
            return None
        raise


def _send_done_tokens(
    server: Any, task: TaskInfo, g: ReplicaGraph, log: Log, config: Any = None
) -> None:
    options = v1.RunOptions(timeout_in_ms=15000)
    with v1.Session(server.target, config=config or session_config(task)) as sess:
        for k, op in enumerate(g.done_ops):
            try:
                sess.run(op, options=options)
            except tf.errors.OpError as e:
                log(
                    f"warning: could not send the done token to ps/{k} ({type(e).__name__}); "
                    "the launcher will have to stop it"
                )


def _make_server(task: TaskInfo, cpu_devices: int, joining: bool = False) -> Any:
    """This replica's server; with ``cpu_devices`` > 1 it exposes that many CPU devices (for
    in-graph towers: a server ignores ``tf.config.set_logical_device_configuration``)."""
    if cpu_devices <= 1 or joining:
        return make_server(task, joining)
    config = session_config(task)
    config.device_count["CPU"] = cpu_devices
    return tf.distribute.Server(
        tf.train.ClusterSpec(task.cluster),
        job_name=task.type,
        task_index=task.index,
        config=config,
        start=True,
    )


def run_replica(
    cfg: RunConfig,
    task: TaskInfo,
    process_start: float,
    log: Log = print,
    exporter: Optional[Exporter] = None,
) -> int:
    """Train this replica to ``max_steps``; returns the exit code. A chief that trains a user's
    Keras model comes with its ``exporter`` (recipes/train.py starts it before it disables
    eager execution; recipes/export.py), given the final checkpoint at the end.

    Raises:
        TrainingFailed: NaN loss, or a peer that stopped answering (sync run timeout).
        recipes.data.DataError: the data set cannot be loaded.
    """
    work = Workload.of(cfg, task.n_ps)  # before the server: a missing file fails in a second
    result_path = os.path.join(cfg.output_dir, "result.json")
    if task.is_chief:
        os.makedirs(cfg.output_dir, exist_ok=True)
        if os.path.exists(result_path):
            os.remove(result_path)  # stale, from an earlier run: the evaluator watches for it
    # Workers join and leave this job: every replica's sessions carry their own cluster (none
    # of them a legacy session of the ps's boot-time cluster beside the propagated ones)
    joining = cfg.data.shard == "none"
    server = _make_server(task, get_algorithm(cfg.algo.name).cpu_devices(cfg.algo), joining)
    config = session_config(task)
    if joining:
        config = joining_config(task, config)
    g = build_replica_graph(cfg, task, work)
    if task.is_chief and task.n_ps:
        log(placement_line(g.saver_names, task.n_ps))
    ops, n_ops = g.train.step_ops, len(g.train.step_ops)
    # Which runs of the window touch no ps: those run on the raw session, past the hooks.
    local = [not touches_ps([op, g.train.loss]) for op in ops]
    live = Live(task.run_yaml)  # what the launcher may tell later: a new max_steps
    max_steps = live.get("max_steps", cfg.trainer.max_steps)
    ex_per_gs = g.train.batches_per_global_step * cfg.data.batch_size
    leave = threading.Event()
    if not task.is_chief:  # asked to leave a running job: after a push, as at the end
        signal.signal(signal.SIGUSR2, lambda *_: leave.set())
    progress = ProgressLog(ex_per_gs, cfg.trainer.log_steps, process_start, log)
    pause = step_pause_secs()
    i, gs = 0, 0
    trace_at, traced = int(cfg.trainer.trace_step or 0), False
    # after everything that can fail here (the data, the graph): that is said at once
    wait_for_peers(task, cfg.trainer.peer_wait_secs, log)
    on_ps = False
    if task.is_chief and task.n_ps:  # each ps saves its own rows where it sees the folder
        on_ps = ps_see_output(server.target, cfg.output_dir, task.n_ps, config)
        log(saving_line(on_ps, cfg.output_dir))
    scaffold = v1.train.Scaffold(
        # the same op the Scaffold would build again (a report of the global variables not
        # initialised): one less to build in every replica
        ready_for_local_init_op=g.probe,
        local_init_op=g.local_init_op,
        summary_op=g.summary_op,
        saver=chief_saver(
            g.saver_names,
            cfg.trainer.keep_checkpoints,
            sharded=on_ps,
            streamed=task.is_chief and task.n_ps > 0 and not on_ps,
        ),
        local_init_feed_dict=graph_feeds() or None,  # an in-memory shard, fed at the init
    )
    reshard = None  # a dynamic table resumed on another number of ps: its ids re-sharded
    if task.is_chief and hasattr(work.model, "dynamic_tables"):
        latest = tf.train.latest_checkpoint(cfg.output_dir)
        tables = work.model.dynamic_tables()
        if Resharder.needed(latest, tables):
            reshard = Resharder(latest, tables, g.saver_names, log)
    if g.train.rounds is not None:  # the end waits for an open round only while a peer lives
        g.train.rounds.others_done = lambda sess: (
            min(int(n) for n in sess.run(g.done_sizes)) >= replicas_now(task) - 1
        )
    snapshots = None
    if task.is_chief and task.n_ps and cfg.snapshots.secs > 0:
        snapshots = PsSnapshots(
            g.saver_names,
            g.global_step,
            task.n_ps,
            cfg.snapshots.folder,
            cfg.output_dir,
            copies=cfg.snapshots.copies,
            addresses=list(task.cluster.get("ps", [])),
            together=g.train.rounds is not None,
            on_ps=on_ps,
            table_bytes=TABLE_BYTES if cfg.snapshots.deltas else None,
        )
    creator = RoleSessionCreator(
        scaffold,
        server.target,
        config,
        task.is_chief,
        cfg.output_dir,
        g.probe,
        log=log,
        snapshots=snapshots,
        reshard=reshard,
        cluster=task.cluster,
        own_address=task.cluster[task.type][task.index],
    )
    try:
        hooks = _hooks(cfg, g, scaffold, task.is_chief, max_steps, progress)
        if snapshots is not None:
            hooks.append(SnapshotHook(snapshots, cfg.snapshots.secs, log, g.train.rounds))
        stop_hook = next(h for h in hooks if isinstance(h, v1.train.StopAtStepHook))
        with v1.train.MonitoredSession(
            session_creator=creator,
            hooks=hooks,
            stop_grace_period_secs=g.train.stop_grace_secs,
        ) as sess:
            while not sess.should_stop():
                told = live.get("max_steps", cfg.trainer.max_steps)
                if not task.is_chief and f"{task.type}/{task.index}" in live.names("leave"):
                    leave.set()  # told instead of SIGUSR2 (a launcher that cannot signal)
                if told != max_steps:
                    log(f"{task.type}/{task.index}: max_steps {max_steps} -> {told} (told)")
                    max_steps = told
                    stop_hook._last_step = told  # noqa: SLF001 - the hook has no setter
                k = i % n_ops
                if local[k]:
                    # A pure-local step: no hook reads global_step from the ps. The step is
                    # read (one ps round trip per window) only on the first run and on the
                    # last local run before an exchange, so that a stop drops the unpushed
                    # window as the hooked StopAtStepHook would.
                    want_gs = not progress.started or not local[(k + 1) % n_ops]
                    fetches = [ops[k], g.train.loss] + ([g.global_step] if want_gs else [])
                    try:
                        out = sess._tf_sess().run(  # noqa: SLF001 - see docs/runtime.md
                            fetches, options=g.train.run_options
                        )
                    except (tf.errors.UnavailableError, tf.errors.AbortedError):
                        # a ps went away: a hooked run makes MonitoredSession build a new
                        # session (the chief restores the checkpoint), then this run again
                        sess.run(g.global_step)
                        continue
                    loss = out[1]
                    if not np.isfinite(loss):
                        raise v1.train.NanLossDuringTrainingError
                    if want_gs:
                        gs = int(out[2])
                else:
                    # trainer.trace_step: this run's traffic, from TensorFlow's step statistics
                    tracing = 0 < trace_at <= i + 1 and not traced
                    meta = v1.RunMetadata() if tracing else None
                    out = hooked_step(
                        sess,
                        [ops[k], g.train.loss, g.global_step],
                        traced_options(g.train.run_options) if tracing else g.train.run_options,
                        g.global_step,
                        max_steps,
                        run_metadata=meta,
                    )
                    if tracing and out is not None:
                        log(traffic_line(f"{task.type}/{task.index}", i + 1, meta))
                        traced = True
                    if out is None:
                        log(
                            f"{task.type}/{task.index}: the job reached max_steps={max_steps} "
                            "while this replica waited for its synchronous step; it stops there"
                        )
                        break
                    _, loss, gs = out
                    gs = int(gs)
                i += 1
                progress.step(gs, [float(loss)])
                if pause:
                    time.sleep(pause)
                if local[k] and gs >= max_steps:
                    break  # what StopAtStepHook would do at the next hooked run
                if leave.is_set() and not local[k]:
                    log(f"{task.type}/{task.index} leaves the job at step={gs} (asked to)")
                    break
    except tf.compat.v1.train.NanLossDuringTrainingError:
        raise TrainingFailed(
            f"loss became NaN near step={gs}: lower algo.lr (now {cfg.algo.lr}) or check the data",
            EXIT_NAN_LOSS,
        ) from None
    except tf.errors.DeadlineExceededError:
        raise TrainingFailed(
            f"a training step at step={gs} took longer than run_timeout_secs="
            f"{cfg.algo.get('run_timeout_secs')}: a peer replica or ps is "
            "probably down",
            EXIT_PEER_TIMEOUT,
        ) from None
    except (tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError) as e:
        raise input_failure(e, cfg, gs) from None
    if task.is_chief:
        final = _final_checkpoint(cfg, task, server, g, scaffold, log, config)
        _write_result(cfg, task, work, final, progress, log, exporter, snapshots)
    _send_done_tokens(server, task, g, log, config)
    log(f"{task.type}/{task.index} finished after {i} runs")
    return 0


def _final_checkpoint(
    cfg: RunConfig,
    task: TaskInfo,
    server: Any,
    g: ReplicaGraph,
    scaffold: Any,
    log: Log,
    config: Any = None,
) -> str:
    """Wait for the other replicas to stop, then make sure the latest checkpoint holds the ps's
    final step; returns its path."""
    config = config or session_config(task)
    bound = peers_done_wait_secs()
    quiet = wait_for_done_tokens(
        server.target, config, g.done_sizes, lambda: replicas_now(task) - 1, bound, log
    )
    latest = tf.train.latest_checkpoint(cfg.output_dir)
    saved = _stored_step(latest) if latest else None
    with v1.Session(server.target, config=config) as sess:
        gs = int(sess.run(g.global_step))
        # Saved again also when the name says another step than the one stored (a step landed
        # between the hook's read and its save): the final checkpoint's name, result.json and
        # what tfplan says when it resumes then name one step.
        if gs != saved or not (latest or "").endswith(f"-{gs}"):
            latest = scaffold.saver.save(
                sess,
                os.path.join(cfg.output_dir, "model.ckpt"),
                global_step=gs,
                write_meta_graph=False,
            )
    if not quiet:
        log(
            f"warning: not every replica finished within {bound:g}s; a step "
            f"one of them pushes later is not in the final checkpoint (step={gs})"
        )
    return str(latest)


def _stored_step(ckpt: str) -> int | None:
    """The global step stored in a checkpoint (its file name may say otherwise: a step can land
    between the read that names it and the save)."""
    try:
        return int(tf.train.load_checkpoint(ckpt).get_tensor("global_step"))
    except (tf.errors.OpError, ValueError, KeyError):
        return None


def _write_result(
    cfg: RunConfig,
    task: TaskInfo,
    work: Workload,
    ckpt: str,
    progress: ProgressLog,
    log: Log,
    exporter: Any = None,
    snapshots: Optional[PsSnapshots] = None,
) -> None:
    """Score the final checkpoint's weights (held-out split, and a bounded sample of the
    training set), then write result.json atomically. Then a user's Keras model is exported
    from the same checkpoint to ``output_dir/model.keras`` by the ``exporter`` the chief started
    with (recipes/export.py: this process runs with eager execution disabled, Keras saves
    eagerly); a failed export is a warning, not a failed run."""
    threads = op_threads(task)
    config = v1.ConfigProto(
        intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads
    )
    gs, scores = result_scores(CheckpointScorer(work, config), ckpt)
    result = result_record(progress, gs, scores, cfg.algo.name, task.n_replicas, task.n_ps, ckpt)
    if snapshots is not None:  # the in-memory snapshots (recipes/ps_snapshots.py)
        result["snapshots"] = snapshots.summary()
        if snapshots.recoveries:  # each ps restore the chief made while training
            result["ps_recoveries"] = snapshots.recoveries
    write_result(cfg.output_dir, result, log)
    finish_export(exporter, cfg, ckpt, log)
