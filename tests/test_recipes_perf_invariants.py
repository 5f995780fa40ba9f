"""The runtime runs a window's pure-local steps on the raw session, past the hooks (see
docs/runtime.md, Performance). These tests pin what makes that safe: ``touches_ps`` finds every
ps op a run would execute, the local steps of each windowed algorithm touch no ps, and a raw run
of a local step leaves the ps (its variables and ``global_step``) untouched."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from recipe_cluster import InProcessCluster
from test_rules_common import build_replicas

from recipes.config import AlgoConf
from recipes.runtime import touches_ps

v1 = tf.compat.v1
WINDOWED = {"downpour": 5, "agn": 4, "adag": 4, "dynsgd": 5, "easgd": 4, "eamsgd": 4}


def _local_flags(replica) -> list[bool]:  # type: ignore[no-untyped-def]
    with replica.graph.as_default():
        return [not touches_ps([op, replica.train.loss]) for op in replica.train.step_ops]


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_window_is_local_steps_then_one_exchange_and_locals_leave_the_ps_alone(name: str) -> None:
    window = WINDOWED[name]
    algo = AlgoConf(name=name, lr=0.1, optimizer="sgd", extra={"window": window})
    r = build_replicas(InProcessCluster(1, 2), algo, 2)[0]
    assert _local_flags(r) == [True] * (window - 1) + [False]
    before = r.params(), int(r.value(r.global_step))
    bx = np.ones((4, 3), np.float32)
    by = np.ones(4, np.float32)
    for i in range(window - 1):
        r.run(i, bx, by)
        assert int(r.value(r.global_step)) == before[1]
        for k, v in r.params().items():
            np.testing.assert_array_equal(v, before[0][k])
    r.run(window - 1, bx, by)
    assert int(r.value(r.global_step)) == before[1] + window


@pytest.mark.parametrize("name", ["hogwild", "sync"])
def test_every_step_of_ps_algorithms_goes_through_the_hooks(name: str) -> None:
    algo = AlgoConf(name=name, lr=0.1, optimizer="sgd")
    r = build_replicas(InProcessCluster(1, 2), algo, 2, init=False)[0]
    assert _local_flags(r) == [False] * len(r.train.step_ops)


def test_touches_ps_follows_control_inputs() -> None:
    with tf.Graph().as_default():
        with v1.device("/job:ps/task:0"):
            on_ps = tf.constant(1.0)
        with v1.device("/job:worker/task:0"):
            plain = tf.constant(2.0)
            with tf.control_dependencies([on_ps]):
                gated = tf.identity(plain)
        assert not touches_ps([plain])
        assert touches_ps([gated])
