"""multi_gpu: in-graph towers, one per device, on logical CPU devices of one worker task.

The worker's server is made with ``ConfigProto(device_count={"CPU": towers})``, as the runtime
does for ``algo.device=cpu`` (``tf.config.set_logical_device_configuration`` does not reach a
``tf.distribute.Server``; measured on TF 2.21). Checked: each tower's ops run on its own device,
and the averaged tower gradients equal SGD on the whole minibatch.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from recipe_cluster import free_ports
from test_rules_agn import build_with
from test_rules_common import B0, W0, data_batches, linreg_problem, sgd_step

from recipes.algorithms import get_algorithm
from recipes.algorithms.base import Problem
from recipes.config import AlgoConf

v1 = tf.compat.v1
LR = 0.05


def cluster_with_cpus(n_workers: int, cpus: int) -> Any:
    ports = free_ports(1 + n_workers)
    addr = [f"127.0.0.1:{p}" for p in ports]
    spec = tf.train.ClusterSpec({"ps": addr[:1], "worker": addr[1:]})
    config = v1.ConfigProto(device_count={"CPU": cpus})
    return SimpleNamespace(
        spec=spec,
        ps=[tf.distribute.Server(spec, job_name="ps", task_index=0, start=True)],
        workers=[
            tf.distribute.Server(spec, job_name="worker", task_index=i, config=config, start=True)
            for i in range(n_workers)
        ],
    )


def linreg_with_inputs(x: Any, y: Any) -> Problem:
    base = linreg_problem(x, y)

    def loss_on(p: dict[str, Any], bx: Any, by: Any) -> Any:
        return tf.reduce_mean(tf.square(tf.reduce_sum(bx * p["w"], axis=1) + p["b"] - by))

    return Problem(
        create_params=base.create_params, loss_fn=base.loss_fn, inputs=(x, y), loss_on=loss_on
    )


def multi_gpu(towers: int) -> AlgoConf:
    return AlgoConf(
        name="multi_gpu", lr=LR, optimizer="sgd", extra={"towers": towers, "device": "cpu"}
    )


@pytest.mark.parametrize("towers,batch", [(2, 8), (3, 7)])
def test_towers_average_to_sgd_on_the_whole_minibatch(towers: int, batch: int) -> None:
    """Slices of unequal size (7 rows over 3 towers) are weighted by their size."""
    (rep,) = build_with(cluster_with_cpus(1, towers), multi_gpu(towers), 1, linreg_with_inputs)
    w, b = W0.astype(np.float64), float(B0)
    for i, (bx, by) in enumerate(data_batches(5, size=batch, seed=41)):
        rep.run(i, bx, by)
        w, b = sgd_step(w, b, bx, by, LR)
    np.testing.assert_allclose(rep.params()["w"], w, atol=1e-6)
    np.testing.assert_allclose(rep.params()["b"], b, atol=1e-6)
    assert rep.value(rep.global_step) == 5


def test_each_tower_runs_on_its_own_device() -> None:
    (rep,) = build_with(cluster_with_cpus(1, 2), multi_gpu(2), 1, linreg_with_inputs)
    tower_devices = {}
    for op in rep.graph.get_operations():
        if op.name.startswith("tower"):
            tower_devices.setdefault(op.name.split("/")[0], set()).add(op.device)
    assert tower_devices == {
        "tower0": {"/job:worker/task:0/device:CPU:0"},
        "tower1": {"/job:worker/task:0/device:CPU:1"},
    }
    # ...and really ran there: the step's trace names both devices.
    meta = v1.RunMetadata()
    bx, by = data_batches(1, seed=42)[0]
    rep.sess.run(
        rep.train.step_ops[0],
        feed_dict={rep.x: bx, rep.y: by},
        options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE),
        run_metadata=meta,
    )
    used = {d.device for d in meta.step_stats.dev_stats}
    assert any(d.endswith("task:0/device:CPU:1") for d in used), used
    assert any(d.endswith("task:0/device:CPU:0") for d in used), used


def test_runtime_asks_for_one_cpu_device_per_cpu_tower_and_needs_the_inputs() -> None:
    algo = get_algorithm("multi_gpu")
    assert algo.cpu_devices(multi_gpu(4)) == 4
    assert algo.cpu_devices(AlgoConf(name="multi_gpu", extra={"towers": 4, "device": "gpu"})) == 1
    assert get_algorithm("hogwild").cpu_devices(multi_gpu(4)) == 1
    with pytest.raises(ValueError, match="Problem.inputs"):
        build_with(cluster_with_cpus(1, 2), multi_gpu(2), 1, linreg_problem)
