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
queue then, as before: the workers waiting for a token are let go.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import tensorflow as tf

__all__ = ["RoundGate", "gate_rounds"]

QueueRunner = tf.compat.v1.train.QueueRunner


class RoundGate:
    """Between two rounds: see the module's docstring."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._applying = False
        self._held = False
        self.done = False  # training done: the runner may cancel the token queue as it stops

    def hook(self) -> Any:
        """The chief's hook whose ``end`` (training done, not a recovery) says so."""
        return _TrainingDone(self)

    def applying(self, run: Callable[[], Any]) -> Any:
        """``run`` (one ``sync_op``) once no block of :meth:`between` holds the rounds back."""
        with self._cond:
            while self._held:
                self._cond.wait()
            self._applying = True
        try:
            return run()
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


class _TrainingDone(tf.compat.v1.train.SessionRunHook):
    def __init__(self, gate: RoundGate) -> None:
        self._gate = gate

    def end(self, session: Any) -> None:
        self._gate.done = True


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
    gate = RoundGate()
    optimizer._chief_queue_runner = _GatedQueueRunner(optimizer.get_chief_queue_runner(), gate)
    return gate
