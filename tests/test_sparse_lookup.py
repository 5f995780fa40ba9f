"""Embedding tables read row by row (recipes/sparse_lookup.py through recipes/keras_model.py).

A real in-process cluster (two ps servers and a worker server, over loopback gRPC) holds a user's
Keras model with two tables, one split over both ps; what crosses to the worker in one forward
pass is measured from TensorFlow's own step statistics (the bytes of every tensor the worker's
devices receive), against the rows the batch touches, and against the whole-table read Keras
itself does (which must be large, or the measure could not fail). The outputs and the gradients
equal Keras' own forward pass exactly; an id outside its table is one line naming the layer, its
feature and the fix. Graph mode is process-wide: the case runs in its own interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASE = textwrap.dedent(
    """
    import json, os, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from inprocess_cluster import np, start_cluster, tf, v1
    import keras
    from recipes.keras_model import KerasModel
    from recipes.sparse_lookup import out_of_range_error

    spec, addr, servers = start_cluster(ps=2, workers=1)
    worker = servers[-1]

    class Custom(keras.layers.Embedding):  # its own call: Keras' whole-table read is kept
        def call(self, ids):
            return super().call(ids) * 2.0

    USERS, ITEMS, WIDTH_U, WIDTH_I = 200_000, 5_000, 16, 8

    def factory():
        user = keras.Input((), dtype="int64", name="user")
        items = keras.Input((4,), dtype="int64", name="items")  # a bag of ids per example
        tag = keras.Input((), dtype="int32", name="tag")
        u = keras.layers.Embedding(USERS, WIDTH_U)(user)
        i = keras.ops.mean(keras.layers.Embedding(ITEMS, WIDTH_I)(items), axis=1)
        t = Custom(10, 2)(tag)
        h = keras.layers.Concatenate()([u, i, t])
        return keras.Model({{"user": user, "items": items, "tag": tag}}, keras.layers.Dense(1)(h))

    rng = np.random.default_rng(0)
    batch = {{
        "user": rng.integers(0, 50, 64),  # 64 examples, at most 50 distinct users
        "items": rng.integers(0, 40, (64, 4)),
        "tag": rng.integers(0, 10, 64).astype("int32"),
    }}
    with tf.Graph().as_default():
        # the user table (12.8 MB) is split over both ps; the item table (160 KB) is not
        model = KerasModel(factory, {{}}, partitions=2, partition_bytes=200_000)
        setter = v1.train.replica_device_setter(worker_device="/job:worker/task:0", cluster=spec)
        with v1.device(setter):
            params = model.create_params(None)
        feats = {{k: tf.constant(v) for k, v in batch.items()}}
        with v1.device("/job:worker/task:0"):
            sparse = model.forward(params, feats, training=False)
            whole = [
                tf.concat([params[f"{{k}}/part_{{i}}"] for i in range(len(model.parts[k]))], 0)
                if k in model.parts else params[k]
                for k in model.keys
            ]
            keras_own, _ = model.template().stateless_call(whole, [], feats)
            keys = model.param_keys()
            grads = v1.gradients(tf.reduce_sum(sparse), [params[k] for k in keys])
            keras_grads = v1.gradients(tf.reduce_sum(keras_own), [params[k] for k in keys])
            outside = {{**feats, "user": tf.constant(np.full(64, 250_000))}}  # > 200,000 rows
            bad = model.forward(params, outside, training=False)
            kinds = {{k: type(g).__name__ for k, g in zip(keys, grads)}}
            grads = [tf.convert_to_tensor(g) for g in grads]
            keras_grads = [tf.convert_to_tensor(g) for g in keras_grads]

        def received(sess, fetch):
            meta = v1.RunMetadata()
            trace = v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE)
            sess.run(fetch, options=trace, run_metadata=meta)
            return sum(
                out.tensor_description.allocation_description.requested_bytes
                for dev in meta.step_stats.dev_stats if "/job:worker/" in dev.device
                for node in dev.node_stats if "Recv" in node.node_name
                for out in node.output
            )

        with v1.Session(worker.target) as sess:
            sess.run(v1.global_variables_initializer())
            try:
                sess.run(bad)
                bad_line = None
            except tf.errors.InvalidArgumentError as e:
                bad_line = out_of_range_error(e.message)
            a, b = sess.run([sparse, keras_own])
            g, kg = sess.run([grads, keras_grads])
            print(json.dumps({{
                "tables": model.sparse_tables,
                "parts": {{k: len(v) for k, v in model.parts.items()}},
                "kinds": kinds,
                "output_diff": float(np.max(np.abs(a - b))),
                "grad_diff": max(float(np.max(np.abs(x - y))) for x, y in zip(g, kg)),
                "sparse_bytes": received(sess, sparse),
                "whole_bytes": received(sess, keras_own),
                "distinct_users": len(set(batch["user"].tolist())),
                "distinct_items": len(set(batch["items"].ravel().tolist())),
                "other_bytes": 4 * (10 * 2 + (WIDTH_U + WIDTH_I + 2) + 1),
                "bad_line": bad_line,
            }}))
    """
).format(root=str(ROOT), tests=str(ROOT / "tests"))


def test_a_forward_pass_reads_only_the_rows_of_its_batch_from_the_parameter_servers() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CASE], capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # the two plain tables read row by row; the layer with its own call keeps Keras' read
    assert got["tables"] == {"embedding/embeddings": 200_000, "embedding_1/embeddings": 5_000}
    assert got["parts"] == {"embedding/embeddings": 2}
    assert got["output_diff"] == 0.0 and got["grad_diff"] == 0.0, got
    # only the touched rows go back as the tables' gradients
    for key in ("embedding/embeddings/part_0", "embedding/embeddings/part_1"):
        assert got["kinds"][key] == "IndexedSlices", got["kinds"]
    assert got["kinds"]["embedding_1/embeddings"] == "IndexedSlices", got["kinds"]
    # what the worker received: each distinct id's row once, plus the small dense variables
    rows = got["distinct_users"] * 16 * 4 + got["distinct_items"] * 8 * 4
    assert got["sparse_bytes"] <= 1.1 * (rows + got["other_bytes"]), got
    assert got["whole_bytes"] >= 200_000 * 16 * 4, got  # Keras' own read: every table, whole
    # an id outside its table: one line naming the layer, its feature, the rows and the fix
    assert got["bad_line"] == (
        "an id of 250,000 reached the Embedding 'embedding' (feature 'user'), whose table has "
        "200,000 rows (ids 0 to 199,999): give the layer an input_dim above the largest id (its "
        "model.* argument), or map the ids into range before the model (a vocabulary lookup or "
        "a hash)"
    ), got["bad_line"]
