"""DOWNPOUR rules (ALGORITHMS.md): window re-evaluation, exact window, pull, SGD/Adagrad parity."""

from __future__ import annotations

import numpy as np
import pytest
from recipe_cluster import InProcessCluster
from test_rules_common import B0, W0, build_replicas, data_batches, sgd_step

from recipes.config import AlgoConf


def downpour(window: int, lr: float = 0.05, ps_optimizer: str = "sgd") -> AlgoConf:
    return AlgoConf(
        name="downpour",
        lr=lr,
        optimizer="sgd",
        extra={"window": window, "ps_optimizer": ps_optimizer},
    )


def test_window_reevaluates_the_forward_pass_each_local_step() -> None:
    """T=3, lr 0.1, a=b=0, target 100: gradients of a are -100, -80, -64 (not -100 x3)."""
    (rep,) = build_replicas(InProcessCluster(n_workers=1), downpour(3, lr=0.1), 1, toy=True)
    grad_sum = rep.train.extras.get("grad_sum") or None
    dummy_x, dummy_y = np.zeros((1, 3), np.float32), np.zeros(1, np.float32)
    losses, sums = [], []
    for i in range(2):
        losses.append(rep.run(i, dummy_x, dummy_y))
        sums.append(rep.sess.run(grad_sum["a"]))
    losses.append(rep.run(2, dummy_x, dummy_y))  # 3rd step: local step, push, pull
    assert losses == pytest.approx([10000.0, 6400.0, 4096.0])
    per_step = [sums[0][0], sums[1][0] - sums[0][0]]
    assert per_step == pytest.approx([-100.0, -80.0])
    # center = a after three local steps: 10 + 8 + 6.4 (the third gradient was -64)
    np.testing.assert_allclose(rep.params()["a"], [24.4, 24.4], rtol=1e-6)
    assert rep.value(rep.global_step) == 3


def test_window_is_exactly_t_batches_including_the_first_and_pull_matches_center() -> None:
    (rep,) = build_replicas(InProcessCluster(n_workers=1), downpour(3), 1)
    batches = data_batches(6)
    for i in range(2):
        rep.run(i, *batches[i])
        np.testing.assert_array_equal(rep.params()["w"], W0)  # nothing pushed yet
        assert rep.value(rep.global_step) == 0
    rep.run(2, *batches[2])
    assert not np.allclose(rep.params()["w"], W0)
    assert rep.value(rep.global_step) == 3
    local = rep.train.train_params
    np.testing.assert_allclose(rep.sess.run(local["w"]), rep.params()["w"], atol=1e-7)
    np.testing.assert_allclose(rep.sess.run(local["b"]), rep.params()["b"], atol=1e-7)


@pytest.mark.parametrize("window", [1, 2, 3])
def test_one_worker_any_window_equals_plain_sgd(window: int) -> None:
    (rep,) = build_replicas(InProcessCluster(n_workers=1), downpour(window), 1)
    w, b = W0.astype(np.float64), float(B0)
    k = 2
    for i, (bx, by) in enumerate(data_batches(k * window, seed=2)):
        rep.run(i, bx, by)
        w, b = sgd_step(w, b, bx, by, 0.05)
    np.testing.assert_allclose(rep.params()["w"], w, atol=1e-6)
    np.testing.assert_allclose(rep.params()["b"], b, atol=1e-6)
    assert rep.value(rep.global_step) == k * window


def test_adagrad_ps_with_one_worker_and_window_one_matches_reference_adagrad() -> None:
    lr = 0.1
    (rep,) = build_replicas(InProcessCluster(n_workers=1), downpour(1, lr, "adagrad"), 1)
    w, b = W0.astype(np.float64), float(B0)
    acc_w, acc_b = np.full(3, 0.1), 0.1  # TF's initial_accumulator_value
    for i, (bx, by) in enumerate(data_batches(5, seed=3)):
        rep.run(i, bx, by)
        r = bx @ w + b - by
        gw, gb = 2.0 / len(by) * (bx.T @ r), 2.0 / len(by) * r.sum()
        acc_w, acc_b = acc_w + gw**2, acc_b + gb**2
        w, b = w - lr * gw / np.sqrt(acc_w), b - lr * gb / np.sqrt(acc_b)
    np.testing.assert_allclose(rep.params()["w"], w, atol=1e-6)
    np.testing.assert_allclose(rep.params()["b"], b, atol=1e-6)
