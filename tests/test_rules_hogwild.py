"""Hogwild rules (ALGORITHMS.md): 1 worker = plain SGD; 2 workers round-robin = sequential SGD."""

from __future__ import annotations

import numpy as np
from recipe_cluster import InProcessCluster
from test_rules_common import B0, W0, build_replicas, data_batches, sgd_step

from recipes.config import AlgoConf

LR = 0.05


def test_one_worker_equals_plain_sgd() -> None:
    (rep,) = build_replicas(InProcessCluster(n_workers=1), AlgoConf(name="hogwild", lr=LR), 1)
    w, b = W0.astype(np.float64), float(B0)
    for i, (bx, by) in enumerate(data_batches(10)):
        rep.run(i, bx, by)
        w, b = sgd_step(w, b, bx, by, LR)
    got = rep.params()
    np.testing.assert_allclose(got["w"], w, atol=1e-6)
    np.testing.assert_allclose(got["b"], b, atol=1e-6)
    assert rep.value(rep.global_step) == 10


def test_two_workers_round_robin_equal_sequential_sgd() -> None:
    reps = build_replicas(InProcessCluster(n_workers=2), AlgoConf(name="hogwild", lr=LR), 2)
    w, b = W0.astype(np.float64), float(B0)
    for i, (bx, by) in enumerate(data_batches(10, seed=1)):
        reps[i % 2].run(i // 2, bx, by)  # worker i%2 takes batch i: interleaved
        w, b = sgd_step(w, b, bx, by, LR)
    for rep in reps:
        np.testing.assert_allclose(rep.params()["w"], w, atol=1e-6)
        np.testing.assert_allclose(rep.params()["b"], b, atol=1e-6)
    assert reps[1].value(reps[1].global_step) == 10
