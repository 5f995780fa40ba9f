"""Cluster plumbing shared by every role: server, placement, sessions, the ps done-queue.

Fixes for the TF 2.21 pitfalls measured in ../shared/TENSORFLOW.md (the shared material beside a checkout):
- a ps exits by itself: it owns ``FIFOQueue(n, shared_name="done_ps<k>")`` and exits 0 once every
  training replica has enqueued a token (and on SIGTERM); the chief reads the same queues' sizes
  to wait, at the end, until the other replicas have stopped pushing;
- non-chief replicas join fast: they poll for initialised ps variables every 0.5 s instead of
  SessionManager's 30 s, and recover from a ps restart with ``recovery_wait_secs=1``;
- a restarted chief joins the live ps values instead of restoring an older checkpoint over them;
  it restores only when the ps are uninitialised (first start, or a ps restart);
- in an elastic job (sessions that carry their own cluster) a ps that went away reads as
  ``UnknownError`` ("Connection reset by peer", gRPC status 14), which MonitoredSession does
  not recover from: :class:`PeerLossIsUnavailable` gives it as the ``UnavailableError`` a
  fixed cluster's session raises, so a ps restart is survived the same way; so is a step's
  ``CancelledError`` that a restarted ps's "Session handle is not found" caused;
- checkpoints are written (and read) by each ps where every ps sees the output folder, else by
  the chief itself, streamed through it a chunk at a time: a sharded saver's ps write their
  shards on their own hosts' disks, which fails, or scatters the checkpoint, where the hosts
  share no output folder (:func:`chief_saver`, recipes/ps_saving.py,
  recipes/streamed_saver.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Callable, Optional, Union

import tensorflow as tf

from recipes.config import TaskInfo
from recipes.errors import CheckpointMissing, PeerUnreachable
from recipes.live import Live
from recipes.ps_saving import missing_file_line
from recipes.streamed_saver import streamed_saver

__all__ = [
    "PeerLossIsUnavailable",
    "PeerUnreachable",
    "RoleSessionCreator",
    "chief_saver",
    "done_queue_sizes",
    "done_token_ops",
    "make_server",
    "lost_peer",
    "op_threads",
    "run_ps",
    "session_config",
    "touches_ps",
    "wait_for_done_tokens",
    "wait_for_peers",
    "wait_until_initialized",
]

v1 = tf.compat.v1
# How often a replica retries a ps that is unreachable or not initialised yet. Why 0.2 s: a
# restarted ps is back within a second (a warm standby takes over), and each retry is one
# cheap session on the local server; the chief's recovery and the workers' rejoin wait for
# the next retry.
POLL_SECS = 0.2
POLL_ABORTS = 20  # refused re-sent polls in a row (AbortedError) before a ps gives up


def op_threads(task: TaskInfo) -> int:
    """TensorFlow threads per pool for this task: the host's cores split over the cluster's
    tasks on the same host (at least 1), or ``TFPLAN_TF_THREADS`` when set (0 = TF's default of
    one per core). Why: TF sizes each task's pools to every core of the host, and 3 tasks on 2
    cores then spin-wait against each other (a 1-thread process ran 2-5x faster than a default
    one here, see docs/bench_training.md)."""
    env = os.environ.get("TFPLAN_TF_THREADS")
    if env is not None and env.strip():
        return max(0, int(env))
    addresses = [a for job in task.cluster.values() for a in job]
    try:
        own = task.cluster[task.type][task.index]
    except (KeyError, IndexError):
        return 0
    host = own.rsplit(":", 1)[0]
    sharing = sum(1 for a in addresses if a.rsplit(":", 1)[0] == host)
    cores = os.cpu_count() or 1
    if sharing <= 1:
        return 0
    return max(1, cores // sharing)


def wait_for_peers(task: TaskInfo, timeout_secs: float, log: Any = print) -> None:
    """Wait until every parameter server accepts a TCP connection, saying every 10 s which
    one is awaited and why. TensorFlow itself waits silently and forever for an unreachable ps
    (``CreateSession still waiting``, hidden at the log levels the tasks run with).

    A ps that is starting refuses connections for a few seconds: that is waited for too.

    Raises:
        PeerUnreachable: one still cannot be reached after ``timeout_secs``, naming it, its
            address, this host and the last error.
    """
    import socket

    pending = dict(enumerate(task.cluster.get("ps", [])))
    began = time.monotonic()
    said = began
    # short first, then every 0.5 s: a ps started beside this task (forked from a sweep's warm
    # seed, or a standby taking over) listens within a fraction of a second
    pause = 0.02
    errors: dict[int, str] = {}
    while pending:
        for index, address in list(pending.items()):
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
                    del pending[index]
            except OSError as exc:
                errors[index] = exc.strerror or type(exc).__name__
        if not pending:
            return
        now = time.monotonic()
        if now - began >= timeout_secs:
            index = min(pending)
            raise PeerUnreachable(
                f"cannot reach ps/{index} at {pending[index]} from {socket.gethostname()} "
                f"for {now - began:.0f}s ({errors[index]}): check the route and firewall between "
                "the hosts"
            )
        if now - said >= 10.0:
            said = now
            waiting = ", ".join(f"ps/{i} at {a} ({errors[i]})" for i, a in pending.items())
            log(f"{task.type}/{task.index}: waiting for {waiting}, {now - began:.0f}s")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def session_config(task: TaskInfo) -> Any:
    """Device filters: a replica talks to the ps and itself only, so one dead peer worker does
    not block session creation, and replicas do not wait for each other to start. Thread pools
    sized by :func:`op_threads`."""
    if task.type == "ps":
        filters = [task.device]
    else:
        filters = ["/job:ps", task.device]
    threads = op_threads(task)
    return v1.ConfigProto(
        device_filters=filters,
        allow_soft_placement=False,
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=threads,
    )


def joining_config(task: TaskInfo, config: Any) -> Any:
    """``config`` for a worker that may join a running job: its sessions carry their own
    cluster (the ps and this worker: ClusterSpec propagation), so a ps started before it can
    still reach it (a ps receives a worker's tensors by calling it), sharing the variables of
    every other session (``share_session_state_in_clusterspec_propagation``). Its server must
    have booted under another name (``make_server(joining=True)``): TensorFlow refuses a
    session whose master is named in the propagated cluster as it booted."""
    joining = v1.ConfigProto()
    joining.CopyFrom(config)
    own = task.cluster[task.type][task.index]
    spec = tf.train.ClusterSpec(
        {"ps": list(task.cluster.get("ps", [])), task.type: {task.index: own}}
    )
    joining.cluster_def.CopyFrom(spec.as_cluster_def())
    joining.experimental.share_session_state_in_clusterspec_propagation = True
    return joining


BOOT_JOB = "joining"  # the job a joining worker's server boots as (see joining_config)


def make_server(task: TaskInfo, joining: bool = False) -> Any:
    """Start this task's gRPC server (note: it listens on every interface, see docs/runtime.md).
    ``joining``: booted under :data:`BOOT_JOB`, on its own port; its sessions name it."""
    if joining:
        own = task.cluster[task.type][task.index]
        boot = tf.train.ClusterSpec({BOOT_JOB: {task.index: own}})
        return tf.distribute.Server(
            boot, job_name=BOOT_JOB, task_index=task.index, config=session_config(task), start=True
        )
    spec = tf.train.ClusterSpec(task.cluster)
    return tf.distribute.Server(
        spec, job_name=task.type, task_index=task.index, config=session_config(task), start=True
    )


def chief_saver(
    var_list: Optional[dict[str, Any]] = None,
    keep: int = 5,
    sharded: bool = False,
    streamed: bool = False,
) -> Any:
    """The chief's saver. ``sharded``: TensorFlow's sharded saver, each ps saving and restoring
    its own variables where they live (only where every ps sees the output folder:
    recipes/ps_saving.py). ``streamed`` (the ps do not see it): the checkpoint is written on the
    chief's host, streamed through the chief in bounded chunks (recipes/streamed_saver.py), so
    the chief never holds the model whole. Else a plain saver of every global variable whose
    save and restore ops run on the chief (a job without ps).

    Why: ``Scaffold``'s default saver is sharded: each ps saves its own variables on its own
    file system and one ps merges the shards, so on hosts that share no output folder the
    chief's first save fails (TF 2.21, hosts in network namespaces with private folders:
    ``NotFoundError: .../model.ckpt-0_temp/part-00000-of-00002 did not exist
    [[save/MergeV2Checkpoints]]``, from ps/1). Ops of a non-sharded saver have no device, so
    the session places them on the chief: it pulls the variables and writes (and reads) whole
    checkpoints on its own host, all at once (the streamed one, a chunk at a time). Create it
    once the graph is complete; the files are the same V2 format whichever wrote them."""
    if streamed and not sharded and var_list:
        return streamed_saver(var_list, keep)
    return v1.train.Saver(var_list=var_list, sharded=sharded, allow_empty=True, max_to_keep=keep)


# Not the number of replicas: replicas that join a running job build the same shared queue
# with another count, and a shared queue refuses a second capacity.
DONE_QUEUE_CAPACITY = 1 << 16


def _done_queue(k: int, capacity: int) -> Any:
    del capacity  # kept for the callers' readability: tokens never exceed the replicas
    return tf.queue.FIFOQueue(
        DONE_QUEUE_CAPACITY,
        [tf.int32],
        shapes=[[]],
        shared_name=f"done_ps{k}",
        name=f"done_ps{k}",
    )


def replicas_now(task: TaskInfo) -> int:
    """How many done tokens end the job: every replica that ever took part, as the launcher
    last told (``live.json``), else TF_CONFIG's count."""
    return _live(task).get("replicas", task.n_replicas)


_LIVES: dict[Optional[str], Live] = {}


def _live(task: TaskInfo) -> Live:
    if task.run_yaml not in _LIVES:
        _LIVES[task.run_yaml] = Live(task.run_yaml)
    return _LIVES[task.run_yaml]


def done_token_ops(n_ps: int, n_replicas: int) -> list[Any]:
    """One enqueue op per ps; a replica runs all of them once its training session is closed."""
    ops = []
    for k in range(n_ps):
        with v1.device(f"/job:ps/task:{k}"):
            ops.append(_done_queue(k, n_replicas).enqueue(tf.constant(1, tf.int32)))
    return ops


def done_queue_sizes(n_ps: int, n_replicas: int) -> list[Any]:
    """How many done tokens each ps holds so far (the same queues as :func:`done_token_ops`)."""
    sizes = []
    for k in range(n_ps):
        with v1.device(f"/job:ps/task:{k}"):
            sizes.append(_done_queue(k, n_replicas).size())
    return sizes


def wait_for_done_tokens(
    target: str,
    config: Any,
    sizes: list[Any],
    want: Union[int, Callable[[], int]],
    timeout: float,
    log: Any = print,
    poll_secs: float = 0.05,
) -> bool:
    """Wait until every ps holds at least ``want`` done tokens, at most ``timeout`` seconds.

    A replica sends its token once its training session is closed, so ``want`` tokens from the
    other replicas mean that none of them will push another update. Returns False on timeout,
    or when a ps does not answer (e.g. it restarted and lost the tokens sent to it before).
    While it waits it logs a line every few seconds: the wait is not a hang.
    """
    start = time.monotonic()
    next_note = start + 1.0
    with v1.Session(target, config=config) as sess:
        while True:
            try:
                have = min(int(n) for n in sess.run(sizes, options=_short_run()))
            except tf.errors.OpError:
                return False
            wanted = want() if callable(want) else want
            if have >= wanted:
                return True
            now = time.monotonic()
            if now - start >= timeout:
                return False
            if now >= next_note:
                log(
                    f"waiting for {wanted - have} more replica(s) to finish "
                    f"({now - start:.0f}s of at most {timeout:.0f}s)"
                )
                next_note = now + 3.0
            time.sleep(poll_secs)


def _newer_than(snapshot: Any, checkpoint: str) -> bool:
    """Whether an earlier chief's snapshot is past ``checkpoint``: a later step, taken after the
    checkpoint was written (one left by a run before the output folder was emptied is not)."""
    tail = checkpoint.rsplit("-", 1)[-1]
    try:
        written = os.path.getmtime(checkpoint + ".index")
    except OSError:
        return False
    return tail.isdigit() and snapshot.step > int(tail) and snapshot.taken > written


def _short_run() -> Any:
    return v1.RunOptions(timeout_in_ms=5000)


def run_ps(task: TaskInfo, log: Any = print, on_exit: Callable[[], None] = lambda: None) -> int:
    """Serve variables until every replica has sent its done token, or SIGTERM; returns the exit
    code. ``on_exit`` runs as it ends its job (the ps's own snapshots are removed: no chief needs
    them then). A ps stopped (SIGTERM: a teardown, or a cluster re-planned around a lost host) or
    killed leaves them: the next chief of the job may restore from them (and from the copies of
    other ps' snapshots its host holds); tfplan removes them when it gives the hosts back."""

    def stopped(*_: Any) -> None:
        os._exit(0)

    # Why SIGTERM -> exit 0: a launcher that stops the cluster has not seen a ps failure.
    signal.signal(signal.SIGTERM, stopped)
    server = make_server(task)
    n = replicas_now(task)
    with v1.Graph().as_default():
        with v1.device(task.device):
            size = _done_queue(task.index, n).size()
        with v1.Session(server.target, config=session_config(task)) as sess:
            log(
                f"ps/{task.index} serving on {task.cluster['ps'][task.index]}; "
                f"exits after {n} done tokens"
            )
            # Poll the size instead of blocking in dequeue: a blocked C++ call would delay the
            # SIGTERM handler, and polling never consumes a token.
            aborted = 0
            while True:
                try:
                    got = int(sess.run(size))
                except tf.errors.AbortedError:
                    # "The same RunGraph request was received twice": gRPC resent the poll
                    # (seen under load, as a sync job ended) and the ps refused the copy. A
                    # queue's size is read again at no cost; only a run of them is a failure.
                    aborted += 1
                    if aborted >= POLL_ABORTS:
                        raise
                    time.sleep(0.1)
                    continue
                aborted = 0
                now = replicas_now(task)
                if now != n:
                    log(f"ps/{task.index}: the job has {now} replicas now; exits after {now}")
                    n = now
                if got >= n:
                    break
                time.sleep(0.1)
    log(f"ps/{task.index} done: {n} of {n} replicas finished")
    on_exit()
    sys.stdout.flush()
    # Why _exit: the gRPC server has no clean shutdown and would keep the process alive.
    os._exit(0)


def touches_ps(fetches: list[Any]) -> bool:
    """Whether running ``fetches`` (ops or tensors) executes any op placed on a ``/job:ps`` task,
    following data and control inputs. A run that touches no ps makes no ps round trip."""
    stack = [getattr(f, "op", f) for f in fetches]
    seen: set[int] = set()
    while stack:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        if "/job:ps" in op.device:
            return True
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return False


# What TensorFlow says, inside an UnknownError, when a peer of a propagated session went away.
LOST_PEER_SIGNS = (
    "grpc_status:14",
    "Connection reset by peer",
    "Connection refused",
    "Socket closed",
    "failed to connect to all addresses",
)


# What a step's CancelledError carries when what cancelled it was a peer's loss: TensorFlow
# raises a step's errors as one, typed after whichever came first, and a worker's own cancelled
# receive can come before the restarted ps's "Session handle is not found" (seen on Slurm: the
# chief then exited 1 instead of recovering).
CANCELLED_BY_PEER_SIGNS = ("ABORTED: From /job:ps", "UNAVAILABLE: From /job:ps", "just restarted")


def lost_peer(error: Exception) -> bool:
    """A peer (a ps) went away: Unavailable or Aborted, their text inside an UnknownError, or
    a CancelledError that a ps's loss caused."""
    if isinstance(error, (tf.errors.UnavailableError, tf.errors.AbortedError)):
        return True
    text = str(error)
    if isinstance(error, tf.errors.CancelledError):
        return any(s in text for s in CANCELLED_BY_PEER_SIGNS)
    return isinstance(error, tf.errors.UnknownError) and any(s in text for s in LOST_PEER_SIGNS)


# TensorFlow's session interface (not exported): Saver.save and the hooks check for it.
_SessionInterface: Any = next(c for c in v1.Session.__mro__ if c.__name__ == "SessionInterface")


class PeerLossIsUnavailable(_SessionInterface):
    """A raw session whose lost-peer ``UnknownError`` is raised as ``UnavailableError``: what
    MonitoredSession recovers from (a new session, the chief restoring the checkpoint)."""

    def __init__(self, sess: Any) -> None:
        self._sess = sess

    @property
    def graph(self) -> Any:
        return self._sess.graph

    @property
    def sess_str(self) -> Any:
        return self._sess.sess_str

    def partial_run_setup(self, *args: Any, **kwargs: Any) -> Any:
        return self._sess.partial_run_setup(*args, **kwargs)

    def partial_run(self, *args: Any, **kwargs: Any) -> Any:
        return self._sess.partial_run(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._sess.run(*args, **kwargs)
        except (tf.errors.UnknownError, tf.errors.CancelledError) as e:
            if not lost_peer(e):
                raise
            raise tf.errors.UnavailableError(e.node_def, e.op, e.message) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sess, name)


def _peer_errors() -> tuple[type[Exception], ...]:
    return (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.UnknownError)


def wait_until_initialized(
    target: str, config: Any, probe: Any, timeout: float, log: Any = print
) -> None:
    """Poll ``probe`` (report_uninitialized_variables of the globals) until it is empty.

    Raises:
        TimeoutError: still uninitialised after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    said = False
    while True:
        try:
            with v1.Session(target, config=config) as sess:
                while True:
                    if len(sess.run(probe)) == 0:
                        return
                    if not said:
                        log("waiting for the chief to initialise the parameter servers")
                        said = True
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"ps variables still uninitialised after {timeout:.0f}s"
                            " (is the chief running?)"
                        )
                    time.sleep(POLL_SECS)
        except _peer_errors() as e:
            if not lost_peer(e):
                raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"parameter servers unreachable for {timeout:.0f}s") from None
            time.sleep(POLL_SECS)


class RoleSessionCreator(v1.train.SessionCreator):  # type: ignore[name-defined]
    """Session creator for chief and non-chief replicas (see the module docstring)."""

    def __init__(
        self,
        scaffold: Any,
        target: str,
        config: Any,
        is_chief: bool,
        checkpoint_dir: Optional[str],
        probe: Any,
        join_timeout: float = 600.0,
        log: Any = print,
        snapshots: Any = None,
        reshard: Any = None,
        cluster: Optional[dict[str, list[str]]] = None,
        own_address: str = "",
    ) -> None:
        # the cluster's addresses, this task's own: where a missing checkpoint file is missing
        self._cluster, self._own = dict(cluster or {}), own_address
        # recipes.dynamic_reshard.Resharder: the latest checkpoint's dynamic tables re-sharded
        self._reshard = reshard
        self._snapshots = snapshots  # recipes.ps_snapshots.PsSnapshots: a ps back from its own
        self._scaffold = scaffold
        self._target = target
        self._config = config
        self._is_chief = is_chief
        self._checkpoint_dir = checkpoint_dir
        self._probe = probe
        self._join_timeout = join_timeout
        self._log = log
        self._manager: Optional[Any] = None

    def _session_manager(self) -> Any:
        if self._manager is None:
            self._manager = v1.train.SessionManager(
                local_init_op=self._scaffold.local_init_op,
                ready_op=self._scaffold.ready_op,
                ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
                graph=v1.get_default_graph(),
                recovery_wait_secs=1,
                local_init_feed_dict=self._scaffold.local_init_feed_dict,
            )
        return self._manager

    def _uninitialized(self) -> list[Any]:
        """The names of the global variables not initialised on the ps; waits (without
        spinning) while a ps is unreachable, e.g. while it restarts: MonitoredSession retries
        create_session at once, and a busy retry loop starves the restarting ps of the CPU it
        needs to start."""
        deadline = time.monotonic() + self._join_timeout
        while True:
            try:
                with v1.Session(self._target, config=self._config) as sess:
                    return list(sess.run(self._probe))
            except _peer_errors() as e:
                if not lost_peer(e) or time.monotonic() > deadline:
                    raise
                time.sleep(POLL_SECS)

    def create_session(self) -> Any:
        try:
            return PeerLossIsUnavailable(self._create_session())
        except tf.errors.NotFoundError as e:  # a restore's file not where it is read: one line
            line = missing_file_line(e, self._cluster, self._own, self._checkpoint_dir)
            if line is None:
                raise
            raise CheckpointMissing(line) from None

    def _create_session(self) -> Any:
        self._scaffold.finalize()
        sm = self._session_manager()
        missing = self._uninitialized() if self._is_chief else []
        latest = None
        if missing:
            latest = (
                tf.train.latest_checkpoint(self._checkpoint_dir) if self._checkpoint_dir else None
            )
        alone = bool(missing) and self._restored_alone(missing, latest)
        if missing and not alone and self._reshard is not None:
            reshard = self._reshard
            self._log(
                f"parameter servers uninitialised: restoring {os.path.basename(reshard.checkpoint)}"
                ", its dynamic tables re-sharded over this job's parameter servers"
            )
            return sm.prepare_session(
                self._target,
                config=self._config,
                init_op=self._scaffold.init_op,
                init_fn=reshard.restore,
            )
        if missing and not alone:
            # Fresh ps (first start, or a ps restart before any snapshot): restore the last
            # checkpoint into every ps, else initialise them.
            self._log(
                "parameter servers uninitialised: "
                + (f"restoring {os.path.basename(latest)}" if latest else "initialising them")
            )
            session = sm.prepare_session(
                self._target,
                saver=self._scaffold.saver,
                checkpoint_dir=self._checkpoint_dir,
                config=self._config,
                init_op=self._scaffold.init_op,
                init_fn=self._scaffold.init_fn,
            )
            if self._snapshots is not None:  # a ps back while training: said and recorded
                self._snapshots.restored_whole(self._snapshots.ps_of(missing), latest, self._log)
            return session
        if self._is_chief and not alone:
            self._log("parameter servers already initialised: joining their live values")
        else:
            wait_until_initialized(
                self._target, self._config, self._probe, self._join_timeout, self._log
            )
        return sm.wait_for_session(
            self._target, config=self._config, max_wait_secs=self._join_timeout
        )

    def _restored_alone(self, missing: list[Any], latest: Optional[str]) -> bool:
        """Restore only the ps that came back empty (each from its snapshot, else from the
        checkpoint), when this chief has snapshots of them; False (nothing done) when not, or
        when a variable is still uninitialised after it (then every ps gets the checkpoint)."""
        snapshots = self._snapshots
        if snapshots is None:
            return False
        came_back = snapshots.ps_of(missing)
        restarted = came_back
        if came_back and snapshots.together:
            # synchronous rounds: every ps back to one snapshot, so that the global step counts
            # exactly the rounds every ps holds (one ps back alone would lose rounds it counts)
            restarted = snapshots.all_ps
        known = all(snapshots.last(k) for k in restarted)
        if not restarted or not (known or latest):  # (a job's first start: nothing to find)
            return False
        with v1.Session(self._target, config=self._config) as sess:
            found = {}
            if not known:
                # this chief took none of them (the cluster restarted whole: re-planned around a
                # lost host, or chief and ps together): what an earlier chief left, if newer
                # than the last checkpoint, for every restarted ps
                found = snapshots.found(sess, restarted)
                if not latest or not all(
                    k in found and _newer_than(found[k], latest) for k in restarted
                ):
                    return False
            if restarted != came_back:
                back = ", ".join(f"ps/{k}" for k in came_back)
                self._log(
                    f"{back} came back: every ps goes back to one snapshot (synchronous rounds)"
                )
            said = [snapshots.restore(sess, k, latest, self._log, found.get(k)) for k in restarted]
            if snapshots.together and not all(s.startswith("snapshot of step") for s in said):
                # one of them could not be read: all from the checkpoint, still together
                for k in restarted:
                    snapshots.restore(sess, k, latest, self._log, use_snapshot=False)
            left = sess.run(self._probe)
        if len(left):
            names = ", ".join(n.decode() for n in left[:3])
            self._log(f"still uninitialised after the ps restore: {names}; restoring every ps")
            return False
        return True
