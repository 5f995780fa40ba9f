"""Synchronous variants (ALGORITHMS.md sections 7-8): SAGN and SSGD with per-worker rates.

As in test_rules_sync: the chief's hook enqueues the initial tokens and starts the queue runner
that aggregates in the background; the test steps workers from one thread with deadlines.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from recipe_cluster import InProcessCluster
from test_rules_common import B0, W0, X_DIM, Replica, build_replicas, data_batches, sgd_step
from test_rules_sync import stop, wait_step

from recipes.config import AlgoConf
from recipes.errors import ConfigError

v1 = tf.compat.v1
LR = 0.1
SYNC = {"run_timeout_secs": 20, "stop_grace_secs": 1}


def start(conf: AlgoConf, n: int, toy: bool = False) -> tuple[list[Replica], Any]:
    reps = build_replicas(InProcessCluster(n_workers=n), conf, n, toy=toy)
    coord = tf.train.Coordinator()
    for rep in reps:
        for hook in rep.train.hooks:
            hook.after_create_session(rep.sess, coord)  # chief: R init tokens + queue runner
    return reps, coord


def token_count(rep: Replica) -> int:
    queue = rep.train.extras["optimizer"]._sync_token_queue
    with rep.graph.as_default():
        return int(rep.sess.run(queue.size()))


def run_together(reps: list[Replica], i: int, batches: list[Any]) -> None:
    """Each replica's i-th run at once (a synchronous run blocks until its round is done)."""
    threads = [
        threading.Thread(target=rep.run, args=(i, *batch), daemon=True)
        for rep, batch in zip(reps[1:], batches[1:], strict=True)
    ]
    for t in threads:
        t.start()
    reps[0].run(i, *batches[0])
    for t in threads:
        t.join(timeout=20)
        assert not t.is_alive(), "a replica's run never finished"


# --- SAGN ---------------------------------------------------------------------------------------


def sagn(window: int, **extra: Any) -> AlgoConf:
    return AlgoConf(
        name="sagn", lr=LR, optimizer="sgd", sync=True, extra={"window": window, **SYNC, **extra}
    )


def test_sagn_window_one_reproduces_ssgd() -> None:
    """Three rounds of SSGD's rule, center -= lr * mean(g_0, g_1) at the current center; the
    first round also equals TF's SyncReplicasOptimizer (``sync``) exactly."""
    batches = data_batches(6, seed=31)
    reps, coord = start(sagn(1), 2)
    try:
        w, b = W0.astype(np.float64), float(B0)
        for r in range(3):
            pair = batches[2 * r : 2 * r + 2]
            run_together(reps, r, pair)
            wait_step(reps[0], r + 1)
            w, b = sgd_step(
                w, b, np.concatenate([p[0] for p in pair]), np.concatenate([p[1] for p in pair]), LR
            )
            np.testing.assert_allclose(reps[0].params()["w"], w, atol=1e-5)
            np.testing.assert_allclose(reps[0].params()["b"], b, atol=1e-5)
            if r == 0:
                first = reps[0].params()
        assert token_count(reps[0]) == 0  # every token was taken by a replica after its round
    finally:
        stop(reps, coord)
    reps, coord = start(AlgoConf(name="sync", lr=LR, sync=True, extra=SYNC), 2)
    try:
        run_together(reps, 0, batches[:2])
        wait_step(reps[0], 1)
        for k in ("w", "b"):
            np.testing.assert_allclose(reps[0].params()[k], first[k], atol=1e-7)
    finally:
        stop(reps, coord)


def test_sagn_round_applies_the_mean_of_every_replicas_window_mean() -> None:
    window = 2
    reps, coord = start(sagn(window), 2)
    try:
        batches = data_batches(2 * window, seed=32)
        mine = [batches[0:window], batches[window:]]  # replica k's window
        for i in range(window - 1):
            for k, rep in enumerate(reps):
                rep.run(i, *mine[k][i])
        assert reps[0].value(reps[0].global_step) == 0
        run_together(reps, window - 1, [mine[0][-1], mine[1][-1]])
        wait_step(reps[0], 1)
        grads_w, grads_b = [], []
        for k in range(2):  # each replica's local SGD from the center, gradient at each step
            w, b = W0.astype(np.float64), float(B0)
            for bx, by in mine[k]:
                r = bx @ w + b - by
                grads_w.append(2.0 / len(by) * (bx.T @ r))
                grads_b.append(2.0 / len(by) * r.sum())
                w, b = sgd_step(w, b, bx, by, LR)
        # (1/R) sum_k (1/T) sum_t g_{k,t} = the mean of all R*T gradients
        np.testing.assert_allclose(
            reps[0].params()["w"], W0 - LR * np.mean(grads_w, axis=0), atol=1e-6
        )
        np.testing.assert_allclose(reps[0].params()["b"], B0 - LR * np.mean(grads_b), atol=1e-6)
        for rep in reps:  # pulled
            local = rep.sess.run(rep.train.train_params["w"])
            np.testing.assert_allclose(local, reps[0].params()["w"], atol=1e-7)
        assert reps[0].train.batches_per_global_step == 2 * window
    finally:
        stop(reps, coord)


def test_sagn_window_reevaluates_each_local_step() -> None:
    """Toy, T=3, one replica: the round applies mean(-100, -80, -64); [T]'s unrolled SAGN
    applies mean(-100, -100, -100), i.e. SSGD."""
    reps, coord = start(sagn(3, replicas_to_aggregate=1), 1, toy=True)
    try:
        dummy = (np.zeros((1, X_DIM), np.float32), np.zeros(1, np.float32))
        for i in range(3):
            reps[0].run(i, *dummy)
        wait_step(reps[0], 1)
        np.testing.assert_allclose(reps[0].params()["a"], [LR * 244 / 3] * 2, rtol=1e-5)
        assert abs(LR * 244 / 3 - LR * 100) > 1
    finally:
        stop(reps, coord)


# --- SSGD with per-worker learning rates --------------------------------------------------------


def sync_lr(**extra: Any) -> AlgoConf:
    return AlgoConf(name="sync_lr", lr=LR, optimizer="sgd", sync=True, extra={**SYNC, **extra})


@pytest.mark.parametrize(
    "extra,lrs", [({"lrs": [0.1, 0.01]}, [0.1, 0.01]), ({"lr_decay": 0.5}, [0.1, 0.05])]
)
def test_sync_lr_round_applies_minus_the_sum_of_lr_i_g_i(
    extra: dict[str, Any], lrs: list[float]
) -> None:
    reps, coord = start(sync_lr(**extra), 2)
    try:
        assert [rep.train.extras["lr"] for rep in reps] == pytest.approx(lrs)
        batches = data_batches(2, seed=33)
        run_together(reps, 0, batches)
        wait_step(reps[0], 1)
        grads = [sgd_step(W0.astype(np.float64), float(B0), bx, by, 1.0) for bx, by in batches]
        # sgd_step with lr 1 returns theta - g, so g = theta0 - result
        dw = sum(lr * (W0 - w) for lr, (w, _) in zip(lrs, grads, strict=True))
        db = sum(lr * (B0 - b) for lr, (_, b) in zip(lrs, grads, strict=True))
        np.testing.assert_allclose(reps[0].params()["w"], W0 - dw, atol=1e-6)
        np.testing.assert_allclose(reps[0].params()["b"], B0 - db, atol=1e-6)
        assert reps[0].value(reps[0].global_step) == 1
    finally:
        stop(reps, coord)


def test_sync_lr_chief_init_leaves_exactly_r_tokens_not_the_guides_2r() -> None:
    reps, coord = start(sync_lr(), 2)
    try:
        assert token_count(reps[0]) == 2
        # The guide also runs get_init_tokens_op() by hand: twice the tokens, so one worker
        # could run a round ahead of the other.
        with reps[0].graph.as_default():
            reps[0].sess.run(reps[0].train.extras["optimizer"].get_init_tokens_op())
        assert token_count(reps[0]) == 4
    finally:
        stop(reps, coord)


def test_sync_lr_rejects_a_rate_list_of_the_wrong_length() -> None:
    with pytest.raises(ConfigError, match="2 rates for 3 replicas"):
        build_replicas(InProcessCluster(n_workers=3), sync_lr(lrs=[0.1, 0.2]), 3, init=False)
