"""Sparse optimizer rules: an embedding table's update changes only the batch's rows and their
slots, in the TF1 algorithms' optimizers (recipes/algorithms/base.py ``make_optimizer``, Adam the
lazy one of recipes/algorithms/lazy_adam.py) and in the TF2 strategies' (recipes/strategies/
optimizer.py, ``pss``), each against the same rule written in NumPy.

Two steps of gradients with a repeated id (summed first) and rows no step touches: those rows and
their slots must stay as they were (a dense rule would decay or move them, so the test can fail),
and the touched ones must follow the rule to float32 precision. Stock tf.compat.v1 Adam is checked
to move untouched rows, so that the lazy one is known to differ from it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from recipes.algorithms.base import make_optimizer
from recipes.strategies.optimizer import Optimizer

OPTIMIZERS = ["sgd", "momentum", "adagrad", "adam"]
LR = 0.1
ROWS, WIDTH = 7, 3
UNTOUCHED = [0, 3, 5, 6]
# (ids, one gradient row per id): row 1 twice in the first step
STEPS = [
    (np.array([1, 4, 1]), np.array([[1.0, -2.0, 0.5], [0.3, 0.3, -1.0], [0.5, 1.0, 1.5]])),
    (np.array([2, 4]), np.array([[-1.0, 0.25, 2.0], [2.0, -0.5, 0.1]])),
]
START = np.random.RandomState(0).normal(size=(ROWS, WIDTH)).astype(np.float32)


def numpy_rule(name: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The sparse rule, row by row: the table and the slots after :data:`STEPS`."""
    w = START.astype(np.float64)
    slots = {
        "momentum": np.zeros_like(w),
        "accumulator": np.full_like(w, 0.1),
        "m": np.zeros_like(w),
        "v": np.zeros_like(w),
    }
    for t, (ids, values) in enumerate(STEPS, start=1):
        for row in sorted(set(ids.tolist())):
            g = values[ids == row].sum(axis=0)
            if name == "sgd":
                w[row] -= LR * g
            elif name == "momentum":
                slots["momentum"][row] = 0.9 * slots["momentum"][row] + g
                w[row] -= LR * slots["momentum"][row]
            elif name == "adagrad":
                slots["accumulator"][row] += g * g
                w[row] -= LR * g / np.sqrt(slots["accumulator"][row])
            else:
                slots["m"][row] = 0.9 * slots["m"][row] + 0.1 * g
                slots["v"][row] = 0.999 * slots["v"][row] + 0.001 * g * g
                lr_t = LR * np.sqrt(1 - 0.999**t) / (1 - 0.9**t)
                w[row] -= lr_t * slots["m"][row] / (np.sqrt(slots["v"][row]) + 1e-8)
    return w, slots


def slices(ids: np.ndarray, values: np.ndarray) -> tf.IndexedSlices:
    return tf.IndexedSlices(
        tf.constant(values, tf.float32), tf.constant(ids, tf.int64), tf.constant([ROWS, WIDTH])
    )


def tf1_run(name: str, optimizer: Any = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The TF1 algorithms' optimizer on a resource variable, in a graph and a session."""
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        var = tf.Variable(START, name="table")
        opt = optimizer or make_optimizer(name, LR)
        step = v1.train.get_or_create_global_step()
        ops = [opt.apply_gradients([(slices(*s), var)], global_step=step) for s in STEPS]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for op in ops:
                sess.run(op)
            slots = {s: sess.run(opt.get_slot(var, s)) for s in opt.get_slot_names()}
            return sess.run(var), slots


def tf2_run(name: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The TF2 strategies' optimizer on eager variables, as ``pss`` calls it."""
    params = {"table": tf.Variable(START)}
    opt = Optimizer(name, LR)
    slots = opt.create_slots(params)
    for t, s in enumerate(STEPS):
        opt.apply(params, {"table": slices(*s)}, slots, tf.constant(t, tf.int64))
    named = {key.split("/")[0]: v.numpy() for key, v in slots.items()}
    return params["table"].numpy(), named


TF1_SLOT = {"momentum": "momentum", "adagrad": "accumulator", "adam_m": "m", "adam_v": "v"}


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("run", [tf1_run, tf2_run], ids=["tf1-algorithms", "tf2-pss"])
def test_a_sparse_update_changes_only_the_batchs_rows_and_their_slots(name: str, run: Any) -> None:
    table, slots = run(name)
    want_table, want_slots = numpy_rule(name)
    np.testing.assert_allclose(table, want_table, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(table[UNTOUCHED], START[UNTOUCHED])
    assert not np.allclose(table[[1, 2, 4]], START[[1, 2, 4]])
    for slot, value in slots.items():
        np.testing.assert_allclose(value, want_slots[slot], rtol=1e-5, atol=1e-7, err_msg=slot)
        initial = numpy_rule("sgd")[1][slot].astype(np.float32)
        np.testing.assert_array_equal(value[UNTOUCHED], initial[UNTOUCHED], err_msg=slot)
    expected_slots = {"sgd": set(), "momentum": {"momentum"}, "adagrad": {"accumulator"}}
    assert set(slots) == expected_slots.get(name, {"m", "v"})


def test_stock_tf1_adam_moves_rows_no_batch_touched() -> None:
    """Why the lazy Adam: tf.compat.v1's own decays every row's slots at every step and moves a
    row on its momentum after its batch: row 1, in the first step only, moves again in the
    second; the lazy one leaves it (and its slots) as the first step left them."""
    stock, stock_slots = tf1_run("adam", tf.compat.v1.train.AdamOptimizer(LR))
    lazy, lazy_slots = tf1_run("adam")
    np.testing.assert_allclose(stock_slots["m"][1], 0.9 * lazy_slots["m"][1], rtol=1e-6)
    assert not np.allclose(stock[1], lazy[1])
