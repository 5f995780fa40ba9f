"""In-memory snapshots: each parameter server's variables saved from that ps, every second or so,
into its own host's shared memory, so that a ps that dies comes back with seconds of training lost
instead of everything since the last checkpoint.

How (TF1 replicas; the chief drives it):
- one ``Saver`` per ps, over the global variables placed on that ps (the model's rows, the
  optimizer's slots, the global step where it lives), built under ``tf.device(<that ps>)``: its
  ``SaveV2`` and ``RestoreV2`` run on the ps and read and write that ps's own file system. No
  variable is gathered into the chief, whatever the table's size;
- the files go to ``<folder>/tfplan-snapshots-<job>/ps<k>/<slot>/snapshot`` on the ps's host
  (``folder``: ``lifecycle.snapshot_dir``, by default ``/dev/shm``, memory that outlives the ps
  process; ``<job>``: a digest of the output folder, so that two jobs never share one). Two slots
  taken in turn: a snapshot being written never destroys the last complete one;
- :class:`SnapshotHook` starts one snapshot of every ps (one ``session.run``, the ps saving in
  parallel) every ``lifecycle.snapshot_secs`` on a thread of its own: a training step never
  waits for it. The chief remembers, per ps, the last snapshot that completed and the global
  step read in the same run;
- when a ps comes back empty (restarted, or its standby took over), the chief's session creator
  (recipes/runtime.py) restores that ps alone: from its snapshot when it is at least as new as the
  last checkpoint, else from the checkpoint; the other ps keep their live values. A snapshot that
  cannot be read (gone with its host, another shape) falls back to the checkpoint, in one line;
- a ps makes its folder as it starts and removes it as it ends: its job done, or stopped by
  SIGTERM (a teardown, a destroy, a re-planned cluster: a new chief, which never reads an older
  chief's snapshots). A ps killed (SIGKILL, the OOM killer, its host) leaves it for its
  restart; that next life removes it as it ends, and the next run into the same output folder
  writes over it.

A snapshot of a job that is re-applied is never used: the chief that starts the job has no record
of any, so the job resumes from its checkpoint, as before. A snapshot that takes long widens the
interval (to :data:`WIDEN_FACTOR` times its duration) and says so once.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import tensorflow as tf

from recipes.failures import first_line
from recipes.snapshot_paths import RECOVERIES_FILE, snapshot_folder

__all__ = [
    "PsSnapshots",
    "Snapshot",
    "SnapshotFolder",
    "SnapshotHook",
    "snapshot_folder",
]

v1 = tf.compat.v1
SLOTS = ("a", "b")
WIDEN_FACTOR = 5.0  # a snapshot taking d seconds is taken at most every WIDEN_FACTOR * d
SAVE_TIMEOUT_MS = 60_000  # a snapshot not written in this long counts as failed


@dataclass(frozen=True)
class SnapshotFolder:
    """A ps's own snapshot folder, on its host: made as it starts (``SaveV2`` makes no folder),
    kept by a kill (the ps's restart reads the last snapshot from it), removed as the ps ends
    its job or is stopped (SIGTERM)."""

    folder: str
    output_dir: str
    ps_index: int

    @property
    def path(self) -> str:
        return snapshot_folder(self.folder, self.output_dir, self.ps_index)

    def prepare(self, log: Callable[[str], None] = print) -> None:
        try:
            for slot in SLOTS:
                os.makedirs(os.path.join(self.path, slot), exist_ok=True)
        except OSError as e:  # the chief's first snapshot says it too, once
            log(f"ps/{self.ps_index}: no snapshot folder {self.path}: {e.strerror}")

    def remove(self) -> None:
        """What a ps does as it ends: its snapshots are of no use once it is gone for good."""
        shutil.rmtree(self.path, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(self.path))  # the job's folder, once its last ps is gone
        except OSError:
            pass


@dataclass(frozen=True)
class Snapshot:
    """One complete snapshot of one ps."""

    prefix: str  # the files' prefix on the ps's host
    step: int  # the global step read in the run that wrote it
    taken: float  # time.time() when it completed

    def describe(self) -> str:
        age = max(0.0, time.time() - self.taken)
        return f"snapshot of step {self.step:,} ({age:.1f} s old)"


def _ps_index(device: str) -> Optional[int]:
    spec = tf.DeviceSpec.from_string(device or "")
    return spec.task if spec.job == "ps" and spec.task is not None else None


class PsSnapshots:
    """The snapshot and restore ops of every ps, and the chief's record of the last snapshot of
    each. Build it in the chief's graph before the graph is finalised."""

    def __init__(
        self,
        checkpoint_names: dict[str, Any],
        global_step: Any,
        n_ps: int,
        folder: str,
        output_dir: str,
    ) -> None:
        self._global_step = global_step
        self._folder, self._output_dir = folder, output_dir
        self._prefixes: dict[int, dict[str, str]] = {}
        self._savers: dict[int, Any] = {}
        self._checkpoint_savers: dict[int, Any] = {}
        self._variables: dict[int, list[Any]] = {}
        self._names: dict[str, int] = {}  # variable op name -> its ps
        self._shapes: dict[int, list[Any]] = {}  # ps -> its variables' shapes, as now held
        self._last: dict[int, Snapshot] = {}
        self._slot = 0
        self.seen: Optional[int] = None  # the last global step the chief's hooked runs read
        # each ps restore: {"ps", "source", "step", "lost_steps"} (result.json's ps_recoveries)
        self.recoveries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        for var in v1.global_variables():
            k = _ps_index(var.device)
            if k is not None and k < n_ps:
                self._variables.setdefault(k, []).append(var)
                self._names[var.op.name] = k
        for k, variables in sorted(self._variables.items()):
            base = snapshot_folder(folder, output_dir, k)
            self._prefixes[k] = {s: os.path.join(base, s, "snapshot") for s in SLOTS}
            with v1.device(f"/job:ps/task:{k}"):
                # the op, not tf.shape: that folds a static shape into a constant
                self._shapes[k] = [_held_shape(v) for v in variables]
                self._savers[k] = v1.train.Saver(
                    var_list={v.op.name: v for v in variables},
                    sharded=False,
                    allow_empty=True,
                    name=f"snapshot_ps{k}",
                )
            # the fallback: this ps's share of the checkpoint (its names, its slices), read on the
            # chief as the chief's own saver reads it
            self._checkpoint_savers[k] = v1.train.Saver(
                var_list=_share_of(checkpoint_names, k),
                sharded=False,
                allow_empty=True,
                name=f"checkpoint_ps{k}",
            )

    @property
    def global_step(self) -> Any:
        return self._global_step

    @property
    def where(self) -> str:
        """The snapshots' folder, as every ps names it on its own host."""
        return os.path.dirname(snapshot_folder(self._folder, self._output_dir, 0))

    def last(self, k: int) -> Optional[Snapshot]:
        with self._lock:
            return self._last.get(k)

    def take(self, session: Any) -> tuple[int, float]:
        """Write one snapshot of every ps (one run: the ps write in parallel, each on its own
        host); returns the global step read in the same run and how long it took.

        Raises:
            tf.errors.OpError: a ps is unreachable or cannot write (the earlier snapshots stay).
        """
        slot = SLOTS[self._slot % len(SLOTS)]
        feeds, saves = {}, []
        for k, saver in self._savers.items():
            feeds[saver.saver_def.filename_tensor_name] = self._prefixes[k][slot]
            saves.append(saver.saver_def.save_tensor_name)
        began = time.monotonic()
        out = session.run(
            saves + [self._global_step],
            feeds,
            options=v1.RunOptions(timeout_in_ms=SAVE_TIMEOUT_MS),
        )
        step, now = int(out[-1]), time.time()
        with self._lock:
            for k in self._savers:
                self._last[k] = Snapshot(self._prefixes[k][slot], step, now)
            self._slot += 1
        return step, time.monotonic() - began

    def _wrong_shapes(self, session: Any, k: int) -> str:
        """The variables of ps ``k`` whose shape now differs from the graph's, as text."""
        variables = self._variables[k]
        now = session.run(self._shapes[k])
        return ", ".join(
            f"{v.op.name}: {[int(n) for n in got]} not {v.shape.as_list()}"
            for v, got in zip(variables, now, strict=True)
            if v.shape.is_fully_defined() and list(got) != v.shape.as_list()
        )

    def ps_of(self, uninitialized: list[Any]) -> list[int]:
        """The ps whose variables ``report_uninitialized_variables`` named (a restarted ps)."""
        names = {n.decode() if isinstance(n, bytes) else str(n) for n in uninitialized}
        return sorted({self._names[n] for n in names if n in self._names})

    def restore(
        self, session: Any, k: int, checkpoint: Optional[str], log: Callable[[str], None]
    ) -> str:
        """Bring ps ``k``'s variables back: from its last snapshot when that is at least as new
        as ``checkpoint``, else from ``checkpoint``, else from their initializers. Returns what
        was used, as said in the log."""
        snap = self.last(k)
        ckpt_step = _checkpoint_step(checkpoint)
        if snap is not None and (ckpt_step is None or snap.step >= ckpt_step):
            saver = self._savers[k]
            try:
                session.run(
                    saver.saver_def.restore_op_name,
                    {saver.saver_def.filename_tensor_name: snap.prefix},
                )
                # A resource variable takes the restored tensor's shape, whatever it was: a
                # snapshot of another shape is refused here, and the checkpoint used instead
                wrong = self._wrong_shapes(session, k)
                if wrong:
                    raise tf.errors.InvalidArgumentError(None, None, f"another shape: {wrong}")
                said = snap.describe()
                lost = ""
                seen = None if self.seen is None else max(self.seen, snap.step)
                if seen is not None:  # (the snapshot's own read of the step may be the newer)
                    lost = f": {seen - snap.step:,} steps lost (the chief saw step {seen:,})"
                log(f"ps/{k} restored from its {said}{lost}" + _behind(ckpt_step, "checkpoint"))
                self._recovered(k, "snapshot", snap.step, seen)
                return said
            except tf.errors.OpError as e:
                log(
                    f"ps/{k}: its snapshot cannot be read ({type(e).__name__}: {first_line(e)}); "
                    "using the checkpoint"
                )
        if checkpoint:
            saver = self._checkpoint_savers[k]
            session.run(
                saver.saver_def.restore_op_name,
                {saver.saver_def.filename_tensor_name: checkpoint},
            )
            said = f"checkpoint of step {ckpt_step:,}" if ckpt_step is not None else checkpoint
            log(f"ps/{k} restored from its {said}")
            self._recovered(k, "checkpoint", ckpt_step, self.seen)
            return said
        session.run(v1.variables_initializer(self._variables[k]))
        log(f"ps/{k} initialised (no snapshot, no checkpoint)")
        self._recovered(k, "initial values", 0, self.seen)
        return "initial values"

    def _recovered(self, k: int, source: str, step: Optional[int], seen: Optional[int]) -> None:
        lost = None if seen is None or step is None else max(0, seen - step)
        record = {"ps": k, "source": source, "step": step, "lost_steps": lost, "at": time.time()}
        self.recoveries.append(record)
        try:  # one write of one short line: appended whole (O_APPEND)
            with open(os.path.join(self._output_dir, RECOVERIES_FILE), "a") as out:
                out.write(json.dumps(record) + "\n")
        except OSError:
            pass  # the stream said it, and result.json will


def _held_shape(var: Any) -> Any:
    handle = getattr(var, "handle", None)
    if handle is not None and handle.dtype == tf.resource:
        return tf.raw_ops.VariableShape(input=handle, out_type=tf.int64)
    return tf.shape(var, out_type=tf.int64, optimize=False)  # a reference variable


def _behind(step: Optional[int], what: str) -> str:
    return f"; the last {what} was at step {step:,}" if step is not None else ""


def _checkpoint_step(checkpoint: Optional[str]) -> Optional[int]:
    if not checkpoint:
        return None
    tail = checkpoint.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _share_of(checkpoint_names: dict[str, Any], k: int) -> dict[str, Any]:
    """The checkpoint's names whose variables (or slices) live on ps ``k``."""
    share: dict[str, Any] = {}
    for name, value in checkpoint_names.items():
        if isinstance(value, (list, tuple)):
            parts = [v for v in value if _ps_index(v.device) == k]
            if parts:
                share[name] = parts
        elif _ps_index(value.device) == k:
            share[name] = value
    return share


class SnapshotHook(v1.train.SessionRunHook):  # type: ignore[name-defined]
    """The chief's: one snapshot of every ps every ``every_secs``, on a thread of its own (a step
    never waits for it); at most one in flight. A failure other than a lost ps (a full or
    read-only folder) is said once; restarts then fall back to the checkpoints."""

    def __init__(
        self, snapshots: PsSnapshots, every_secs: float, log: Callable[[str], None] = print
    ) -> None:
        self._snapshots = snapshots
        self._every = every_secs
        self._interval = every_secs
        self._log = log
        self._thread: Optional[threading.Thread] = None
        self._next = 0.0
        self._said: set[str] = set()
        self.taken = 0

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._next = time.monotonic() + self._interval

    def before_run(self, run_context: Any) -> Any:
        # the step every hooked run fetches anyway (StopAtStepHook): what a restore lost
        return v1.train.SessionRunArgs(self._snapshots.global_step)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._snapshots.seen = int(run_values.results)
        now = time.monotonic()
        if now < self._next or (self._thread is not None and self._thread.is_alive()):
            return
        self._next = now + self._interval
        self._thread = threading.Thread(
            target=self._take, args=(run_context.session,), name="ps-snapshots", daemon=True
        )
        self._thread.start()

    def _take(self, session: Any) -> None:
        try:
            step, secs = self._snapshots.take(session)
        except RuntimeError:  # "Attempted to use a closed Session": a recovery replaced it
            return
        except tf.errors.OpError as e:
            if isinstance(e, (tf.errors.UnavailableError, tf.errors.AbortedError)):
                return  # a ps went away: the restore will use the last complete snapshot
            if isinstance(e, tf.errors.CancelledError):
                return  # the session closed under it (the end, or a recovery)
            kind = type(e).__name__
            if kind not in self._said:
                self._said.add(kind)
                self._log(
                    f"snapshots: {kind}: {first_line(e)}; a restarted ps comes back from the "
                    "last checkpoint instead"
                )
            return
        self.taken += 1
        if self.taken == 1:
            self._log(
                f"snapshots: every {self._every:g}s, each ps into {self._snapshots.where} on its "
                f"own host; the first at step {step:,}"
            )
        self._interval = max(self._every, WIDEN_FACTOR * secs)
        if self._interval > 1.5 * self._every and "widened" not in self._said:
            self._said.add("widened")
            self._log(
                f"snapshots: one took {secs:.2f}s; taking one every {self._interval:.1f}s "
                f"instead of {self._every:g}s (lifecycle.snapshot_secs)"
            )

    def end(self, session: Any) -> None:
        if self._thread is not None:
            self._thread.join(timeout=SAVE_TIMEOUT_MS / 1000)
