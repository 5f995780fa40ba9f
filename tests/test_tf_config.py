"""Every planned TF_CONFIG is read correctly by TensorFlow's own TFConfigClusterResolver.

This is the one test module that imports TensorFlow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tfplan.config.compose import compose_config, to_config
from tfplan.engine.launching import PlanLaunches
from tfplan.engine.plans import make_plan as plan
from tfplan.planning.context import PlanContext
from tfplan.planning.plan import Role
from tfplan.planning.state import Allocation
from tfplan.planning.tf_config import tf_config_json

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CONF = Path(__file__).resolve().parent.parent / "conf"
CTX = PlanContext(cwd="/tmp/project", local_python="/usr/bin/python3", tf_version="2.21.0")


@pytest.fixture(scope="module")
def resolver_class() -> type:
    import tensorflow as tf

    return tf.distribute.cluster_resolver.TFConfigClusterResolver  # type: ignore[no-any-return]


def test_tf_config_json_is_standard_and_stable() -> None:
    spec = {"worker": ["h:2"], "ps": ["h:1"], "chief": []}
    text = tf_config_json(spec, "worker", 0)
    assert text == '{"cluster":{"ps":["h:1"],"worker":["h:2"]},"task":{"index":0,"type":"worker"}}'
    assert json.loads(text)["task"] == {"type": "worker", "index": 0}


@pytest.mark.parametrize(
    "overrides",
    [
        ["cluster=local"],
        ["cluster=local_chief"],
        ["cluster=3node"],
        ["cluster=gpu2x4", "algo=sync"],
    ],
)
def test_tensorflow_reads_every_tasks_tf_config(
    overrides: list[str], resolver_class: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = plan(to_config(compose_config(overrides, CONF)), None, CTX)
    launches = PlanLaunches(p, Allocation())
    for task in p.tasks:
        monkeypatch.setenv("TF_CONFIG", p.tf_config(task))
        resolver = resolver_class()
        assert resolver.cluster_spec().as_dict() == p.cluster_spec()
        assert resolver.task_type == task.role.value
        assert resolver.task_id == task.index
        if task.role is not Role.EVALUATOR:
            assert resolver.cluster_spec().task_address(task.role.value, task.index) == (
                f"{p.address_of(task)}:{task.port}"
            )
        # the same string reaches the process through its environment
        assert launches.request(task).tf_config == p.tf_config(task)
