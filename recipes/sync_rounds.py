"""The rounds of a synchronous optimizer, and a way to act between two of them.

TensorFlow's ``SyncReplicasOptimizer`` applies each round's aggregated gradient in a thread of
the chief's own (its chief queue runner runs ``sync_op``: take every accumulator's mean, apply
it, add one to the global step, hand out the next round's tokens). Nothing else changes the
shared variables. A snapshot of the parameter servers taken while ``sync_op`` runs may catch one
ps before a round's update and another after it; taken between two runs of ``sync_op`` it holds
exactly the rounds the global step counts. :class:`RoundGate` gives that moment: the chief's
queue runner runs each ``sync_op`` through it (:func:`gate_rounds` replaces the optimizer's
runner by one that does), and :meth:`RoundGate.between` waits for the round being applied to end
and holds the next one back until its block ends. The workers go on computing and pushing the
next round's gradients meanwhile; the round waits (the pause a synchronous job pays for its
snapshots, reported with them).

The same runner leaves the token queue open when the chief's session closes without its job
being done (a ps was lost and the session is recovered): TensorFlow's runner cancels the queue
whenever its coordinator stops, and a queue on a ps that lived on stays closed, so the recovered
session's first hand-out of tokens failed ("FIFOQueue 'sync_token_q' is closed") and the chief
with it. :meth:`RoundGate.hook`'s ``end`` (called only when training is done) lets it cancel the
queue then, as before: the workers waiting for a token are let go. It also ends the rounds
first (:meth:`RoundGate.finish`): it waits for the round being applied, and none is applied after
it, so the final checkpoint (the chief's checkpoint hook ends after it) holds exactly the rounds
its global step counts, as every snapshot does. It waits only where that round can still be
applied: with backup workers (fewer gradients aggregated than there are replicas), and only until
every other replica has ended (its done token in: no gradient can come any more). Without them
every round needs the chief's gradient too, and the chief's last run waited for its round's
token, so the round open when it stops is one that never comes (its runner is blocked taking
gradients, and waiting for it held every synchronous job's end for FINISH_WAIT_SECS).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional

import tensorflow as tf

__all__ = ["RoundGate", "gate_rounds"]

QueueRunner = tf.compat.v1.train.QueueRunner
FINISH_WAIT_SECS = 30.0  # for the round being applied as training ends
GONE_POLL_SECS = 0.05  # how often finish asks whether the other replicas have all ended


class RoundGate:
    """Between two rounds: see the module's docstring."""

    def __init__(self, backups: bool = False) -> None:
        # backup workers: a round can be applied without the chief's gradient
        self.backups = backups
        # (session) -> whether every other replica has ended (its done token in): then no
        # gradient is coming and the open round is never applied; set by the replica
        self.others_done: Optional[Callable[[Any], bool]] = None
        self._cond = threading.Condition()
        self._applying = False
        self._held = False
        self.done = False  # training done: the runner may cancel the token queue as it stops
        self._finished = False  # training done: no round is applied any more

    def hook(self) -> Any:
        """The chief's hook whose ``end`` (training done, not a recovery) says so."""
        return _TrainingDone(self)

    def finish(self, wait_secs: float, gone: Optional[Callable[[], bool]] = None) -> bool:
        """Training done: wait for the round being applied to end (at most ``wait_secs``, and
        no longer once ``gone()`` says no gradient can come for it), and apply none after it (the
        runner's next run ends it as a closed queue would); whether the round ended."""
        deadline = time.monotonic() + wait_secs
        with self._cond:
            self.done = True
            while True:
                left = deadline - time.monotonic()
                step = left if gone is None else min(left, GONE_POLL_SECS)
                ended = self._cond.wait_for(lambda: not self._applying, timeout=max(0.0, step))
                if ended or left <= 0:
                    break
                if gone is not None:
                    self._cond.release()  # (gone() runs a session: not under the lock)
                    try:
                        if gone():
                            break
                    finally:
                        self._cond.acquire()
            self._finished = True
            self._cond.notify_all()
        return ended

    def applying(self, run: Callable[[], Any]) -> Any:
        """``run`` (one ``sync_op``) once no block of :meth:`between` holds the rounds back;
        after :meth:`finish`, none: an ``OutOfRangeError``, which the queue runner takes for
        its queue closed (its thread ends quietly) and the coordinator for a clean stop. A round
        whose run the session's close cancels after :meth:`finish` ends the same way (a
        ``CancelledError`` is neither: it failed the chief, or raised in the runner's thread)."""
        with self._cond:
            while self._held and not self._finished:
                self._cond.wait()
            if self._finished:
                raise tf.errors.OutOfRangeError(None, None, "training done: no more rounds")
            self._applying = True
        try:
            return run()
        except tf.errors.CancelledError:
            if not self.done:
                raise  # a recovery's close: as TensorFlow's runner has it
            raise tf.errors.OutOfRangeError(
                None, None, "training done: its open round ended"
            ) from None
        finally:
            with self._cond:
                self._applying = False
                self._cond.notify_all()

    @contextmanager
    def between(self, wait_secs: float) -> Iterator[bool]:
        """Hold the rounds back for the block, once the round being applied has ended: True;
        False when it did not end within ``wait_secs`` (a round waiting for gradients that do
        not come: a replica gone); the block then runs without holding anything."""
        with self._cond:
            self._held = True
            clear = self._cond.wait_for(lambda: not self._applying, timeout=wait_secs)
            if not clear:
                self._held = False
                self._cond.notify_all()
        try:
            yield clear
        finally:
            if clear:
                with self._cond:
                    self._held = False
                    self._cond.notify_all()


class _GatedQueueRunner(QueueRunner):  # type: ignore[misc, valid-type]
    """A queue runner whose every run of its op goes through a :class:`RoundGate`."""

    def __init__(self, runner: Any, gate: RoundGate) -> None:
        super().__init__(
            queue=runner.queue,
            enqueue_ops=runner.enqueue_ops,
            close_op=runner.close_op,
            cancel_op=runner.cancel_op,
            queue_closed_exception_types=runner.queue_closed_exception_types,
        )
        self._gate = gate

    def create_threads(
        self, sess: Any, coord: Any = None, daemon: bool = False, start: bool = False
    ) -> list[Any]:
        # The session's close does not wait for the thread that applies the rounds: at the end
        # of training it is blocked taking gradients for a round that never comes (finish says
        # so), and the coordinator's join waited stop_grace_secs (5 s) for it at every
        # synchronous job's end. Closing the session ends its run (RoundGate.applying: the runner
        # ends quietly). Its errors still reach the coordinator (request_stop).
        joined = _JoinsOnlyTheCloser(coord) if coord is not None else None
        return list(super().create_threads(sess, joined, daemon, start))

    def _run(self, sess: Any, enqueue_op: Any, coord: Any = None) -> None:
        super()._run(_GatedSession(sess, self._gate), enqueue_op, coord)

    def _close_on_stop(self, sess: Any, cancel_op: Any, coord: Any) -> None:
        coord.wait_for_stop()
        if not self._gate.done:
            return  # a recovery: the ps that lived on keep their token queue for the next session
        try:
            sess.run(cancel_op)
        except Exception:  # noqa: BLE001, S110 - as TensorFlow's own runner: ignored
            pass


class _JoinsOnlyTheCloser:
    """``coord`` whose ``register_thread`` (what its ``join`` waits for) takes only the runner's
    close-on-stop thread, not the thread that runs the rounds."""

    def __init__(self, coord: Any) -> None:
        self._coord = coord

    def register_thread(self, thread: Any) -> None:
        if thread.name.endswith("close_on_stop"):
            self._coord.register_thread(thread)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._coord, name)


class _TrainingDone(tf.compat.v1.train.SessionRunHook):
    def __init__(self, gate: RoundGate) -> None:
        self._gate = gate

    def end(self, session: Any) -> None:
        gate = self._gate
        if not gate.backups:  # the open round needs the chief's gradient: it never comes
            gate.finish(0.0)
            return
        others_done = gate.others_done
        if others_done is None:
            gate.finish(FINISH_WAIT_SECS)
            return

        def gone() -> bool:
            try:
                return others_done(session)
            except tf.errors.OpError:  # a ps gone: nothing more is applied there
                return True

        gate.finish(FINISH_WAIT_SECS, gone)


class _GatedSession:
    """``sess`` whose callables run through the gate (what ``QueueRunner._run`` loops on); the
    same key as ``sess`` in the runner's count of runs per session."""

    def __init__(self, sess: Any, gate: RoundGate) -> None:
        self._sess = sess
        self._gate = gate

    def make_callable(self, fetches: Any, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        call = self._sess.make_callable(fetches, *args, **kwargs)
        return lambda *a: self._gate.applying(lambda: call(*a))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sess, name)

    def __hash__(self) -> int:
        return hash(self._sess)

    def __eq__(self, other: object) -> bool:
        return other is self._sess or other is self


def gate_rounds(optimizer: Any) -> RoundGate:
    """A gate for the rounds of ``optimizer`` (a ``SyncReplicasOptimizer`` whose
    ``apply_gradients`` has run): its chief queue runner is replaced by one that applies each
    round through the gate (``get_chief_queue_runner`` returns the private attribute; the
    chief's hook asks for it when its session begins)."""
    backups = optimizer._replicas_to_aggregate < optimizer._total_num_replicas
    gate = RoundGate(backups=backups)
    optimizer._chief_queue_runner = _GatedQueueRunner(optimizer.get_chief_queue_runner(), gate)
    return gate
