"""``pss`` reads and writes only a batch's rows of an embedding table (recipes/keras_model.py
``forward`` inside ParameterServerStrategy's functions, recipes/strategies/optimizer.py's sparse
rule).

A real in-process cluster (two ps servers and a worker server over loopback gRPC, this process
the coordinator, as TensorFlow's own strategy tests build it) trains one step of a Keras model
whose user table is split over both ps. What must hold:

- the traced step reads no table whole: every variable read of a table part in the function feeds
  nothing (inside a ``tf.function`` a read that feeds anything must run, so a whole-table join
  would move every row to the worker at every step), and the parts are gathered row by row;
- the loss equals Keras' own forward pass over the whole tables;
- the step changes exactly the rows of the batch's ids, in each part, and no other;
- a model whose own layer reads the table whole (tied weights) gets the real table there.

ParameterServerStrategy needs eager mode set up process-wide: the case runs in its own
interpreter.
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
    import json, os, socket, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.path.insert(0, {root!r})
    import numpy as np
    import tensorflow as tf
    import keras
    from recipes.keras_model import KerasModel
    from recipes.strategies.optimizer import Optimizer

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    addr = [f"127.0.0.1:{{free_port()}}" for _ in range(4)]
    spec = {{"ps": addr[:2], "worker": addr[2:3], "chief": addr[3:]}}
    cluster = tf.train.ClusterSpec(spec)
    servers = [tf.distribute.Server(cluster, job_name="ps", task_index=i) for i in range(2)]
    servers.append(tf.distribute.Server(cluster, job_name="worker", task_index=0))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    USERS, WIDTH = 20_000, 8

    def factory():
        user = keras.Input((), dtype="int64", name="user")
        dense = keras.Input((3,), name="extra")
        u = keras.layers.Embedding(USERS, WIDTH, name="user_emb")(user)
        h = keras.layers.Concatenate()([u, dense])
        return keras.Model({{"user": user, "extra": dense}}, keras.layers.Dense(1, name="out")(h))

    model = KerasModel(factory, {{}}, partitions=2, partition_bytes=100_000)
    model.prepare()
    with strategy.scope():
        params = model.create_variables()
        opt = Optimizer("sgd", 0.5)
        slots = opt.create_slots(params)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
    keys = list(params)
    rng = np.random.default_rng(0)
    users = np.concatenate([rng.integers(0, 50, 32), rng.integers(15_000, 15_050, 32)])
    feats = {{"user": tf.constant(users), "extra": tf.constant(rng.normal(size=(64, 3)), tf.float32)}}

    @tf.function
    def step(feats):
        def replica_fn(feats):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model.forward(params, feats, True))
            grads = tape.gradient(loss, [params[k] for k in keys])
            opt.apply(params, dict(zip(keys, grads)), slots, step_var)
            return loss
        return strategy.run(replica_fn, args=(feats,))

    def keras_own_loss(m, values):  # Keras' own forward pass over whole tables, parts joined
        whole = m._table_values(values, stand_ins={{}})
        return float(tf.reduce_sum(m.template().stateless_call(whole, [], feats)[0]))

    before = {{k: params[k].numpy() for k in keys}}
    keras_loss = keras_own_loss(model, before)
    loss = coordinator.schedule(step, args=(feats,))
    coordinator.join()
    after = {{k: params[k].numpy() for k in keys}}

    (concrete,) = step._list_all_concrete_functions()
    graph = concrete.graph
    handles = {{id(params[k].handle): k for k in keys}}
    table_of = {{
        internal.ref(): handles[id(external)]
        for external, internal in graph.captures if id(external) in handles
    }}
    def table(op):
        return table_of.get(op.inputs[0].ref()) if op.inputs else None
    reads = [
        (table(op), bool(op.outputs[0].consumers()))
        for op in graph.get_operations() if op.type == "ReadVariableOp" and table(op)
    ]
    gathers = sorted({{table(op) for op in graph.get_operations()
                      if op.type == "ResourceGather" and table(op)}})
    changed = {{
        k: sorted(np.nonzero(np.any(after[k] != before[k], axis=1))[0].tolist())
        for k in keys if k.startswith("user_emb/")
    }}
    # a model whose own layer reads the table whole (tied weights): it must get the real join
    class TableSum(keras.layers.Layer):
        def __init__(self, emb, **kwargs):
            super().__init__(**kwargs)
            self.emb = emb

        def call(self, x):
            return x[:, :1] * 0.0 + keras.ops.sum(self.emb.embeddings)

    def tied():
        user = keras.Input((), dtype="int64", name="user")
        extra = keras.Input((3,), name="extra")
        emb = keras.layers.Embedding(USERS, WIDTH, name="user_emb")
        h = keras.layers.Concatenate()([emb(user), extra, TableSum(emb, name="table_sum")(extra)])
        return keras.Model({{"user": user, "extra": extra}}, keras.layers.Dense(1, name="out")(h))

    tied_model = KerasModel(tied, {{}}, partitions=2, partition_bytes=100_000)
    tied_model.prepare()
    with strategy.scope():
        tied_params = tied_model.create_variables()

    @tf.function
    def tied_loss(feats):
        return strategy.run(
            lambda f: tf.reduce_sum(tied_model.forward(tied_params, f, False)), args=(feats,)
        )

    tied_keras = keras_own_loss(tied_model, tied_params)
    tied_got = coordinator.schedule(tied_loss, args=(feats,))
    coordinator.join()

    print(json.dumps({{
        "tied_loss": float(tied_got.fetch()),
        "tied_keras": tied_keras,
        "parts": {{k: v for k, v in model.parts.items()}},
        "sparse": model.sparse_tables,
        "table_reads_feeding_something": [k for k, used in reads if used and k.startswith("user_emb/")],
        "gathers": gathers,
        "loss": float(loss.fetch()),
        "keras_loss": keras_loss,
        "changed": changed,
        "touched": sorted(set(users.tolist())),
    }}))
    """
).format(root=str(ROOT))


def test_pss_reads_and_writes_only_the_rows_of_its_batch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CASE], capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["sparse"] == {"user_emb/embeddings": 20_000}
    assert got["parts"] == {"user_emb/embeddings": [[0, 10_000], [10_000, 20_000]]}
    parts = ["user_emb/embeddings/part_0", "user_emb/embeddings/part_1"]
    assert got["table_reads_feeding_something"] == [], got
    assert got["gathers"] == parts, got
    assert abs(got["loss"] - got["keras_loss"]) <= 1e-4 * max(1.0, abs(got["keras_loss"])), got
    # a layer reading the table itself got the real table, not the stand-in
    assert abs(got["tied_loss"] - got["tied_keras"]) <= 1e-3 * max(1.0, abs(got["tied_keras"])), got
    touched = got["touched"]
    assert got["changed"][parts[0]] == [r for r in touched if r < 10_000]
    assert got["changed"][parts[1]] == [r - 10_000 for r in touched if r >= 10_000]
