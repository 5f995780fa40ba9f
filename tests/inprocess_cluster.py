"""Test helper imported by the in-process cluster cases (each a script run in its own
interpreter: graph mode is process-wide): TensorFlow quiet and in graph mode, and a real
cluster of ``tf.distribute.Server``s on free loopback ports in this one process, the parameter
servers and workers talking gRPC to each other as separate tasks would.

    import sys; sys.path[:0] = [ROOT, TESTS]
    from inprocess_cluster import np, tf, v1, start_cluster
    spec, addr, servers = start_cluster(ps=2, workers=1)
"""

from __future__ import annotations

import os
import socket

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # before TensorFlow's import reads it

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

v1 = tf.compat.v1
v1.disable_eager_execution()

__all__ = ["free_port", "np", "start_cluster", "tf", "v1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster(ps: int = 2, workers: int = 1) -> tuple[tf.train.ClusterSpec, list[str], list]:
    """``ps`` parameter servers and ``workers`` workers, started: (spec, addresses, servers),
    the ps first in both lists."""
    addr = [f"127.0.0.1:{free_port()}" for _ in range(ps + workers)]
    spec = tf.train.ClusterSpec({"ps": addr[:ps], "worker": addr[ps:]})
    servers = [tf.distribute.Server(spec, job_name="ps", task_index=i) for i in range(ps)]
    servers += [tf.distribute.Server(spec, job_name="worker", task_index=i) for i in range(workers)]
    return spec, addr, servers
