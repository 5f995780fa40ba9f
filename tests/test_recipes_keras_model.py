"""The user's Keras model through the recipes' model interface (recipes/keras_model.py), in graph
mode as the TF1 algorithms build it: parameters on the ps through the device setter, local copies
on the worker, forward passes from any dict of values, the same names in every graph, checkpoints
under model/<path>, and real learning through an algorithm's graph."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Graph mode (eager disabled) is process-wide: each case runs in its own interpreter.
PRELUDE = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.path.insert(0, {root!r})
    import numpy as np
    import tensorflow as tf
    import keras
    v1 = tf.compat.v1
    v1.disable_eager_execution()
    from recipes.keras_model import KerasModel, ModelError
    from recipes.objective import Objective, ObjectiveError

    def functional(units=8):
        inputs = {{"a": keras.Input((3,), name="a"), "b": keras.Input((2,), name="b")}}
        h = keras.layers.Concatenate()([inputs["a"], inputs["b"]])
        h = keras.layers.Dense(units, activation="relu")(h)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.Dropout(0.1)(h)
        return keras.Model(inputs, keras.layers.Dense(1)(h))

    def sequential(classes=3):
        return keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(classes)])

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(6)
            self.out = keras.layers.Dense(2)

        def call(self, x, training=False):
            return self.out(tf.nn.relu(self.hidden(x)))

    CLUSTER = tf.train.ClusterSpec({{"ps": ["localhost:1"], "worker": ["localhost:2"]}})
    """
).format(root=str(ROOT))


def _run(body: str) -> str:
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_parameters_go_to_the_ps_copies_to_the_worker_and_names_are_stable() -> None:
    out = _run(
        """
        for factory, sample in [
            (functional, lambda: {"a": tf.zeros([2, 3]), "b": tf.zeros([2, 2])}),
            (sequential, lambda: tf.zeros([2, 5])),
            (Subclassed, lambda: tf.zeros([2, 5])),
        ]:
            seen = []
            for _ in range(2):  # two graphs in one process: the same names
                with tf.Graph().as_default():
                    model = KerasModel(factory, {}, sample=sample)
                    setter = v1.train.replica_device_setter(
                        worker_device="/job:worker/task:0", cluster=CLUSTER)
                    with v1.device(setter):
                        center = model.create_params(None)
                    with v1.device("/job:worker/task:0"), v1.variable_scope("local"):
                        local = model.create_params([v1.GraphKeys.LOCAL_VARIABLES])
                    assert {v.device for v in center.values()} == {"/job:ps/task:0"}
                    assert {v.device for v in model.state_variables().values()} <= {"/job:ps/task:0"}
                    assert {v.device for v in local.values()} == {"/job:worker/task:0"}
                    local_ids = {id(v) for v in v1.local_variables()}
                    assert all(id(v) in local_ids for v in local.values())
                    assert set(local) == set(center)
                    seen.append(sorted(center))
            assert seen[0] == seen[1], seen
            print(factory.__name__, seen[0])
        """
    )
    assert "functional ['batch_normalization/beta'" in out
    assert "dense_1/kernel" in out.splitlines()[0]
    assert "Subclassed ['subclassed/dense/bias'" in out


def test_forward_from_tensors_updates_state_and_learns_through_a_windowed_step() -> None:
    out = _run(
        """
        rng = np.random.RandomState(0)
        a = rng.randn(256, 3).astype("float32"); b = rng.randn(256, 2).astype("float32")
        y = (a.sum(1) - 2 * b[:, 0]).astype("float32")
        with tf.Graph().as_default():
            v1.set_random_seed(0)
            feats = {"a": tf.constant(a), "b": tf.constant(b)}
            model = KerasModel(functional, {"units": 16}, sample=lambda: feats)
            center = model.create_params(None)
            with v1.variable_scope("local"):
                local = model.create_params([v1.GraphKeys.LOCAL_VARIABLES])
            # EAMSGD's look-ahead: a forward pass from tensors, not variables
            look = {k: v + 0.0 for k, v in local.items()}
            objective = Objective("mse", metrics=("mae",))
            loss = objective.loss_of(model.forward(look, feats, training=True), tf.constant(y))
            grads = tf.gradients(loss, [look[k] for k in model.keys])
            step = tf.group(*[local[k].assign_sub(0.05 * g) for k, g in zip(model.keys, grads)])
            copy = tf.group(*[local[k].assign(center[k]) for k in model.keys])
            moving = model.state_variables()["batch_normalization/moving_mean"]
            with v1.Session() as sess:
                sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
                sess.run(copy)
                first = sess.run(loss)
                before = sess.run(moving).copy()
                for _ in range(300):
                    sess.run(step)
                last = sess.run(loss)
                print("ratio", last / first, "moved", float(np.abs(sess.run(moving) - before).max()))
        """
    )
    ratio = float(out.split("ratio ")[1].split()[0])
    moved = float(out.split("moved ")[1].split()[0])
    assert ratio < 0.3, out  # learnt (a model that does not learn stays near 1)
    assert moved > 0, out  # BatchNormalization's moving mean was updated by the training pass


def test_checkpoint_names_are_model_paths_and_restore_into_another_graph(tmp_path: Path) -> None:
    _run(
        f"""
        ckpt = {str(tmp_path / "m.ckpt")!r}
        with tf.Graph().as_default():
            model = KerasModel(sequential, {{"classes": 4}}, sample=lambda: tf.zeros([1, 5]))
            params = model.create_params(None)
            saver = v1.train.Saver({{f"model/{{k}}": v for k, v in params.items()}})
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                want = sess.run(params["sequential/dense/kernel"])
                saver.save(sess, ckpt)
        names = {{n for n, _ in tf.train.list_variables(ckpt)}}
        assert names == {{"model/sequential/dense/kernel", "model/sequential/dense/bias",
                          "model/sequential/dense_1/kernel", "model/sequential/dense_1/bias"}}, names
        with tf.Graph().as_default():  # e.g. the evaluator
            model = KerasModel(sequential, {{"classes": 4}}, sample=lambda: tf.zeros([1, 5]))
            params = model.create_params(None)
            saver = v1.train.Saver({{f"model/{{k}}": v for k, v in params.items()}})
            with v1.Session() as sess:
                saver.restore(sess, ckpt)
                assert np.array_equal(sess.run(params["sequential/dense/kernel"]), want)
        """
    )


def test_bad_models_and_losses_are_one_line_errors() -> None:
    out = _run(
        """
        def not_a_model():
            return 42

        def needs_arg(units):
            return sequential()

        for factory, kwargs in [(not_a_model, {}), (needs_arg, {}), (sequential, {"nope": 1})]:
            with tf.Graph().as_default():
                try:
                    KerasModel(factory, kwargs, sample=lambda: tf.zeros([1, 5])).create_params(None)
                except ModelError as e:
                    print("ModelError", str(e).replace("\\n", " "))
        with tf.Graph().as_default():
            try:
                Objective("binary_crossentropy").check(tf.zeros([4, 10]), tf.zeros([4]))
            except ObjectiveError as e:
                print("ObjectiveError", e)
            try:
                Objective("mse", metrics=("accuracy",)).metric_values(tf.zeros([4, 1]), tf.zeros([4]))
            except ObjectiveError as e:
                print("ObjectiveError", e)
        from recipes.errors import TargetError
        from recipes.targets import import_target
        for target in ["nomodule_xyz.build", "os.path.no_such_fn", "build"]:
            try:
                import_target(target, "model._target_")
            except TargetError as e:
                print("TargetError", e)
        """
    )
    lines = [line for line in out.splitlines() if "Error" in line]
    assert len(lines) == 8, out
    assert "not a keras.Model" in lines[0]
    assert all("model._target_" in line for line in lines[:3] + lines[5:])
    assert "Dense(1)" in lines[3] and "model.loss=binary_crossentropy" in lines[3]
    assert "model.metrics" in lines[4]
    assert "cannot import nomodule_xyz" in lines[5] and "recipe.code_dir" in lines[5]


def test_a_large_variable_is_split_into_one_part_per_ps_and_a_forward_joins_them() -> None:
    out = _run(
        """
        def embedded(vocab=1000):
            ids = keras.Input((), dtype="int64", name="ids")
            h = keras.layers.Embedding(vocab, 8, name="table")(ids)
            return keras.Model(ids, keras.layers.Dense(2, name="out")(h))

        cluster = tf.train.ClusterSpec(
            {"ps": ["localhost:1", "localhost:2"], "worker": ["localhost:3"]})
        with tf.Graph().as_default():
            ids = tf.constant([0, 499, 500, 999], tf.int64)
            model = KerasModel(embedded, {}, partitions=2, partition_bytes=10_000)
            setter = v1.train.replica_device_setter(
                worker_device="/job:worker/task:0", cluster=cluster)
            with v1.device(setter):
                center = model.create_params(None)
            parts = ["table/embeddings/part_0", "table/embeddings/part_1"]
            assert [k for k in center if "table" in k] == parts, list(center)
            assert [tuple(center[k].shape) for k in parts] == [(500, 8), (500, 8)]
            assert {center[k].device for k in parts} == {"/job:ps/task:0", "/job:ps/task:1"}
            names = {v.op.name for v in v1.global_variables()}
            assert "model/table/embeddings/part_0" in names
            # the whole table is in no collection: never initialised, saved or placed
            assert not [v for v in v1.global_variables() if tuple(v.shape) == (1000, 8)]
            with v1.variable_scope("local"):
                local = model.create_params([v1.GraphKeys.LOCAL_VARIABLES])
            assert set(local) == set(center)
        with tf.Graph().as_default():  # the numbers, in a local session (no cluster devices)
            ids = tf.constant([0, 499, 500, 999], tf.int64)
            model = KerasModel(embedded, {}, partitions=2, partition_bytes=10_000)
            center = model.create_params(None)
            out = model.forward(center, ids, training=False)
            grads = tf.gradients(tf.reduce_sum(out), [center[k] for k in parts])
            assert all(isinstance(g, tf.IndexedSlices) for g in grads)  # sparse, per part
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                table = np.concatenate(sess.run([center[k] for k in parts]))
                w, b = sess.run([center["out/kernel"], center["out/bias"]])
                got = sess.run(out)
            assert np.allclose(got, table[[0, 499, 500, 999]] @ w + b, atol=1e-6)
            assert 0 < np.abs(table).max() <= 0.05  # Keras' own initialiser (uniform +-0.05)
            print("ok", sorted(center))
        """
    )
    assert out.startswith("ok")


def test_each_part_of_a_split_variable_is_initialised_on_its_ps_without_the_whole() -> None:
    """Issue 35 item 1: no process computes a split table's whole initial value. Each part's
    initial value is made beside the part (colocated with it: on its ps) by its layer's own
    initializer at the part's shape: nothing in its graph reads the whole variable's initial
    value; the parts differ (one seed each) and together follow the whole shape's distribution
    (a Glorot kernel's limit is the whole kernel's, not the part's); a user's seed gives the
    same rows in every build; an initializer with no row-wise form (Orthogonal) is sliced
    from the whole, as before."""
    out = _run(
        """
        def tables(seed=None):
            ids = keras.Input((), dtype="int64", name="ids")
            init = keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
            h = keras.layers.Embedding(4000, 8, embeddings_initializer=init, name="table")(ids)
            h = keras.layers.Dense(600, name="wide")(h)
            h = keras.layers.Dense(600, kernel_initializer="orthogonal", name="square")(h)
            return keras.Model(ids, keras.layers.Dense(2, name="out")(h))

        def ancestors(t):
            seen, todo = set(), [t.op]
            while todo:
                op = todo.pop()
                if op.name not in seen:
                    seen.add(op.name)
                    todo += [i.op for i in op.inputs]
            return seen

        def build(seed):
            cluster = tf.train.ClusterSpec(
                {"ps": ["localhost:1", "localhost:2"], "worker": ["localhost:3"]})
            g = tf.Graph()
            with g.as_default():
                model = KerasModel(tables, {"seed": seed}, partitions=2, partition_bytes=10_000)
                setter = v1.train.replica_device_setter(
                    worker_device="/job:worker/task:0", cluster=cluster)
                with v1.device(setter):
                    center = model.create_params(None)
            return g, model, center

        g, model, center = build(None)
        assert set(model.parts) == {"table/embeddings", "wide/kernel", "square/kernel"}
        keras_vars = {w.path: w.value for w in model.template().trainable_variables}
        for path in ("table/embeddings", "wide/kernel"):
            whole_init = keras_vars[path].initial_value.op.name
            for i in range(2):
                part = center[f"{path}/part_{i}"]
                init = part.initializer.inputs[1]  # AssignVariableOp(handle, value)
                assert whole_init not in ancestors(init), (path, i)
                assert init.op.colocation_groups() == part.op.colocation_groups(), (path, i)
        square = center["square/kernel/part_0"].initializer.inputs[1]
        assert keras_vars["square/kernel"].initial_value.op.name in ancestors(square)

        # the numbers, in a local session
        with tf.Graph().as_default():
            model = KerasModel(tables, {}, partitions=2, partition_bytes=10_000)
            center = model.create_params(None)
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                p0, p1 = sess.run([center[f"table/embeddings/part_{i}"] for i in range(2)])
        assert p0.shape == p1.shape == (2000, 8)
        assert not np.allclose(p0, p1)  # one seed per part
        assert 0.045 < max(np.abs(p0).max(), np.abs(p1).max()) <= 0.05

        def seeded():
            with tf.Graph().as_default():
                model = KerasModel(tables, {"seed": 7}, partitions=2, partition_bytes=10_000)
                center = model.create_params(None)
                with v1.Session() as sess:
                    sess.run(v1.global_variables_initializer())
                    return sess.run([center[f"table/embeddings/part_{i}"] for i in range(2)])
        a, b = seeded(), seeded()
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        assert not np.allclose(a[0], a[1])
        print("ok")
        """
    )
    assert out.startswith("ok")
