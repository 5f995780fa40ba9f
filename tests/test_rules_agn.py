"""Windowed async rules (ALGORITHMS.md sections 2-4): AGN, ADAG, DynSGD, DOWNPOUR-Easy.

Each against a NumPy reference on the in-process cluster, workers stepped round-robin from one
thread; the seed bugs (the unrolled window, DOWNPOUR-Easy's ``lr * task_index``) are built here
next to the fixed recipes, so each test shows the difference it guards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from recipe_cluster import InProcessCluster
from test_rules_common import (
    B0,
    W0,
    X_DIM,
    Replica,
    build_replicas,
    data_batches,
    linreg_problem,
    sgd_step,
)

from recipes.algorithms.adag import adag_scale
from recipes.algorithms.base import BuildContext, Problem
from recipes.algorithms.downpour_easy import DownpourEasy
from recipes.config import AlgoConf
from recipes.errors import ConfigError

v1 = tf.compat.v1
LR = 0.05
DUMMY = (np.zeros((1, X_DIM), np.float32), np.zeros(1, np.float32))


def algo(name: str, lr: float = LR, optimizer: str = "sgd", **extra: Any) -> AlgoConf:
    return AlgoConf(name=name, lr=lr, optimizer=optimizer, extra=extra)


def build_with(
    cluster: InProcessCluster,
    conf: AlgoConf,
    n: int,
    make_problem: Callable[[Any, Any], Problem],
    build: Any = None,
) -> list[Replica]:
    """Like ``build_replicas``, for any problem and (optionally) any algorithm object."""
    from recipes.algorithms import get_algorithm

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
                algo=conf,
                n_replicas=n,
                replica_index=i,
                is_chief=(i == 0),
                worker_device=device,
                ps_device=setter,
                global_step=gs,
            )
            train = (build or get_algorithm(conf.name)).build(ctx, make_problem(x, y))
            global_init = v1.variables_initializer(v1.global_variables())
            local_init = train.local_init_op or v1.local_variables_initializer()
        # Strict placement, as the runtime's sessions (a bare v1.Session places softly).
        sess = v1.Session(
            cluster.workers[i].target,
            graph=graph,
            config=v1.ConfigProto(allow_soft_placement=False),
        )
        if i == 0:
            sess.run(global_init)
        sess.run(local_init)
        replicas.append(Replica(graph, sess, train, x, y, gs))
    return replicas


def local_values(rep: Replica) -> dict[str, np.ndarray]:
    return {k: rep.sess.run(v) for k, v in rep.train.train_params.items()}


def sgd_window(w: np.ndarray, b: float, batches: list[Any], lr: float = LR) -> tuple[Any, float]:
    for bx, by in batches:
        w, b = sgd_step(w, b, bx, by, lr)
    return w, b


# --- the window: every local step re-evaluates the forward pass ([T]'s unrolled-window bug) -----


def unrolled_window_gradients(window: int, lr: float) -> list[float]:
    """[T]'s pattern, built as the guide does: ``loss`` once, then T x (compute_gradients under
    control_dependencies([previous local step])). Returns d loss / d a[0] of each step."""
    graph = tf.Graph()
    with graph.as_default():
        a = v1.get_variable("a", [2], initializer=v1.zeros_initializer(), use_resource=True)
        b = v1.get_variable("b", [2], initializer=v1.zeros_initializer(), use_resource=True)
        loss = tf.reduce_mean(tf.square(a + b - 100.0))
        opt = v1.train.GradientDescentOptimizer(lr)
        grads, step = [], tf.no_op()
        for _ in range(window):
            with tf.control_dependencies([step]):
                g = opt.compute_gradients(loss, [a, b])
                step = opt.apply_gradients(g)
                grads.append(g[0][0])
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            values = sess.run([*grads, step])
    return [float(v[0]) for v in values[:window]]


def test_seed_guides_unrolled_window_takes_every_gradient_at_the_pulled_weights() -> None:
    assert unrolled_window_gradients(3, 0.1) == [-100.0, -100.0, -100.0]


@pytest.mark.parametrize(
    "conf",
    [
        algo("agn", lr=0.1, window=3),
        algo("adag", lr=0.1, window=3),
        algo("downpour_easy", lr=0.1, window=3, ps_optimizer="sgd"),
        algo("dynsgd", lr=0.1, window=3),
    ],
    ids=lambda c: c.name,
)
def test_window_reevaluates_the_forward_pass_each_local_step(conf: AlgoConf) -> None:
    """T=3, lr 0.1, a=b=0, target 100: local gradients -100, -80, -64, so a moves by
    10 + 8 + 6.4 = 24.4 (the unrolled window: 30). AGN/ADAG commit that / T, the others all."""
    (rep,) = build_replicas(InProcessCluster(n_workers=1), conf, 1, toy=True)
    losses = [rep.run(i, *DUMMY) for i in range(3)]
    assert losses == pytest.approx([10000.0, 6400.0, 4096.0])
    moved = 24.4 / 3 if conf.name in ("agn", "adag") else 24.4
    unrolled = 30.0 / 3 if conf.name in ("agn", "adag") else 30.0
    np.testing.assert_allclose(rep.params()["a"], [moved, moved], rtol=1e-6)
    assert abs(moved - unrolled) > 1.0  # the bug would be caught
    assert rep.value(rep.global_step) == 3


@pytest.mark.parametrize("name", ["agn", "adag", "dynsgd", "downpour_easy"])
def test_window_is_exactly_t_batches_including_the_first(name: str) -> None:
    """dist-keras' DOWNPOURWorker checks the window before training: its first window is T-1."""
    (rep,) = build_replicas(InProcessCluster(n_workers=1), algo(name, window=3), 1)
    batches = data_batches(3)
    for i in range(2):
        rep.run(i, *batches[i])
        np.testing.assert_array_equal(rep.params()["w"], W0)  # nothing committed yet
    rep.run(2, *batches[2])
    assert not np.allclose(rep.params()["w"], W0)
    assert rep.value(rep.global_step) == 3
    np.testing.assert_allclose(local_values(rep)["w"], rep.params()["w"], atol=1e-7)  # pulled


# --- AGN ----------------------------------------------------------------------------------------


def test_agn_window_one_equals_downpour() -> None:
    batches = data_batches(8, seed=11)
    centers = []
    for conf in (algo("agn", window=1), algo("downpour", window=1, ps_optimizer="sgd")):
        reps = build_replicas(InProcessCluster(n_workers=2), conf, 2)
        for i, (bx, by) in enumerate(batches):
            reps[i % 2].run(i // 2, bx, by)
        centers.append(reps[0].params())
    for k in ("w", "b"):
        np.testing.assert_allclose(centers[0][k], centers[1][k], atol=1e-7)


def test_agn_one_worker_commits_the_window_delta_divided_by_t() -> None:
    """theta~_1 = theta~_0 + (theta_T - theta~_0) / T, then the copy restarts from the center."""
    window = 3
    (rep,) = build_replicas(InProcessCluster(n_workers=1), algo("agn", window=window), 1)
    batches = data_batches(2 * window, seed=12)
    w, b = W0.astype(np.float64), float(B0)
    for k in range(2):
        chunk = batches[k * window : (k + 1) * window]
        for j, batch in enumerate(chunk):
            rep.run(k * window + j, *batch)
        w_t, b_t = sgd_window(w, b, chunk)
        w, b = w + (w_t - w) / window, b + (b_t - b) / window
        np.testing.assert_allclose(rep.params()["w"], w, atol=1e-6)
        np.testing.assert_allclose(rep.params()["b"], b, atol=1e-6)
        np.testing.assert_allclose(local_values(rep)["w"], w, atol=1e-6)


def test_agn_zero_gradient_leaves_the_center_unchanged() -> None:
    (rep,) = build_replicas(InProcessCluster(n_workers=1), algo("agn", window=2), 1)
    rng = np.random.RandomState(3)
    for i in range(4):
        bx = rng.normal(size=(8, X_DIM)).astype(np.float32)
        rep.run(i, bx, (bx @ W0 + B0).astype(np.float32))  # the weights fit exactly
    np.testing.assert_allclose(rep.params()["w"], W0, atol=1e-6)
    assert rep.value(rep.global_step) == 4


def linear_problem(x: Any, y: Any) -> Problem:
    """loss = mean(x) . w + mean(y) * b: a constant gradient, so deltas scale linearly."""
    base = linreg_problem(x, y)

    def loss(p: dict[str, Any]) -> Any:
        return tf.reduce_sum(tf.reduce_mean(x, axis=0) * p["w"]) + tf.reduce_mean(y) * p["b"]

    return Problem(create_params=base.create_params, loss_fn=loss)


def test_agn_delta_scaled_by_c_scales_the_center_change_by_c_over_t() -> None:
    window, (bx, by) = 4, data_batches(1, seed=5)[0]
    changes = []
    for c in (1.0, 3.0):
        (rep,) = build_with(
            InProcessCluster(n_workers=1), algo("agn", window=window), 1, linear_problem
        )
        for i in range(window):
            rep.run(i, bx * c, by * c)
        changes.append(rep.params()["w"] - W0)
        local_delta = -window * LR * c * bx.mean(axis=0)  # T steps of the constant gradient
        np.testing.assert_allclose(changes[-1], local_delta / window, atol=1e-6)
    np.testing.assert_allclose(changes[1], 3.0 * changes[0], rtol=1e-5)


# --- DynSGD -------------------------------------------------------------------------------------


def exchange_with_tau(rep: Replica, i: int, bx: np.ndarray, by: np.ndarray) -> int:
    ops = rep.train.step_ops
    _, tau = rep.sess.run(
        [ops[i % len(ops)], rep.train.extras["tau"]], feed_dict={rep.x: bx, rep.y: by}
    )
    return int(tau)


def test_dynsgd_without_interleaved_commits_applies_the_whole_delta() -> None:
    """Scale exactly 1: one worker is DOWNPOUR (the delta is not divided by T) = plain SGD."""
    window = 2
    (rep,) = build_replicas(InProcessCluster(n_workers=1), algo("dynsgd", window=window), 1)
    batches = data_batches(3 * window, seed=13)
    w, b = W0.astype(np.float64), float(B0)
    for i, batch in enumerate(batches):
        if i % window == window - 1:
            assert exchange_with_tau(rep, i, *batch) == 0
        else:
            rep.run(i, *batch)
        w, b = sgd_step(w, b, *batch, LR)
    np.testing.assert_allclose(rep.params()["w"], w, atol=1e-6)
    np.testing.assert_allclose(rep.params()["b"], b, atol=1e-6)
    assert rep.value(rep.train.extras["clock"]) == 3


@pytest.mark.parametrize("k", [1, 3])
def test_dynsgd_k_interleaved_commits_scale_the_delta_by_one_over_k_plus_one(k: int) -> None:
    a, b = build_with(InProcessCluster(n_workers=2), algo("dynsgd", window=1), 2, linreg_problem)
    batches = data_batches(k + 1, seed=14)
    for i in range(k):
        assert exchange_with_tau(b, i, *batches[i]) == 0  # b pulled each time: never stale
    before = a.params()
    assert exchange_with_tau(a, 0, *batches[k]) == k  # a pulled at clock 0; clock is now k
    w_t, b_t = sgd_step(W0.astype(np.float64), float(B0), *batches[k], LR)
    np.testing.assert_allclose(a.params()["w"] - before["w"], (w_t - W0) / (k + 1), atol=1e-6)
    np.testing.assert_allclose(a.params()["b"] - before["b"], (b_t - B0) / (k + 1), atol=1e-6)
    # the clock counts commits; a's pull took the center and the clock together
    assert a.value(a.train.extras["clock"]) == k + 1
    assert a.value(a.train.extras["pulled_clock"]) == k + 1
    np.testing.assert_allclose(local_values(a)["w"], a.params()["w"], atol=1e-7)


def test_dynsgd_clock_and_lock_are_one_per_cluster_on_the_ps() -> None:
    reps = build_replicas(InProcessCluster(n_workers=2), algo("dynsgd", window=2), 2, init=True)
    batches = data_batches(8, seed=15)
    for i, batch in enumerate(batches):
        reps[i % 2].run(i // 2, *batch)
    assert reps[1].value(reps[1].train.extras["clock"]) == 4  # once per commit, 2 each
    assert reps[0].value(reps[0].global_step) == 8
    for rep in reps:
        with rep.graph.as_default():
            locks = [op for op in rep.graph.get_operations() if op.type == "MutexV2"]
        assert len(locks) == 1 and locks[0].device.startswith("/job:ps/task:0")
        assert locks[0].get_attr("shared_name") == b"dynsgd_commit_lock"


# --- ADAG (thesis, distance-based) ---------------------------------------------------------------


def test_adag_scale_is_one_when_unmoved_in_zero_one_and_monotone_in_distance() -> None:
    distance = np.array([0.0, 1e-3, 1e-2, 3e-2, 0.1, 1.0, 10.0], np.float32)
    with tf.Graph().as_default(), v1.Session() as sess:
        scale = sess.run(adag_scale(tf.constant(distance), tf.zeros_like(distance), 1e-4))
    assert scale[0] == 1.0
    assert np.all(scale > 0) and np.all(scale <= 1)
    assert np.all(np.diff(scale) < 0)
    np.testing.assert_allclose(scale, 1 / (distance**2 / 1e-4 + 1), rtol=1e-6)


def test_adag_equals_agn_when_the_center_has_not_moved() -> None:
    batches = data_batches(6, seed=16)
    centers = []
    for name in ("agn", "adag"):
        (rep,) = build_replicas(InProcessCluster(n_workers=1), algo(name, window=3), 1)
        for i, batch in enumerate(batches):
            rep.run(i, *batch)
        centers.append(rep.params()["w"])
    np.testing.assert_allclose(centers[0], centers[1], atol=1e-7)


def test_adag_scales_a_stale_commit_per_weight_by_the_centers_distance() -> None:
    gamma = 1e-3
    a, b = build_replicas(
        InProcessCluster(n_workers=2), algo("adag", lr=0.1, window=1, gamma=gamma), 2
    )
    batches = data_batches(3, seed=17)
    b.run(0, *batches[0])
    b.run(1, *batches[1])  # the center moves away from what a pulled (W0)
    center = a.params()
    a.run(0, *batches[2])
    w_t, b_t = sgd_step(W0.astype(np.float64), float(B0), *batches[2], 0.1)
    delta_w, delta_b = w_t - W0, b_t - B0
    scale_w = 1 / ((center["w"] - W0) ** 2 / gamma + 1)
    scale_b = 1 / ((center["b"] - B0) ** 2 / gamma + 1)
    got_w = a.params()["w"] - center["w"]
    np.testing.assert_allclose(got_w, delta_w * scale_w, atol=1e-6)
    np.testing.assert_allclose(a.params()["b"] - center["b"], delta_b * scale_b, atol=1e-6)
    implied = got_w / delta_w
    assert np.all((implied > 0) & (implied <= 1 + 1e-6)) and implied.min() < 0.9
    by_distance = np.argsort(np.abs(center["w"] - W0))
    assert np.all(np.diff(implied[by_distance]) <= 1e-6)  # farther moved, smaller share


# --- DOWNPOUR-Easy ------------------------------------------------------------------------------


class SeedDownpourEasy(DownpourEasy):
    """The guide's bug, for contrast: worker k's local rate is ``lr * task_index``."""

    def build(self, ctx: BuildContext, problem: Problem) -> Any:
        import dataclasses

        scaled = dataclasses.replace(ctx.algo, lr=ctx.algo.lr * ctx.replica_index)
        return super().build(dataclasses.replace(ctx, algo=scaled), problem)


@pytest.mark.parametrize("seed_bug", [False, True])
def test_downpour_easy_worker_zero_moves_its_copy_at_the_common_rate(seed_bug: bool) -> None:
    conf = algo("downpour_easy", window=3, ps_optimizer="sgd")
    reps = build_with(
        InProcessCluster(n_workers=2),
        conf,
        2,
        linreg_problem,
        build=SeedDownpourEasy() if seed_bug else None,
    )
    bx, by = data_batches(1, seed=18)[0]
    reps[0].run(0, bx, by)
    reps[1].run(0, bx, by)
    w_ref, _ = sgd_step(W0.astype(np.float64), float(B0), bx, by, LR)
    moved = [local_values(rep)["w"] for rep in reps]
    if seed_bug:  # the guide: worker 0 never moves, worker 1 moves at lr * 1
        np.testing.assert_array_equal(moved[0], W0)
    else:
        np.testing.assert_allclose(moved[0], w_ref, atol=1e-6)
    np.testing.assert_allclose(moved[1], w_ref, atol=1e-6)


def test_downpour_easy_defaults_to_an_adagrad_ps_and_rejects_other_local_optimizers() -> None:
    (rep,) = build_replicas(InProcessCluster(n_workers=1), algo("downpour_easy", window=1), 1)
    bx, by = data_batches(1, seed=19)[0]
    rep.run(0, bx, by)
    r = bx @ W0 + B0 - by
    gw = 2.0 / len(by) * (bx.T @ r)
    np.testing.assert_allclose(rep.params()["w"], W0 - LR * gw / np.sqrt(0.1 + gw**2), atol=1e-6)
    with pytest.raises(ConfigError, match="plain SGD"):
        build_replicas(
            InProcessCluster(n_workers=1), algo("downpour_easy", optimizer="adam"), 1, init=False
        )


# --- infrastructure, every new algorithm ----------------------------------------------------------

NEW_ALGORITHMS = [
    algo("downpour_easy", window=2),
    algo("agn", optimizer="adam", window=2),
    algo("adag", optimizer="momentum", window=2),
    algo("dynsgd", optimizer="adam", window=2),
    algo("easgd", optimizer="adam", window=2),
    algo("eamsgd", window=2),
    AlgoConf(name="sagn", lr=LR, optimizer="adam", sync=True, extra={"window": 2}),
    AlgoConf(name="sync_lr", lr=LR, sync=True),
]


@pytest.mark.parametrize("conf", NEW_ALGORITHMS, ids=lambda c: c.name)
def test_placement_globals_on_ps_locals_and_local_slots_on_the_worker(conf: AlgoConf) -> None:
    reps = build_replicas(InProcessCluster(n_workers=2), conf, 2, init=False)
    for i, rep in enumerate(reps):
        with rep.graph.as_default():
            globals_, locals_ = v1.global_variables(), v1.local_variables()
        assert globals_ and all(v.device.startswith("/job:ps") for v in globals_), [
            (v.name, v.device) for v in globals_
        ]
        assert all(v.device.startswith(f"/job:worker/task:{i}") for v in locals_), [
            (v.name, v.device) for v in locals_
        ]
        assert not {id(v) for v in locals_} & {id(v) for v in globals_}
        assert {v.op.name for v in rep.train.params.values()} == {"model/w", "model/b"}
        if conf.optimizer in ("adam", "momentum") and conf.name != "sagn":
            # the local optimizer's slots are per-worker state, not checkpointed
            names = {v.op.name for v in locals_}
            assert any(n.startswith("local/model/w/") for n in names), names
            assert not any("model/w/" in v.op.name for v in globals_)
