"""The windowed algorithms and embedding tables (issue 34, item 3): no worker holds a copy of a
table, nor pulls or pushes one whole per window. The copy and the window hold the dense
parameters; the forward passes read the batch's rows on the ps, and every run applies the rows'
gradients there with ``algo.optimizer`` (hogwild's rule; recipes/algorithms/local.py).

Checked for every windowed algorithm on a model of one table (bags of two ids) and a dense
weight: no variable of the table's shape on the worker, rows no batch touched bit-equal to
their start after whole windows, the touched ones moved. DOWNPOUR (one worker, SGD) against
NumPy: the table after every run and the dense weight at each push; EAMSGD (its rows take its
Nesterov momentum, not ``algo.optimizer``, which it has none of) likewise. And ``multi_gpu``, whose
towers each gather their rows (no whole read of the table runs) and whose joined row gradients
make SGD on the whole minibatch, against NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from recipe_cluster import InProcessCluster
from test_rules_common import Replica
from test_rules_multi_gpu import cluster_with_cpus

from recipes.algorithms import get_algorithm
from recipes.algorithms.base import BuildContext, Problem
from recipes.config import AlgoConf

v1 = tf.compat.v1
ROWS, WIDTH = 9, 3
TABLE0 = np.random.RandomState(1).normal(size=(ROWS, WIDTH)).astype(np.float32)
W0 = np.array([0.4, -0.2, 0.3], np.float32)
TOUCHED = [1, 2, 4, 7]
# bags of two ids per example; rows 0, 3, 5, 6 and 8 are never asked for
BATCHES = [
    (np.array([[1, 4], [2, 2]]), np.array([1.0, -0.5], np.float32)),
    (np.array([[7, 1]]), np.array([0.7], np.float32)),
    (np.array([[4, 2], [1, 7], [2, 4]]), np.array([0.2, 0.9, -0.3], np.float32)),
]
WINDOWED = {
    "downpour": {"window": 3},
    "downpour_easy": {"window": 3},
    "agn": {"window": 3},
    "adag": {"window": 3},
    "dynsgd": {"window": 3},
    "easgd": {"window": 3},
    "eamsgd": {"window": 3},
    "sagn": {"window": 3, "run_timeout_secs": 20, "stop_grace_secs": 1},
}


def numpy_step(
    table: np.ndarray, w: np.ndarray, ids: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The gradients of :func:`table_problem`'s loss for the table (dense) and ``w``."""
    rows = table[ids]  # [batch, 2, width]
    factor = 2.0 / len(y) * ((rows * w).sum(axis=(1, 2)) - y)  # d loss / d pred, per example
    grad_w = (factor[:, None, None] * rows).sum(axis=(0, 1))
    grad_table = np.zeros_like(table)
    for example, bag in enumerate(ids):
        for row in bag:
            grad_table[row] += factor[example] * w
    return grad_table, grad_w


def table_problem(ids: Any, y: Any) -> Problem:
    """pred = sum over the bag of (row . w); loss = mean((pred - y)^2). ``emb`` is read by
    ``tf.gather`` (rows, an ``IndexedSlices`` gradient), as recipes/sparse_lookup.py reads."""

    def create(collections: Any, skip: Any = ()) -> dict[str, Any]:
        made = {}
        with v1.variable_scope("model"):
            for key, value in (("emb", TABLE0), ("w", W0)):
                if key not in skip:
                    made[key] = v1.get_variable(
                        key,
                        initializer=tf.constant(value),
                        collections=collections,
                        use_resource=True,
                    )
        return made

    def loss_on(p: dict[str, Any], bids: Any, by: Any) -> Any:
        rows = tf.gather(p["emb"], bids)  # [batch, 2, width]
        pred = tf.reduce_sum(rows * p["w"], axis=[1, 2])
        return tf.reduce_mean(tf.square(pred - by))

    return Problem(
        create_params=create,
        loss_fn=lambda p: loss_on(p, ids, y),
        inputs=(ids, y),
        loss_on=loss_on,
        table_keys=lambda: frozenset({"emb"}),
    )


def build(name: str, lr: float = 0.1, cluster: Any = None, extra: Any = None) -> Replica:
    cluster = cluster or InProcessCluster(n_workers=1)
    extra = WINDOWED[name] if extra is None else extra
    algo = AlgoConf(name=name, lr=lr, optimizer="sgd", sync=name == "sagn", extra=extra)
    graph = tf.Graph()
    with graph.as_default():
        ids = v1.placeholder(tf.int64, [None, 2])
        y = v1.placeholder(tf.float32, [None])
        device = "/job:worker/task:0"
        setter = v1.train.replica_device_setter(worker_device=device, cluster=cluster.spec)
        with v1.device(setter):
            gs = v1.train.get_or_create_global_step()
        ctx = BuildContext(
            algo=algo,
            n_replicas=1,
            replica_index=0,
            is_chief=True,
            worker_device=device,
            ps_device=setter,
            global_step=gs,
        )
        train = get_algorithm(name).build(ctx, table_problem(ids, y))
        global_init = v1.variables_initializer(v1.global_variables())
        local_init = train.local_init_op or v1.local_variables_initializer()
        for hook in train.hooks:
            hook.begin()
        worker_shapes = [tuple(v.shape) for v in v1.local_variables()]
    sess = v1.Session(cluster.workers[0].target, graph=graph)
    sess.run(global_init)
    sess.run(local_init)
    coord = tf.train.Coordinator()
    for hook in train.hooks:
        hook.after_create_session(sess, coord)  # sagn: its sync tokens
    rep = Replica(graph, sess, train, ids, y, gs)
    rep.worker_shapes = worker_shapes  # type: ignore[attr-defined]
    return rep


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_no_worker_copies_a_table_and_only_the_batches_rows_move(name: str) -> None:
    rep = build(name)
    assert (ROWS, WIDTH) not in rep.worker_shapes, rep.worker_shapes  # type: ignore[attr-defined]
    assert set(rep.train.train_params) == {"emb", "w"}  # the forward pass sees the table
    for i in range(6):  # two whole windows
        rep.run(i, *BATCHES[i % len(BATCHES)])
    table = rep.params()["emb"]
    untouched = [r for r in range(ROWS) if r not in TOUCHED]
    np.testing.assert_array_equal(table[untouched], TABLE0[untouched])
    assert all(not np.allclose(table[r], TABLE0[r]) for r in TOUCHED), table
    assert not np.allclose(rep.params()["w"], W0)  # the dense part trained through its window


def test_downpour_tables_take_every_runs_rows_and_the_dense_part_its_window() -> None:
    lr, window = 0.1, 3
    rep = build("downpour", lr)
    table, local_w, center_w = TABLE0.astype(np.float64), W0.astype(np.float64), W0.copy()
    for i in range(2 * window):
        ids, y = BATCHES[i % len(BATCHES)]
        rep.run(i, ids, y)
        grad_table, grad_w = numpy_step(table, local_w, ids, y)
        table -= lr * grad_table  # on the ps, at every run
        local_w -= lr * grad_w  # on the worker's copy
        np.testing.assert_allclose(rep.params()["emb"], table, rtol=1e-5, atol=1e-6)
        if (i + 1) % window:
            np.testing.assert_array_equal(rep.params()["w"], center_w)  # nothing pushed yet
        else:  # one worker: the push is the window's delta, the center its copy
            np.testing.assert_allclose(rep.params()["w"], local_w, rtol=1e-5, atol=1e-6)
            center_w = rep.params()["w"]
    assert rep.value(rep.global_step) == 2 * window


def test_eamsgd_tables_take_its_nesterov_momentum_and_the_dense_part_its_elastic_window() -> None:
    """EAMSGD's tables: TensorFlow's Nesterov momentum with the algorithm's delta on the rows
    at every run (accum = delta accum + g; row -= lr g + lr delta accum; a row no batch reads
    keeps its velocity unused), the gradient taken in the same forward pass as the dense
    part's, at the copy's look-ahead point x + delta v. One worker: alpha = 0.9."""
    lr, delta, alpha, window = 0.05, 0.9, 0.9, 3
    rep = build("eamsgd", lr)
    table, accum = TABLE0.astype(np.float64), np.zeros((ROWS, WIDTH))
    x, v, center = W0.astype(np.float64), np.zeros(3), W0.astype(np.float64)
    for i in range(2 * window):
        ids, y = BATCHES[i % len(BATCHES)]
        rep.run(i, ids, y)
        grad_table, grad_w = numpy_step(table, x + delta * v, ids, y)
        rows = sorted(set(ids.ravel()))
        accum[rows] = delta * accum[rows] + grad_table[rows]
        table[rows] -= lr * grad_table[rows] + lr * delta * accum[rows]
        v = delta * v - lr * grad_w
        if (i + 1) % window:
            x = x + v
        else:  # the elastic exchange, from the weights before the step
            e = alpha * (x - center)
            x, center = x + v - e, center + e
        # float32 in the graph, float64 here, momentum carrying each run's rounding on
        np.testing.assert_allclose(rep.params()["emb"], table, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(rep.params()["w"], center, rtol=1e-4, atol=1e-5)


def test_multi_gpu_towers_gather_their_rows_and_the_step_is_sgd_on_the_whole_batch() -> None:
    """Two towers on two logical CPUs of one worker: neither reads the table whole (the table
    is gathered by rows on the ps), the joined row gradients are the whole minibatch's."""
    lr = 0.1
    rep = build("multi_gpu", lr, cluster_with_cpus(1, 2), {"towers": 2, "device": "cpu"})
    reading = {
        op.name
        for op in rep.graph.get_operations()
        if op.type == "ReadVariableOp" and op.inputs[0].op.name == "model/emb"
    }
    table, w = TABLE0.astype(np.float64), W0.astype(np.float64)
    for i in range(3):
        ids, y = BATCHES[i]
        meta = v1.RunMetadata()
        rep.sess.run(
            rep.train.step_ops[0],
            feed_dict={rep.x: ids, rep.y: y},
            options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE),
            run_metadata=meta,
        )
        ran = {n.node_name for d in meta.step_stats.dev_stats for n in d.node_stats}
        assert not ran & reading, ran & reading  # no whole read of the table ran
        assert any("ResourceGather" in n or "Gather" in n for n in ran), sorted(ran)
        grad_table, grad_w = numpy_step(table, w, ids, y)
        table, w = table - lr * grad_table, w - lr * grad_w
        np.testing.assert_allclose(rep.params()["emb"], table, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rep.params()["w"], w, rtol=1e-5, atol=1e-6)
    untouched = [r for r in range(ROWS) if r not in TOUCHED]
    np.testing.assert_array_equal(rep.params()["emb"][untouched], TABLE0[untouched])
