"""Elastic averaging rules (ALGORITHMS.md sections 5-6): asynchronous EASGD and EAMSGD.

NumPy references of the documented rule: every T-th run of a replica, E = alpha (x - center)
from the weights before that run's local step; x <- step(x) - E; center += E. EAMSGD's local step
is explicit Nesterov, v <- delta v - lr g(x + delta v), x <- x + v. dist-keras' look-ahead sign
bug is built here (``lookahead_sign = -1``) and must miss the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from recipe_cluster import InProcessCluster
from test_rules_agn import build_with, local_values
from test_rules_common import B0, W0, Replica, build_replicas, data_batches, linreg_problem

from recipes.algorithms.eamsgd import EAMSGD
from recipes.config import AlgoConf
from recipes.errors import ConfigError

v1 = tf.compat.v1
LR = 0.05


def grad(w: np.ndarray, b: float, bx: np.ndarray, by: np.ndarray) -> tuple[np.ndarray, float]:
    r = bx @ w + b - by
    return 2.0 / len(by) * (bx.T @ r), 2.0 / len(by) * r.sum()


def elastic(name: str, window: int, alpha: float, lr: float = LR, **extra: Any) -> AlgoConf:
    return AlgoConf(
        name=name, lr=lr, optimizer="sgd", extra={"window": window, "alpha": alpha, **extra}
    )


class Reference:
    """The NumPy rule: replicas' (w, b, vw, vb), the center and each replica's run counter."""

    def __init__(
        self, n: int, window: int, alpha: float, lr: float = LR, momentum: float = 0.0
    ) -> None:
        self.x = [[W0.astype(np.float64), float(B0), np.zeros(3), 0.0] for _ in range(n)]
        self.c = [W0.astype(np.float64), float(B0)]
        self.t = [0] * n
        self.window, self.alpha, self.lr, self.delta = window, alpha, lr, momentum

    def run(self, i: int, bx: np.ndarray, by: np.ndarray) -> None:
        w, b, vw, vb = self.x[i]
        gw, gb = grad(w + self.delta * vw, b + self.delta * vb, bx, by)
        vw, vb = self.delta * vw - self.lr * gw, self.delta * vb - self.lr * gb
        new_w, new_b = w + vw, b + vb
        if self.t[i] % self.window == self.window - 1:
            ew, eb = self.alpha * (w - self.c[0]), self.alpha * (b - self.c[1])
            new_w, new_b = new_w - ew, new_b - eb
            self.c = [self.c[0] + ew, self.c[1] + eb]
        self.x[i] = [new_w, new_b, vw, vb]
        self.t[i] += 1


def run_round_robin(reps: list[Replica], ref: Reference, n_batches: int, seed: int) -> None:
    for j, (bx, by) in enumerate(data_batches(n_batches, seed=seed)):
        i = j % len(reps)
        reps[i].run(j // len(reps), bx, by)
        ref.run(i, bx, by)


def assert_matches(reps: list[Replica], ref: Reference, atol: float = 1e-6) -> None:
    np.testing.assert_allclose(reps[0].params()["w"], ref.c[0], atol=atol)
    np.testing.assert_allclose(reps[0].params()["b"], ref.c[1], atol=atol)
    for rep, x in zip(reps, ref.x, strict=True):
        np.testing.assert_allclose(local_values(rep)["w"], x[0], atol=atol)
        np.testing.assert_allclose(local_values(rep)["b"], x[1], atol=atol)


@pytest.mark.parametrize("name", ["easgd", "eamsgd"])
def test_two_workers_round_robin_follow_the_reference(name: str) -> None:
    momentum = 0.9 if name == "eamsgd" else 0.0
    conf = elastic(name, window=2, alpha=0.3, momentum=momentum)
    reps = build_replicas(InProcessCluster(n_workers=2), conf, 2)
    ref = Reference(2, window=2, alpha=0.3, momentum=momentum)
    run_round_robin(reps, ref, 12, seed=21)
    assert_matches(reps, ref)
    assert reps[0].value(reps[0].global_step) == 12  # +T per exchange


def test_easgd_alpha_zero_leaves_the_center_and_the_workers_independent_sgd() -> None:
    reps = build_replicas(InProcessCluster(n_workers=2), elastic("easgd", 2, alpha=0.0), 2)
    ref = Reference(2, window=2, alpha=0.0)
    run_round_robin(reps, ref, 8, seed=22)
    np.testing.assert_array_equal(reps[0].params()["w"], W0)
    assert_matches(reps, ref)
    assert not np.allclose(local_values(reps[0])["w"], local_values(reps[1])["w"])


def set_local(rep: Replica, w: np.ndarray) -> None:
    with rep.graph.as_default():
        rep.sess.run(rep.train.train_params["w"].assign(w.astype(np.float32)))


@pytest.mark.parametrize("alpha", [0.1, 0.25, 0.5])
def test_easgd_exchange_conserves_x_plus_center_and_shrinks_the_gap(alpha: float) -> None:
    """lr = 0, one worker: each exchange keeps x + center and multiplies the gap by 1 - 2 alpha
    (alpha = 0.5 meets at the midpoint); the copy is never overwritten by the center."""
    (rep,) = build_replicas(
        InProcessCluster(n_workers=1), elastic("easgd", 1, alpha=alpha, lr=0.0), 1
    )
    set_local(rep, W0 + np.array([1.0, -2.0, 0.5]))
    bx, by = data_batches(1, seed=23)[0]
    for i in range(3):
        x, c = local_values(rep)["w"], rep.params()["w"]
        rep.run(i, bx, by)
        x2, c2 = local_values(rep)["w"], rep.params()["w"]
        np.testing.assert_allclose(x2 + c2, x + c, atol=1e-6)
        np.testing.assert_allclose(x2 - c2, (1 - 2 * alpha) * (x - c), atol=1e-6)
        if alpha < 0.5:
            assert not np.allclose(x2, c2)  # no pull: x keeps its own value
    if alpha == 0.5:
        np.testing.assert_allclose(local_values(rep)["w"], W0 + [0.5, -1.0, 0.25], atol=1e-6)


def test_eamsgd_momentum_zero_reproduces_easgd() -> None:
    params = []
    for name in ("easgd", "eamsgd"):
        conf = elastic(name, window=3, alpha=0.2, momentum=0.0)
        reps = build_replicas(InProcessCluster(n_workers=2), conf, 2)
        run_round_robin(reps, Reference(2, 3, 0.2), 12, seed=24)
        params.append((reps[0].params(), [local_values(r) for r in reps]))
    for k in ("w", "b"):
        np.testing.assert_allclose(params[0][0][k], params[1][0][k], atol=1e-7)
        for a, b in zip(params[0][1], params[1][1], strict=True):
            np.testing.assert_allclose(a[k], b[k], atol=1e-7)


class DistKerasEAMSGD(EAMSGD):
    """dist-keras' sign: the gradient is taken at x - delta v."""

    lookahead_sign = -1.0


@pytest.mark.parametrize("seed_bug", [False, True])
def test_eamsgd_alpha_zero_is_nesterov_and_catches_the_lookahead_sign(seed_bug: bool) -> None:
    conf = elastic("eamsgd", window=2, alpha=0.0, momentum=0.9)
    (rep,) = build_with(
        InProcessCluster(n_workers=1),
        conf,
        1,
        linreg_problem,
        build=DistKerasEAMSGD() if seed_bug else None,
    )
    w, b, vw, vb = W0.astype(np.float64), float(B0), np.zeros(3), 0.0
    for i, (bx, by) in enumerate(data_batches(10, seed=25)):
        rep.run(i, bx, by)
        gw, gb = grad(w + 0.9 * vw, b + 0.9 * vb, bx, by)  # Nesterov: v <- dv - lr g(x + dv)
        vw, vb = 0.9 * vw - LR * gw, 0.9 * vb - LR * gb
        w, b = w + vw, b + vb
    got = local_values(rep)
    if seed_bug:
        assert np.abs(got["w"] - w).max() > 1e-3
    else:
        np.testing.assert_allclose(got["w"], w, atol=1e-6)
        np.testing.assert_allclose(got["b"], b, atol=1e-6)
        np.testing.assert_array_equal(rep.params()["w"], W0)  # alpha = 0: center untouched


def test_elastic_alpha_defaults_to_beta_over_n_and_rejects_out_of_range() -> None:
    reps = build_replicas(
        InProcessCluster(n_workers=2),
        AlgoConf(name="easgd", lr=LR, extra={"window": 2}),
        2,
        init=False,
    )
    assert reps[0].train.extras["alpha"] == pytest.approx(0.45)
    with pytest.raises(ConfigError, match="alpha must be in"):
        build_replicas(
            InProcessCluster(n_workers=1), elastic("eamsgd", 2, alpha=1.5), 1, init=False
        )
