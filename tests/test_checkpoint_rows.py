"""Rows read straight from a checkpoint's files (recipes/checkpoint_bundle.py), and the scorers
that read a large table so instead of loading it (recipes/checkpoint_rows.py, evaluator.py).

Real checkpoints written by TensorFlow's own savers: a TF1 ``Saver`` with a table in slices (as
the parameter servers save a split table) and whole, a TF2 object checkpoint of a
``ShardedVariable`` (as ``pss`` saves one); each row read is compared with TensorFlow's reader.
The scorer scores the same checkpoint with its table loaded and read by rows: the same scores,
and the table's variable never initialised in the row-reading scorer's session.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from recipes.checkpoint_bundle import Bundle, BundleError
from recipes.config import AlgoConf, DataConf, ModelConf, RunConfig, TrainerConf
from recipes.evaluator import CheckpointScorer
from recipes.workload import Workload, saver_names

v1 = tf.compat.v1

MODELS = textwrap.dedent(
    '''
    """A user's model over an Embedding table: nothing of tfplan."""
    import keras


    def tabled(rows=1000, dim=4):
        ids = keras.Input((2,), dtype="int64", name="ids")
        h = keras.layers.Embedding(rows, dim, name="table")(ids)
        h = keras.layers.Flatten(name="flat")(h)
        h = keras.layers.Dense(8, activation="relu", name="hidden")(h)
        return keras.Model(ids, keras.layers.Dense(3, name="out")(h))
    '''
)
PACKAGE = "rowscase"  # no other test imports a package of this name


def _tf1_checkpoint(folder: Path, parts: int) -> tuple[str, dict[str, np.ndarray]]:
    """A TF1 checkpoint of a 10 x 4 table in ``parts`` slices (TensorFlow's partitioner), a
    float vector and an int64 matrix; returns its prefix and the values saved."""
    with tf.Graph().as_default():
        table = v1.get_variable(
            "model/table",
            shape=[10, 4],
            partitioner=v1.fixed_size_partitioner(parts),
            initializer=v1.random_normal_initializer(seed=1),
        )
        bias = v1.get_variable("model/bias", initializer=np.arange(3, dtype=np.float32))
        counts = v1.get_variable("counts", initializer=np.arange(12, dtype=np.int64).reshape(3, 4))
        saver = v1.train.Saver()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values = {
                "model/table": sess.run(tf.concat(list(table), 0)),
                "model/bias": sess.run(bias),
                "counts": sess.run(counts),
            }
            return str(saver.save(sess, str(folder / "model.ckpt"), global_step=3)), values


@pytest.mark.parametrize("parts", [1, 3])
def test_rows_of_a_tf1_checkpoint_are_tensorflows_own(tmp_path: Path, parts: int) -> None:
    prefix, values = _tf1_checkpoint(tmp_path, parts)
    bundle = Bundle(prefix)
    assert bundle.slices("model/table") == ([(0, 10)] if parts == 1 else [(0, 4), (4, 7), (7, 10)])
    ids = np.array([9, 0, 4, 4, 7, 3, 6])  # any order, repeats, across every slice
    np.testing.assert_array_equal(bundle.rows("model/table", ids), values["model/table"][ids])
    np.testing.assert_array_equal(bundle.rows("counts", [2, 0]), values["counts"][[2, 0]])
    np.testing.assert_array_equal(bundle.tensor("model/bias"), values["model/bias"])
    np.testing.assert_array_equal(bundle.tensor("model/table"), values["model/table"])
    with pytest.raises(IndexError):
        bundle.rows("model/table", [10])
    bundle.close()


def test_rows_of_a_tf2_sharded_variable_are_tensorflows_own(tmp_path: Path) -> None:
    from recipes.strategies.checkpoints import Checkpoints

    value = np.random.RandomState(0).standard_normal((11, 3)).astype(np.float32)
    parts = [tf.Variable(value[:4]), tf.Variable(value[4:8]), tf.Variable(value[8:])]
    step = tf.Variable(5, dtype=tf.int64)
    params = {f"table/part_{i}": p for i, p in enumerate(parts)}
    prefix = Checkpoints(str(tmp_path), step, params, {}).write(5)
    name = "model/table/.ATTRIBUTES/VARIABLE_VALUE"
    bundle = Bundle(prefix)
    assert bundle.slices(name) == [(0, 4), (4, 8), (8, 11)]
    np.testing.assert_array_equal(bundle.rows(name, [10, 1, 5]), value[[10, 1, 5]])
    np.testing.assert_array_equal(tf.train.load_checkpoint(prefix).get_tensor(name), value)


def test_what_the_reader_cannot_read_is_its_own_error(tmp_path: Path) -> None:
    prefix, _ = _tf1_checkpoint(tmp_path, 3)
    with pytest.raises(BundleError, match="not a local file"):
        Bundle("gs://bucket/model.ckpt-3")
    with pytest.raises(BundleError, match="No such file"):
        Bundle(str(tmp_path / "model.ckpt-4"))
    (tmp_path / "junk.index").write_bytes(b"not a table")
    with pytest.raises(BundleError, match="not a checkpoint index"):
        Bundle(str(tmp_path / "junk"))
    data = Path(prefix + ".data-00000-of-00001")
    data.write_bytes(data.read_bytes()[:20])  # torn: shorter than its entries
    bundle = Bundle(prefix)
    with pytest.raises(BundleError, match="torn"):
        bundle.rows("model/table", [9])
    with tf.Graph().as_default():
        v1.get_variable("words", initializer=tf.constant(["a", "b"]))
        saver = v1.train.Saver()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            strings = saver.save(sess, str(tmp_path / "strings"))
    with pytest.raises(BundleError, match="not a numeric tensor"):
        Bundle(strings).rows("words", [0])


# -- the scorers ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def user_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The user's package on ``sys.path`` and an npz data set of ids and labels."""
    where = tmp_path_factory.mktemp("rows_project")
    (where / PACKAGE).mkdir()
    (where / PACKAGE / "__init__.py").write_text("")
    (where / PACKAGE / "models.py").write_text(MODELS)
    rng = np.random.RandomState(0)
    for split, n in (("train", 600), ("eval", 300)):
        np.savez(
            where / f"{split}.npz",
            ids=rng.randint(0, 1000, size=(n, 2)).astype(np.int64),
            label=rng.randint(0, 3, size=n).astype(np.int64),
        )
    sys.path.insert(0, str(where))
    yield where
    sys.path.remove(str(where))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


def _config(where: Path, out: Path, partitions: int, **trainer: Any) -> RunConfig:
    model = ModelConf(
        target=f"{PACKAGE}.models.tabled",
        kwargs={},
        partition_bytes=1000 if partitions > 1 else None,
    )
    data = DataConf(
        name="npz",
        train=(str(where / "train.npz"),),
        eval=(str(where / "eval.npz"),),
        batch_size=50,
    )
    return RunConfig(str(out), AlgoConf("hogwild"), model, data, TrainerConf(**trainer))


def _write_trained(cfg: RunConfig, partitions: int, step: int, fmt: str = "tf1") -> str:
    """A checkpoint as the chief writes one: the model's variables (the table in slices when
    split over the ps) at new random values, the global step; ``fmt`` tf1: a TF1 chief's
    ``Saver``, tf2: pss's object checkpoint (recipes/strategies/checkpoints.py)."""
    rng = np.random.RandomState(step)
    with tf.Graph().as_default():
        work = Workload.of(cfg, partitions)
        gs = v1.train.get_or_create_global_step()
        params = work.model.create_params()
        state = work.model.state_variables()
        saver = v1.train.Saver(saver_names(gs, params, state))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values = {}
            for key, var in params.items():
                values[key] = rng.standard_normal(var.shape.as_list()).astype(np.float32)
                var.load(values[key], sess)
            gs.load(step, sess)
            if fmt == "tf1":
                return str(saver.save(sess, os.path.join(cfg.output_dir, "model.ckpt"), step))
    from recipes.strategies.checkpoints import Checkpoints

    variables = {key: tf.Variable(value) for key, value in values.items()}
    counter = tf.Variable(step, dtype=tf.int64)
    return Checkpoints(cfg.output_dir, counter, variables, {}).write(step)


def _scores(cfg: RunConfig, partitions: int, ckpt: str) -> tuple[dict[str, Any], list[str], Any]:
    lines: list[str] = []
    scorer = CheckpointScorer(Workload.of(cfg, partitions), log=lines.append)
    try:
        assert scorer.restore(ckpt) == int(ckpt.rsplit("-", 1)[1])
        scores = {"eval": scorer.score("eval"), "train": scorer.score("train")}
        with scorer.graph.as_default():
            unset = scorer._sess.run(v1.report_uninitialized_variables())
    finally:
        scorer.close()
    return scores, lines, [u.decode() for u in unset]


@pytest.mark.parametrize("partitions,fmt", [(1, "tf1"), (2, "tf1"), (2, "tf2")])
def test_a_table_scored_by_rows_gives_the_loaded_tables_scores(
    user_project: Path, tmp_path: Path, partitions: int, fmt: str
) -> None:
    cfg = _config(user_project, tmp_path, partitions, score_rows_bytes=None)
    first = _write_trained(cfg, partitions, 40, fmt)
    loaded, said, unset = _scores(cfg, partitions, first)
    assert said == [] and not any("table" in u for u in unset), unset
    by_rows_cfg = dataclasses.replace(cfg, trainer=TrainerConf(score_rows_bytes=1000))
    by_rows, said, unset = _scores(by_rows_cfg, partitions, first)
    assert said == [
        "scoring: 1 table(s) of 0.0 MiB read from each checkpoint row by row, not loaded "
        "(trainer.score_rows_bytes=1,000)"
    ]
    # the table (its parts) never loaded: the session never initialised or restored it
    assert unset and all("table" in u for u in unset), unset
    assert _flat(by_rows) == pytest.approx(_flat(loaded), rel=1e-6, abs=1e-7)
    # a later checkpoint: its own rows, not the first one's
    later = _write_trained(cfg, partitions, 41, fmt)
    later_loaded = _flat(_scores(cfg, partitions, later)[0])
    assert _flat(_scores(by_rows_cfg, partitions, later)[0]) == pytest.approx(later_loaded)
    assert later_loaded != pytest.approx(_flat(loaded))


def _flat(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    return {f"{split}/{k}": v for split, values in scores.items() for k, v in values.items()}


def test_a_table_of_another_shape_fails_the_restore_as_tensorflows_would(
    user_project: Path, tmp_path: Path
) -> None:
    cfg = _config(user_project, tmp_path, 1, score_rows_bytes=0)
    ckpt = _write_trained(cfg, 1, 7)
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kwargs={"rows": 900}))
    scorer = CheckpointScorer(Workload.of(other), log=lambda line: None)
    try:
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
            scorer.restore(ckpt)
    finally:
        scorer.close()
    assert "tensor_name = model/table/embeddings; shape in shape_and_slice spec [900, 4] " in str(
        e.value
    ) and "does not match the shape stored in checkpoint: [1000, 4]" in str(e.value)
