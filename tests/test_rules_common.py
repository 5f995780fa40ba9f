"""Shared builders for the rule tests live in this module's fixtures and helpers.

Rules checked here (ALGORITHMS.md, infrastructure checks): global variables on /job:ps, local
variables and local optimizer slots on the worker and absent from GLOBAL_VARIABLES, local equals
global after a pull, the algorithm registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from recipe_cluster import InProcessCluster

from recipes.algorithms import available, get_algorithm
from recipes.algorithms.base import BuildContext, Problem, TrainGraph
from recipes.config import AlgoConf
from recipes.errors import ConfigError

v1 = tf.compat.v1
X_DIM = 3
W0 = np.array([0.5, -0.3, 0.2], np.float32)
B0 = np.float32(0.1)


@dataclass
class Replica:
    graph: Any
    sess: Any
    train: TrainGraph
    x: Any
    y: Any
    global_step: Any

    def run(self, i: int, bx: np.ndarray, by: np.ndarray) -> float:
        ops = self.train.step_ops
        _, loss = self.sess.run(
            [ops[i % len(ops)], self.train.loss],
            feed_dict={self.x: bx, self.y: by},
            options=v1.RunOptions(timeout_in_ms=20000),
        )
        return float(loss)

    def value(self, tensor: Any) -> Any:
        return self.sess.run(tensor)

    def params(self) -> dict[str, np.ndarray]:
        return {k: self.sess.run(v) for k, v in self.train.params.items()}


def linreg_problem(x: Any, y: Any) -> Problem:
    """Linear regression: loss = mean((x.w + b - y)^2), fixed non-zero initial weights."""

    def create(collections: Any) -> dict[str, Any]:
        with v1.variable_scope("model"):
            return {
                "w": v1.get_variable(
                    "w", initializer=tf.constant(W0), collections=collections, use_resource=True
                ),
                "b": v1.get_variable(
                    "b", initializer=tf.constant(B0), collections=collections, use_resource=True
                ),
            }

    def loss(p: dict[str, Any]) -> Any:
        pred = tf.reduce_sum(x * p["w"], axis=1) + p["b"]
        return tf.reduce_mean(tf.square(pred - y))

    return Problem(create_params=create, loss_fn=loss)


def toy_problem(collections_unused: Any = None) -> Problem:
    """[T]'s toy: a, b in R^2 from 0, loss = mean((a + b - 100)^2)."""

    def create(collections: Any) -> dict[str, Any]:
        with v1.variable_scope("model"):
            return {
                k: v1.get_variable(
                    k,
                    shape=[2],
                    initializer=v1.zeros_initializer(),
                    collections=collections,
                    use_resource=True,
                )
                for k in ("a", "b")
            }

    return Problem(
        create_params=create, loss_fn=lambda p: tf.reduce_mean(tf.square(p["a"] + p["b"] - 100.0))
    )


def build_replicas(
    cluster: InProcessCluster, algo: AlgoConf, n: int, toy: bool = False, init: bool = True
) -> list[Replica]:
    """One graph + session per worker; worker 0 is the chief and initialises the ps."""
    replicas = []
    for i in range(n):
        graph = tf.Graph()
        with graph.as_default():
            x = v1.placeholder(tf.float32, [None, X_DIM])
            y = v1.placeholder(tf.float32, [None])
            device = f"/job:worker/task:{i}"
            setter = v1.train.replica_device_setter(worker_device=device, cluster=cluster.spec)
            with v1.device(setter):
                gs = v1.train.get_or_create_global_step()
            ctx = BuildContext(
                algo=algo,
                n_replicas=n,
                replica_index=i,
                is_chief=(i == 0),
                worker_device=device,
                ps_device=setter,
                global_step=gs,
            )
            problem = toy_problem() if toy else linreg_problem(x, y)
            train = get_algorithm(algo.name).build(ctx, problem)
            global_init = v1.variables_initializer(v1.global_variables())
            local_init = train.local_init_op or v1.local_variables_initializer()
            for hook in train.hooks:
                hook.begin()
        sess = v1.Session(cluster.workers[i].target, graph=graph)
        rep = Replica(graph, sess, train, x, y, gs)
        if init:
            if i == 0:
                sess.run(global_init)
            sess.run(local_init)
        replicas.append(rep)
    return replicas


def sgd_step(
    w: np.ndarray, b: float, bx: np.ndarray, by: np.ndarray, lr: float
) -> tuple[np.ndarray, float]:
    """NumPy reference: one SGD step of the linear regression."""
    r = bx @ w + b - by
    return w - lr * 2.0 / len(by) * (bx.T @ r), b - lr * 2.0 / len(by) * r.sum()


def data_batches(n: int, size: int = 8, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.RandomState(seed)
    true_w = np.array([1.0, -2.0, 0.5], np.float32)
    out = []
    for _ in range(n):
        bx = rng.normal(size=(size, X_DIM)).astype(np.float32)
        out.append((bx, (bx @ true_w + 0.3).astype(np.float32)))
    return out


ALL_ALGORITHMS = [
    "adag",
    "agn",
    "downpour",
    "downpour_easy",
    "dynsgd",
    "eamsgd",
    "easgd",
    "hogwild",
    "multi_gpu",
    "sagn",
    "sync",
    "sync_lr",
]


def test_registry_lists_every_algorithm_and_rejects_unknown() -> None:
    assert available() == ALL_ALGORITHMS
    with pytest.raises(ConfigError, match="valid: adag, agn, downpour"):
        get_algorithm("downpour_hard")


@pytest.mark.parametrize(
    "name,extra",
    [("hogwild", {}), ("sync", {}), ("downpour", {"window": 2, "ps_optimizer": "adagrad"})],
)
def test_placement_globals_on_ps_locals_on_worker(name: str, extra: dict[str, Any]) -> None:
    cluster = InProcessCluster(n_workers=2)
    algo = AlgoConf(name=name, lr=0.1, optimizer="adam", extra=extra)
    reps = build_replicas(cluster, algo, 2, init=False)
    for i, rep in enumerate(reps):
        with rep.graph.as_default():
            globals_ = v1.global_variables()
            locals_ = v1.local_variables()
        assert globals_ and all(v.device.startswith("/job:ps") for v in globals_), [
            (v.name, v.device) for v in globals_
        ]
        assert all(v.device.startswith(f"/job:worker/task:{i}") for v in locals_), [
            (v.name, v.device) for v in locals_
        ]
        assert not {id(v) for v in locals_} & {id(v) for v in globals_}
        if name == "downpour":
            # the local copies and the local Adam slots (m, v) are per-worker state
            names = {v.op.name for v in locals_}
            assert "local/model/w" in names and any("model/w/Adam" in n for n in names), names
            assert all(not v.op.name.startswith("local/") for v in globals_)
        else:
            assert {v.op.name for v in rep.train.params.values()} == {"model/w", "model/b"}


def test_hogwild_second_worker_sees_first_workers_write() -> None:
    cluster = InProcessCluster(n_workers=2)
    r0, r1 = build_replicas(cluster, AlgoConf(name="hogwild", lr=0.1), 2)
    ((bx, by),) = data_batches(1)
    r0.run(0, bx, by)
    w_expected, _ = sgd_step(W0, float(B0), bx, by, 0.1)
    np.testing.assert_allclose(r1.params()["w"], w_expected, atol=1e-6)
    assert r1.value(r1.global_step) == 1
