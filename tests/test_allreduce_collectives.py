"""recipes/strategies/collectives.py: allreduce's tables' slices joined per row shape (so a
model with many tables all-gathers once a step, not once per table) and its step deadline (one
thread, where TensorFlow's per-collective timeout started a sleeping thread per collective: a
worker of the CTR example reached 15,000 threads and died)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

from recipes.strategies import collectives
from recipes.strategies.collectives import StepDeadline, join_slices


def _slices(rows: int, width: int, ids: list[int], seed: int) -> tf.IndexedSlices:
    values = np.random.RandomState(seed).normal(size=(len(ids), width)).astype(np.float32)
    return tf.IndexedSlices(
        tf.constant(values), tf.constant(ids, tf.int32), dense_shape=tf.constant([rows, width])
    )


def test_slices_of_one_row_shape_travel_as_one_and_come_back_to_their_tables() -> None:
    variables = [
        tf.Variable(tf.zeros([5, 4])),  # a dense layer's kernel
        tf.Variable(tf.zeros([10, 3])),  # three tables of width 3
        tf.Variable(tf.zeros([7, 3])),
        tf.Variable(tf.zeros([1, 3])),
        tf.Variable(tf.zeros([6, 2])),  # a table alone in its width
    ]
    grads = [
        tf.ones([5, 4]),
        _slices(10, 3, [9, 0, 9], 1),  # a repeated id, as a batch gives
        _slices(7, 3, [6], 2),
        _slices(1, 3, [0, 0], 3),
        _slices(6, 2, [5, 1], 4),
    ]
    to_reduce, split = join_slices(grads, variables)
    joined = [g for g in to_reduce if isinstance(g, tf.IndexedSlices) and g.values.shape[1] == 3]
    assert len(to_reduce) == 3 and len(joined) == 1  # dense, the width-2 table, one join
    assert joined[0].values.shape[0] == 6  # every row of the three tables
    # What an all-reduce (MEAN over two replicas) gives back: both replicas' rows, halved.
    reduced = [
        tf.IndexedSlices(
            tf.concat([g.values, g.values], 0) / 2,
            tf.concat([g.indices, g.indices], 0),
            g.dense_shape,
        )
        if isinstance(g, tf.IndexedSlices)
        else g
        for g in to_reduce
    ]
    back = split(reduced)
    assert len(back) == len(grads)
    np.testing.assert_array_equal(back[0], grads[0])
    for got, want, var in zip(back[1:], grads[1:], variables[1:], strict=True):
        assert isinstance(got, tf.IndexedSlices)
        dense_got = tf.math.unsorted_segment_sum(got.values, got.indices, var.shape[0])
        dense_want = tf.math.unsorted_segment_sum(want.values, want.indices, var.shape[0])
        np.testing.assert_allclose(dense_got, dense_want, rtol=1e-6)
        assert list(got.dense_shape.numpy()) == list(var.shape)


def test_the_deadline_aborts_a_step_that_outlives_it_and_spares_one_that_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    aborted = threading.Event()
    said: list[str] = []
    monkeypatch.setattr(
        collectives, "_abort_collectives", lambda m: (said.append(m), aborted.set())
    )
    threads_before = threading.active_count()
    deadline = StepDeadline(0.2, "no all-reduce finished within algo.collective_timeout_secs=0.2")
    try:
        assert threading.active_count() == threads_before + 1  # one thread, whatever the steps
        for _ in range(50):
            with deadline.step(secs=60):  # steps that end in time
                pass
        assert not deadline.fired
        with deadline.step():  # a step stuck in a collective
            assert aborted.wait(30), "the deadline never fired"
        assert deadline.fired and said == [
            "no all-reduce finished within algo.collective_timeout_secs=0.2"
        ]
        assert threading.active_count() == threads_before + 1
    finally:
        deadline.close()  # joins its thread
    assert threading.active_count() == threads_before
