"""In-process checks of the TF2 strategies' building blocks (eager, no cluster): the optimizer
against tf.compat.v1's update rules, the checkpoint files and keys, the error line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from recipes.checkpoint_names import OBJECT_SUFFIX as CKPT_KEY_SUFFIX
from recipes.checkpoint_names import PlainNames
from recipes.config import AlgoConf, ConfigError, DataConf, ModelConf, RunConfig, TrainerConf
from recipes.datasets import load
from recipes.dynamic_reshard import checkpoint_shards
from recipes.dynamic_table import DynamicSettings, DynamicTable
from recipes.evaluator import CheckpointScorer
from recipes.failures import first_line
from recipes.models import Model
from recipes.strategies.checkpoints import Checkpoints
from recipes.strategies.optimizer import Optimizer
from recipes.strategies.table_upkeep import TableUpkeep
from recipes.workload import Workload

V1 = {
    "sgd": lambda lr: tf.compat.v1.train.GradientDescentOptimizer(lr),
    "momentum": lambda lr: tf.compat.v1.train.MomentumOptimizer(lr, 0.9),
    "adagrad": lambda lr: tf.compat.v1.train.AdagradOptimizer(lr),
    "adam": lambda lr: tf.compat.v1.train.AdamOptimizer(lr),
}


@pytest.mark.parametrize("name", sorted(V1))
def test_optimizer_follows_the_tf1_update_rules(name: str) -> None:
    rng = np.random.RandomState(0)
    start = rng.randn(3, 4).astype(np.float32)
    grads = [rng.randn(3, 4).astype(np.float32) for _ in range(4)]
    ours = {"w": tf.Variable(start)}
    theirs = tf.Variable(start)
    opt = Optimizer(name, 0.05)
    slots = opt.create_slots(ours)
    step = tf.Variable(0, dtype=tf.int64)
    reference = V1[name](0.05)
    for g in grads:
        opt.apply(ours, {"w": tf.constant(g)}, slots, step)
        step.assign_add(1)
        reference.apply_gradients([(tf.constant(g), theirs)])
    np.testing.assert_allclose(ours["w"].numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_unknown_optimizer_is_refused() -> None:
    with pytest.raises(ConfigError, match="valid: sgd, adagrad, adam, momentum"):
        Optimizer("rmsprop", 0.1)


def _state(model: Model) -> tuple[tf.Variable, dict[str, tf.Variable], dict[str, tf.Variable]]:
    params = model.create_variables()
    step = tf.Variable(0, dtype=tf.int64)
    return step, params, Optimizer("momentum", 0.1).create_slots(params)


def test_checkpoints_keys_retention_and_restore(tmp_path: Path) -> None:
    model = Model(ModelConf(name="mlp", hidden=(8,)), 8, 1, 10)
    step, params, slots = _state(model)
    ckpts = Checkpoints(str(tmp_path), step, params, slots)
    for s in range(1, 8):
        step.assign(s * 10)
        ckpts.write(s * 10)
    kept = sorted(p.name for p in tmp_path.glob("model.ckpt-*.index"))
    assert kept == [f"model.ckpt-{s}.index" for s in (30, 40, 50, 60, 70)]  # 5 by default
    fewer = tmp_path / "fewer"
    for s in range(1, 4):  # trainer.keep_checkpoints=2
        Checkpoints(str(fewer), step, params, slots, keep=2).write(s * 10)
    assert sorted(p.name for p in fewer.glob("model.ckpt-*.index")) == [
        "model.ckpt-20.index",
        "model.ckpt-30.index",
    ]
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-70")
    assert 'model_checkpoint_path: "model.ckpt-70"' in (tmp_path / "checkpoint").read_text()
    keys = set(
        tf.train.load_checkpoint(str(tmp_path / "model.ckpt-70")).get_variable_to_shape_map()
    )
    assert {"global_step" + CKPT_KEY_SUFFIX, "model/dense0/w" + CKPT_KEY_SUFFIX} <= keys
    assert "optimizer/momentum/dense1/b" + CKPT_KEY_SUFFIX in keys
    saved = params["dense0/w"].numpy()

    step2, params2, slots2 = _state(model)  # a fresh process: new values
    assert not np.allclose(params2["dense0/w"].numpy(), saved)
    assert Checkpoints(str(tmp_path), step2, params2, slots2).restore_latest() == 70
    assert int(step2.numpy()) == 70
    np.testing.assert_array_equal(params2["dense0/w"].numpy(), saved)


def _split(full: np.ndarray, parts: int, name: str = "emb") -> dict[str, tf.Variable]:
    """``full`` as recipes/keras_model.py splits a table over ``parts`` ps: row ranges."""
    bounds = [len(full) * i // parts for i in range(parts + 1)]
    return {f"{name}/part_{i}": tf.Variable(full[bounds[i] : bounds[i + 1]]) for i in range(parts)}


def test_a_split_variable_and_its_slots_restore_into_another_split(tmp_path: Path) -> None:
    """pss's checkpoint holds a split table (and each of its slots) as one tensor in slices
    (TensorFlow's ShardedVariable): written from 2 parts, read back into 3 parts and into 1
    (then it is not split), every row where it belongs."""
    rng = np.random.RandomState(0)
    table = rng.randn(10, 4).astype(np.float32)
    moment = rng.randn(10, 4).astype(np.float32)
    step = tf.Variable(40, dtype=tf.int64)
    two = _split(table, 2)
    slots = {f"momentum/{k}": v for k, v in _split(moment, 2).items()}
    Checkpoints(str(tmp_path), step, two, slots).write(40)
    keys = tf.train.load_checkpoint(str(tmp_path / "model.ckpt-40")).get_variable_to_shape_map()
    assert keys["model/emb" + CKPT_KEY_SUFFIX] == [10, 4]  # once, whole
    assert keys["optimizer/momentum/emb" + CKPT_KEY_SUFFIX] == [10, 4]
    assert not [k for k in keys if "/part_" in k]
    for parts in (3, 1):
        zeros = np.zeros_like(table)
        params = _split(zeros, parts) if parts > 1 else {"emb": tf.Variable(zeros)}
        again = {f"momentum/{k}": tf.Variable(tf.zeros_like(v)) for k, v in params.items()}
        restored = tf.Variable(0, dtype=tf.int64)
        assert Checkpoints(str(tmp_path), restored, params, again).restore_latest() == 40
        np.testing.assert_array_equal(np.concatenate([v.numpy() for v in params.values()]), table)
        np.testing.assert_array_equal(np.concatenate([v.numpy() for v in again.values()]), moment)


def _held(path: str) -> dict[int, tuple[list[float], list[float]]]:
    """Each resident id of the dynamic table ``emb`` in the checkpoint ``path``: its row and its
    Adagrad accumulator, over every shard."""
    reader = PlainNames(tf.train.load_checkpoint(path))
    shards = checkpoint_shards(reader, "emb")
    held = {}
    for i in range(shards):
        aux = f"dynamic/emb/shard_{i}"
        seen, ids = reader.get_tensor(f"{aux}/last_seen"), reader.get_tensor(f"{aux}/row_ids")
        rows = reader.get_tensor(f"model/emb/shard_{i}")
        slot = reader.get_tensor(f"optimizer/accumulator/emb/shard_{i}")
        for r in np.flatnonzero(seen >= 0):
            assert int(ids[r]) not in held, f"id {ids[r]} has two rows"
            held[int(ids[r])] = (rows[r].tolist(), slot[r].tolist())
    return held


def test_a_dynamic_table_trained_eagerly_restores_into_another_number_of_shards(
    tmp_path: Path,
) -> None:
    """pss's path in one process: a dynamic table's lookups allocate rows inside a
    ``tf.function`` (the lock, the index), a sparse Adagrad step updates the rows read and their
    slots, and pss's checkpoint of 2 shards restores into 3 and into 1: every id on the shard its
    hash names now, with its row and its slot; its index rebuilt at the first lookup."""
    settings = DynamicSettings(capacity=60, ttl_steps=1000)
    opt = Optimizer("adagrad", 0.5)

    def table_of(shards: int) -> tuple[DynamicTable, dict[str, Any], dict[str, Any], Any]:
        table = DynamicTable("model/emb", settings, 4, tf.float32, tf.int64, shards)
        params = table.params("emb")
        return table, params, opt.create_slots(params), tf.Variable(0, dtype=tf.int64)

    table, params, slots, step = table_of(2)
    rows = [params[f"emb/shard_{i}"] for i in range(2)]
    ids = tf.constant(np.arange(1, 41, dtype=np.int64) * 7919)

    @tf.function
    def train() -> Any:
        with tf.GradientTape() as tape:
            out = table.lookup(rows, ids, training=True)
            loss = tf.reduce_sum(out * tf.range(1.0, 5.0))
        grads = tape.gradient(loss, rows)
        opt.apply(params, dict(zip(params, grads, strict=True)), slots, step)
        return out

    train()
    step.assign(1)
    two = tmp_path / "two"
    ckpts = Checkpoints(str(two), step, params, slots, tables={"emb": table}, slot_fills={})
    before = _held(ckpts.write(1))
    assert len(before) == 40 and all(acc != [0.1] * 4 for _, acc in before.values())
    more = tf.constant(np.arange(41, 51, dtype=np.int64) * 7919)  # ids never seen
    for shards in (3, 1):
        folder = tmp_path / f"on-{shards}"
        shutil.copytree(two, folder)
        again, params2, slots2, step2 = table_of(shards)
        ckpts2 = Checkpoints(
            str(folder),
            step2,
            params2,
            slots2,
            tables={"emb": again},
            slot_fills=opt.slot_fills(),
        )
        assert ckpts2.restore_latest() == 1
        assert ckpts2.resharded == [
            f"emb: 2 shard(s) in the checkpoint, {shards} now: 40 "
            "resident id(s) re-sharded by their hash"
        ]
        assert _held(ckpts2.write(2)) == before
        shards_rows = [params2[f"emb/shard_{i}"] for i in range(shards)]
        read = tf.function(lambda t=again, r=shards_rows: t.lookup(r, ids, training=False))
        expected = [before[int(i)][0] for i in ids.numpy()]
        np.testing.assert_allclose(read().numpy(), expected)
        # the coordinator's first check rebuilds the index (stale since the restore), then
        # training allocates: the restored ids keep their rows, new ids get free ones
        upkeep = TableUpkeep({"emb": again}, step2, slots2, opt.slot_fills(), str(folder))
        assert upkeep.check() and not upkeep.check()
        allocate = tf.function(
            lambda t=again, r=shards_rows, m=more: t.lookup(
                r, tf.concat([ids, m], 0), training=True
            )
        )
        np.testing.assert_allclose(allocate().numpy()[:40], expected)
        assert set(_held(ckpts2.write(3))) == set(before) | {int(i) for i in more.numpy()}


def test_the_checkpoint_scorer_restores_a_tf2_checkpoint_in_an_eager_process(
    tmp_path: Path,
) -> None:
    """The TF2 chiefs score their final checkpoint for result.json with the evaluator's
    CheckpointScorer, from an eager process: the same step, the weights restored from disk."""
    conf = ModelConf(name="mlp", hidden=(8,))
    model = Model(conf, 8, 1, 10)
    step, params, slots = _state(model)
    step.assign(70)
    path = Checkpoints(str(tmp_path), step, params, slots).write(70)
    cfg = RunConfig(str(tmp_path), AlgoConf("allreduce"), conf, DataConf(), TrainerConf())
    work = Workload.of(cfg)
    scorer = CheckpointScorer(work)
    try:
        assert scorer.restore(path) == 70
        scores = scorer.score("eval")
    finally:
        scorer.close()
    total_loss, total_acc, count = 0.0, 0.0, 0
    for x, y in work.eval_dataset():
        loss, metrics = work.scores(params, x, y)
        total_loss += float(loss) * len(y)
        total_acc += float(metrics["accuracy"]) * len(y)
        count += len(y)
    assert count == len(load(DataConf()).y_eval)  # digits' held-out split, each example once
    assert abs(scores["loss"] - total_loss / count) < 1e-5
    assert abs(scores["accuracy"] - total_acc / count) < 1e-6


def test_a_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    step, params, slots = _state(Model(ModelConf(name="mlp", hidden=(8,)), 8, 1, 10))
    Checkpoints(str(tmp_path), step, params, slots).write(5)
    other = _state(Model(ModelConf(name="mlp", hidden=(16,)), 8, 1, 10))
    with pytest.raises(ConfigError, match="use a new experiment.id"):
        Checkpoints(str(tmp_path), *other).restore_latest()


def test_first_line_skips_tensorflows_generic_lines() -> None:
    message = (
        "Graph execution error:\n\nDetected at node x defined at:\n<stack traces unavailable>\n"
        "2 root error(s) found.\n  (0) UNAVAILABLE: Connection reset by peer\n"
    )
    assert first_line(RuntimeError(message)) == "(0) UNAVAILABLE: Connection reset by peer"
    assert first_line(RuntimeError("")) == "RuntimeError"


def test_the_coordinators_build_makes_no_value_and_each_variable_gets_its_initializer() -> None:
    """Issue 35 item 1 for pss: ``prepare`` builds the user's model only for its shapes and
    initializers (keras.StatelessScope): no weight of that build has a value, not even after a
    forward pass (Keras would make every pending value when a later stateless scope ends);
    ``create_variables`` makes each variable from its initializer, where the strategy creates
    it, and a split table's parts from its layer's initializer at their shape."""
    import keras

    from recipes.keras_model import KerasModel

    def model() -> keras.Model:
        ids = keras.Input((), dtype="int64", name="ids")
        h = keras.layers.Embedding(3000, 8, name="table")(ids)
        h = keras.layers.Dense(4, name="hidden")(h)
        h = keras.layers.BatchNormalization(name="norm")(h)
        return keras.Model(ids, keras.layers.Dense(1, name="out")(h))

    built = KerasModel(model, {}, partitions=2, partition_bytes=10_000)
    built.prepare()
    template = built.template()
    assert all(getattr(w, "_value", None) is None for w in template.weights)
    params, state = built.create_variables(), built.create_state_variables()
    assert sorted(params) == [
        "hidden/bias", "hidden/kernel", "norm/beta", "norm/gamma", "out/bias", "out/kernel",
        "table/embeddings/part_0", "table/embeddings/part_1",
    ]  # fmt: skip
    parts = [params[f"table/embeddings/part_{i}"].numpy() for i in range(2)]
    assert [p.shape for p in parts] == [(1500, 8), (1500, 8)]
    assert not np.allclose(parts[0], parts[1]) and 0.045 < np.abs(parts).max() <= 0.05
    limit = (6 / (8 + 4)) ** 0.5  # Glorot uniform of the whole (8, 4) kernel
    assert 0 < np.abs(params["hidden/kernel"].numpy()).max() <= limit
    np.testing.assert_array_equal(params["norm/gamma"].numpy(), np.ones(4))
    np.testing.assert_array_equal(state["norm/moving_variance"].numpy(), np.ones(4))
    out = built.forward(params, tf.constant([0, 1499, 2999], tf.int64), training=True, state=state)
    assert out.shape == (3, 1) and np.isfinite(out.numpy()).all()
    assert all(getattr(w, "_value", None) is None for w in template.weights)
