"""Synchronous SGD rules (ALGORITHMS.md section 7, on TF's SyncReplicasOptimizer).

The chief's queue runner (started by the hook, as in the real runtime) aggregates in the
background; the test steps workers from one thread and waits on the global step, with deadlines.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from recipe_cluster import InProcessCluster
from test_rules_common import B0, W0, Replica, build_replicas, data_batches, sgd_step

from recipes.config import AlgoConf

v1 = tf.compat.v1
LR = 0.1


def start_sync(n: int, r: int | None = None) -> tuple[list[Replica], Any]:
    extra = {"replicas_to_aggregate": r, "run_timeout_secs": 20, "stop_grace_secs": 1}
    reps = build_replicas(
        InProcessCluster(n_workers=n), AlgoConf(name="sync", lr=LR, extra=extra), n
    )
    coord = tf.train.Coordinator()
    for rep in reps:
        for hook in rep.train.hooks:
            hook.after_create_session(rep.sess, coord)  # chief: R init tokens + queue runner
    return reps, coord


def wait_step(rep: Replica, step: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while rep.value(rep.global_step) < step:
        assert time.monotonic() < deadline, f"global_step never reached {step}"
        time.sleep(0.02)


def accumulated(rep: Replica) -> int:
    opt = rep.train.extras["optimizer"]
    with rep.graph.as_default():
        return int(rep.sess.run(opt._accumulator_list[0][0].num_accumulated()))


def stop(reps: list[Replica], coord: Any) -> None:
    coord.request_stop()
    for rep in reps:
        rep.sess.close()


def test_chief_hook_enqueues_exactly_r_tokens() -> None:
    reps, coord = start_sync(3, r=2)
    try:
        queue = reps[0].train.extras["optimizer"]._sync_token_queue
        with reps[0].graph.as_default():
            assert reps[0].sess.run(queue.size()) == 2  # R, not doubled
        assert reps[0].train.batches_per_global_step == 2
    finally:
        stop(reps, coord)


def test_identical_batches_equal_one_sgd_step_and_step_counts_r_gradients() -> None:
    reps, coord = start_sync(2)
    try:
        bx, by = data_batches(1)[0]
        reps[0].run(0, bx, by)
        assert accumulated(reps[0]) == 1
        assert reps[0].value(reps[0].global_step) == 0  # one gradient is not a step
        reps[1].run(0, bx, by)
        wait_step(reps[0], 1)
        w, b = sgd_step(W0.astype(np.float64), float(B0), bx, by, LR)
        np.testing.assert_allclose(reps[1].params()["w"], w, atol=1e-6)
        np.testing.assert_allclose(reps[1].params()["b"], b, atol=1e-6)
        assert reps[0].value(reps[0].global_step) == 1
    finally:
        stop(reps, coord)


def test_distinct_batches_equal_sgd_on_the_concatenation() -> None:
    reps, coord = start_sync(2)
    try:
        (x0, y0), (x1, y1) = data_batches(2, seed=4)
        reps[0].run(0, x0, y0)
        reps[1].run(0, x1, y1)
        wait_step(reps[0], 1)
        w, b = sgd_step(
            W0.astype(np.float64), float(B0), np.concatenate([x0, x1]), np.concatenate([y0, y1]), LR
        )
        np.testing.assert_allclose(reps[0].params()["w"], w, atol=1e-5)
        np.testing.assert_allclose(reps[0].params()["b"], b, atol=1e-5)
    finally:
        stop(reps, coord)


def test_init_tokens_carry_step_zero_so_each_second_gradient_is_stale() -> None:
    """A TF quirk the runtime inherits (documented in docs/runtime.md): the R initial tokens
    hold global_step 0, so after step 1 each worker's next gradient is computed with
    local_step 0 and dropped; the round after that counts again."""
    reps, coord = start_sync(2)
    try:
        batches = data_batches(6, seed=7)
        reps[0].run(0, *batches[0])
        reps[1].run(0, *batches[1])
        wait_step(reps[0], 1)
        reps[0].run(0, *batches[2])
        reps[1].run(0, *batches[3])
        assert accumulated(reps[0]) == 0 and reps[0].value(reps[0].global_step) == 1
        # Round 3 counts; each run blocks for the next token, so worker 0 runs in a thread.
        t = threading.Thread(target=reps[0].run, args=(0, *batches[4]), daemon=True)
        t.start()
        reps[1].run(0, *batches[5])
        t.join(timeout=20)
        assert not t.is_alive()
        wait_step(reps[0], 2)
    finally:
        stop(reps, coord)


def test_stale_gradient_is_dropped() -> None:
    reps, coord = start_sync(3, r=2)  # one backup replica
    try:
        batches = data_batches(3, seed=6)
        reps[0].run(0, *batches[0])
        reps[1].run(0, *batches[1])
        wait_step(reps[0], 1)
        before = reps[0].params()
        # replica 2 still holds local_step 0 < global_step 1: its gradient must not count
        reps[2].run(0, *batches[2])
        assert accumulated(reps[0]) == 0
        assert reps[0].value(reps[0].global_step) == 1
        np.testing.assert_array_equal(reps[0].params()["w"], before["w"])
    finally:
        stop(reps, coord)


def test_a_step_past_its_timeout_once_the_job_reached_max_steps_ends_the_replica() -> None:
    """A synchronous replica blocked for a token no aggregation will give (the others made the
    last steps without it) stops as done when the job is at max_steps, instead of failing as
    if a peer were dead (seen under load: worker/1 made the last steps, the chief's run timed
    out, exit 4); before max_steps the timeout still fails it."""
    from recipes.replica import hooked_step

    with tf.Graph().as_default():
        step = v1.train.get_or_create_global_step()
        token = tf.queue.FIFOQueue(1, tf.int64).dequeue()  # an empty token queue: blocks
        at_40 = step.assign(40)
        options = v1.RunOptions(timeout_in_ms=200)
        with v1.train.MonitoredSession() as sess:
            sess._tf_sess().run(at_40)
            assert hooked_step(sess, [token, step], options, step, max_steps=40) is None
            with pytest.raises(tf.errors.DeadlineExceededError):
                hooked_step(sess, [token, step], options, step, max_steps=41)
