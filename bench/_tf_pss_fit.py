"""TensorFlow's own anchor for bench_embeddings.py: ParameterServerStrategy with a ``tf_keras``
Embedding (tf_keras' Embedding looks up with ``tf.nn.embedding_lookup``, which gathers on each ps
only the rows asked for), examples/wide_deep's model rebuilt layer for layer in tf_keras, trained
by ``Model.fit`` with a ``DatasetCreator``, as TensorFlow's guide shows.

    python bench/_tf_pss_fit.py PROJECT ROWS STEPS BATCH LR

2 ps and 2 worker servers, each its own process (as tfplan's runs), this process the
coordinator; the tables split over both ps by ``MinSizePartitioner(1,000,000 bytes)`` (tfplan's
runs: ``model.partition_bytes=1000000``). Prints one JSON line, ``{"examples_per_sec": ...}``
over ``STEPS`` steps after a warm-up epoch of 20. The servers are ended by their process groups.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

WARMUP = 20
SERVER = (
    "import json, sys, tensorflow as tf; "
    "spec = tf.train.ClusterSpec(json.loads(sys.argv[1])); "
    "tf.distribute.Server(spec, job_name=sys.argv[2], task_index=int(sys.argv[3])).join()"
)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def build(rows: int, embed: int = 16, units: int = 64) -> tf_keras.Model:
    """examples/wide_deep/wide_deep/models.py's ``build``, in tf_keras."""
    item = tf_keras.Input((), dtype="int64", name="item")
    dense = tf_keras.Input((8,), name="dense")
    embedded = tf_keras.layers.Embedding(rows, embed, name="item_embedding")(item)
    deep = tf_keras.layers.Concatenate()([embedded, dense])
    deep = tf_keras.layers.Dense(units, activation="relu", name="deep_1")(deep)
    deep = tf_keras.layers.Dense(units // 2, activation="relu", name="deep_2")(deep)
    wide = tf_keras.layers.Embedding(rows, 1, name="item_wide")(item)
    logit = tf_keras.layers.Add()([tf_keras.layers.Dense(1, name="deep_logit")(deep), wide])
    return tf_keras.Model({"item": item, "dense": dense}, logit)


def main(project: str, rows: int, steps: int, batch: int, lr: float) -> None:
    # SIGTERM (a bench stopped by hand, a timeout) unwinds too: the servers below are ended by
    # the ``finally``, not left serving in sessions of their own
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ports = free_ports(5)
    spec = {
        "ps": [f"127.0.0.1:{p}" for p in ports[:2]],
        "worker": [f"127.0.0.1:{p}" for p in ports[2:4]],
        "chief": [f"127.0.0.1:{ports[4]}"],
    }
    servers = [
        subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(spec), job, str(index)],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for job in ("ps", "worker")
        for index in range(2)
    ]
    try:
        print(json.dumps({"examples_per_sec": train(project, spec, rows, steps, batch, lr)}))
    finally:
        for server in servers:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def train(
    project: str, spec: dict[str, list[str]], rows: int, steps: int, batch: int, lr: float
) -> float:
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(
        resolver,
        variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=1_000_000, max_shards=2
        ),
    )
    files = sorted(glob.glob(os.path.join(project, "data", "train-*.tfrecord")))
    features = {
        "item": tf.io.FixedLenFeature([], tf.int64),
        "dense": tf.io.FixedLenFeature([8], tf.float32),
        "clicked": tf.io.FixedLenFeature([], tf.int64),
    }

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        def parse(record: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
            got = tf.io.parse_single_example(record, features)
            label = tf.cast(got["clicked"], tf.float32)
            return {"item": got["item"], "dense": got["dense"]}, label

        data = tf.data.TFRecordDataset(files).map(parse).repeat()
        return data.batch(context.get_per_replica_batch_size(batch)).prefetch(2)

    with strategy.scope():
        model = build(rows)
        model.compile(
            optimizer=tf_keras.optimizers.SGD(lr),
            loss=tf_keras.losses.BinaryCrossentropy(from_logits=True),
        )
    data = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
    model.fit(data, epochs=1, steps_per_epoch=WARMUP, verbose=0)
    began = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    return steps * batch / (time.perf_counter() - began)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
