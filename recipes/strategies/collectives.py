"""What ``allreduce`` adds around MultiWorkerMirroredStrategy's collectives, so that a model with
many embedding tables runs in bounded threads.

- :func:`join_slices`: MWMS all-reduces each ``IndexedSlices`` gradient (an embedding table's)
  by all-gathers of its own, several collectives per table; a model with 26 tables (examples/ctr)
  ran about a hundred collectives per step. The tables' slices of one row shape are joined into
  one (table k's rows offset by the rows of the tables before it) and split back after: a few
  collectives per step, whatever the number of tables.
- :class:`StepDeadline`: TF's own per-collective timeout (``CommunicationOptions.timeout_seconds``)
  starts a thread per collective that sleeps for the whole timeout (TF's collective executor:
  "TODO: Share the timeout watchdog thread among collectives"): at a hundred collectives a step
  and a 30 s timeout a worker reached 15,000 threads and died in ``std::system_error``
  (Resource temporarily unavailable). One thread here aborts the process's collectives when a
  step has not finished within the timeout: the same error, the same exit, one thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Optional

import tensorflow as tf

__all__ = ["StepDeadline", "join_slices"]


def join_slices(
    grads: Sequence[Any], variables: Sequence[Any]
) -> tuple[list[Any], Callable[[Sequence[Any]], list[Any]]]:
    """``grads`` (one per variable, dense or ``IndexedSlices``) as a list to all-reduce, with
    each group of two or more slices of the same row shape and dtype joined into one, and the
    function that takes the reduced list back to one gradient per variable."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, g in enumerate(grads):
        if isinstance(g, tf.IndexedSlices):
            key = (tuple(variables[i].shape[1:]), g.values.dtype)
            groups.setdefault(key, []).append(i)
    joined_members = [members for members in groups.values() if len(members) > 1]
    in_a_join = {i for members in joined_members for i in members}
    alone = [i for i in range(len(grads)) if i not in in_a_join]
    layouts: list[tuple[list[int], list[int], list[int], list[int]]] = []
    to_reduce = [grads[i] for i in alone]
    for members in joined_members:
        rows = [int(variables[i].shape[0]) for i in members]
        offsets = [sum(rows[:k]) for k in range(len(rows))]
        width = list(variables[members[0]].shape[1:])
        moved = zip(members, offsets, strict=True)
        indices = tf.concat([tf.cast(grads[i].indices, tf.int64) + off for i, off in moved], 0)
        values = tf.concat([grads[i].values for i in members], 0)
        shape = tf.constant([sum(rows), *width], tf.int64)
        to_reduce.append(tf.IndexedSlices(values, indices, dense_shape=shape))
        layouts.append((members, offsets, rows, width))

    def split(reduced: Sequence[Any]) -> list[Any]:
        out: list[Any] = [None] * len(grads)
        for i, g in zip(alone, reduced[: len(alone)], strict=True):
            out[i] = g
        for joined, layout in zip(reduced[len(alone) :], layouts, strict=True):
            members, offsets, rows, width = layout
            # which table each row belongs to: the number of tables starting at or before it, -1
            bounds = tf.constant(offsets[1:], tf.int64)
            part = tf.cast(tf.searchsorted(bounds, joined.indices, side="right"), tf.int32)
            values = tf.dynamic_partition(joined.values, part, len(members))
            indices = tf.dynamic_partition(joined.indices, part, len(members))
            for k, (i, off, n) in enumerate(zip(members, offsets, rows, strict=True)):
                shape = tf.constant([n, *width], tf.int64)
                out[i] = tf.IndexedSlices(values[k], indices[k] - off, dense_shape=shape)
        return out

    return to_reduce, split


class StepDeadline:
    """One thread that aborts this process's collectives (TensorFlow's
    ``abort_collective_ops``: every pending and later collective fails with
    ``DeadlineExceededError``) when a step armed by :meth:`step` has not finished within its
    seconds."""

    def __init__(self, secs: float, message: str) -> None:
        self.secs = secs
        self.message = message  # what the aborted collectives' error says
        self.fired = False
        self._cond = threading.Condition()
        self._deadline: Optional[float] = None
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="step-deadline", daemon=True)
        self._thread.start()

    @contextmanager
    def step(self, secs: Optional[float] = None) -> Iterator[None]:
        """Armed for the block (``secs``, or the deadline's own)."""
        with self._cond:
            self._deadline = time.monotonic() + (self.secs if secs is None else secs)
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._deadline = None
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(5)

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline, self.fired = None, True
                _abort_collectives(self.message)


def _abort_collectives(message: str) -> None:
    from tensorflow.python.eager import context

    context.context().abort_collective_ops(tf.errors.DEADLINE_EXCEEDED, message)
