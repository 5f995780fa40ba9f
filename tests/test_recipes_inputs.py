"""recipes/inputs/: tf.data pipelines over TFRecord, CSV, NPZ, the in-memory sets and a factory.

Small real files in tmp_path: a tabular set (3 float features ``a``, ``b``, ``c`` + 1 int64
feature ``k`` + the int64 label, whose value is the example's id, so that coverage and
disjointness are checked by id), in several shards.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import yaml

from recipes import datasets, errors, inputs
from recipes.config import DataConf, FeatureConf, load_run_config
from recipes.errors import TargetError
from recipes.inputs import InputError
from recipes.inputs.npz import _npz_table

REPO = Path(__file__).resolve().parent.parent
v1 = tf.compat.v1

N_FILES, PER_FILE = 4, 30
N = N_FILES * PER_FILE
FEATURES = {
    "a": FeatureConf("float32", ()),
    "b": FeatureConf("float32", ()),
    "c": FeatureConf("float32", ()),
    "k": FeatureConf("int64", ()),
    "label": FeatureConf("int64", ()),
}


def _row(i: int) -> dict[str, Any]:
    return {"a": i * 0.5, "b": -float(i), "c": i / 7.0, "k": i % 5, "label": i}


def _example(values: dict[str, Any]) -> bytes:
    feature = {}
    for name, v in values.items():
        vals = v if isinstance(v, list) else [v]
        if isinstance(vals[0], bytes):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=vals))
        elif isinstance(vals[0], int):
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=vals))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=vals))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write_tfrecord(path: Path, rows: list[dict[str, Any]], compression: str = "") -> None:
    options = tf.io.TFRecordOptions(compression_type=compression) if compression else None
    with tf.io.TFRecordWriter(str(path), options) as w:
        for r in rows:
            w.write(_example(r))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    for s in range(N_FILES):
        ids = range(s * PER_FILE, (s + 1) * PER_FILE)
        _write_tfrecord(root / f"train-{s}.tfrecord", [_row(i) for i in ids])
        with open(root / f"train-{s}.csv", "w") as f:
            f.write("id,a,b,c,k,label\n")
            for i in ids:
                r = _row(i)
                f.write(f"{i},{r['a']},{r['b']},{r['c']},{r['k']},{r['label']}\n")
        np.savez(
            root / f"train-{s}.npz",
            x=np.stack([[_row(i)[n] for n in "abc"] for i in ids]).astype(np.float64),
            k=np.array([_row(i)["k"] for i in ids], np.int32),
            label=np.array(list(ids), np.int64),
        )
    _write_tfrecord(root / "eval.tfrecord", [_row(1000 + i) for i in range(25)])
    return root


def _tfrecord(root: Path, **kw: Any) -> DataConf:
    base: dict[str, Any] = dict(
        name="tfrecord",
        train=str(root / "train-*.tfrecord"),
        features=dict(FEATURES),
        batch_size=8,
        shuffle_buffer=0,
    )
    base.update(kw)
    return DataConf(**base)


def _csv(root: Path, **kw: Any) -> DataConf:
    base: dict[str, Any] = dict(
        name="csv",
        train=str(root / "train-*.csv"),
        features={n: f for n, f in FEATURES.items() if n != "label"},
        batch_size=8,
        shuffle_buffer=0,
    )
    base.update(kw)
    return DataConf(**base)


def _npz(root: Path, **kw: Any) -> DataConf:
    base: dict[str, Any] = dict(
        name="npz",
        train=str(root / "train-*.npz"),
        features={"x": FeatureConf(), "k": FeatureConf()},
        batch_size=8,
        shuffle_buffer=0,
    )
    base.update(kw)
    return DataConf(**base)


SOURCES: dict[str, Callable[..., DataConf]] = {"tfrecord": _tfrecord, "csv": _csv, "npz": _npz}


def _batches(ds: tf.data.Dataset, n: int) -> list[Any]:
    it = iter(ds)
    return [next(it) for _ in range(n)]


def _labels(ds: tf.data.Dataset, n_batches: int) -> list[int]:
    return [int(v) for _, y in _batches(ds, n_batches) for v in y.numpy()]


def _one_epoch(labels: list[int]) -> list[int]:
    """The stream is a cycle (no shuffle): the labels before the first one comes back."""
    for k in range(1, len(labels)):
        if labels[k] == labels[0]:
            return labels[:k]
    raise AssertionError("the stream did not cycle within the batches read")


# ------------------------------------------------------------------------------- specs


def test_tfrecord_spec_batches_and_element_spec(files: Path) -> None:
    d = _tfrecord(files)
    spec = inputs.input_spec(d)
    assert spec.features == {
        "a": ((), "float32"),
        "b": ((), "float32"),
        "c": ((), "float32"),
        "k": ((), "int64"),
    }
    assert (spec.label, spec.label_shape, spec.label_dtype, spec.single) == (
        "label",
        (),
        "int64",
        False,
    )
    ds = inputs.train_dataset(d, 0, 1, seed=0)
    feats, label = ds.element_spec
    assert set(feats) == {"a", "b", "c", "k"}
    assert feats["a"].shape == (8,) and feats["k"].dtype == tf.int64
    assert label.shape == (8,) and label.dtype == tf.int64
    x, y = _batches(ds, 1)[0]
    assert y.numpy().tolist() == [0, 30, 60, 90, 1, 31, 61, 91]  # no shuffle: files interleaved
    np.testing.assert_allclose(x["a"].numpy(), y.numpy() * 0.5)
    np.testing.assert_array_equal(x["k"].numpy(), y.numpy() % 5)


def test_spec_read_from_the_first_record_when_the_config_leaves_it_out(files: Path) -> None:
    # no features at all: every feature of the records but the label, typed from the record
    d = _tfrecord(files, features={})
    spec = inputs.input_spec(d)
    assert spec.features == {
        "a": ((), "float32"),
        "b": ((), "float32"),
        "c": ((), "float32"),
        "k": ((), "int64"),
    }
    assert spec.label_dtype == "int64"
    # one vector feature, the label not listed: a single feature, the tensor itself
    vec = files / "vec.tfrecord"
    _write_tfrecord(vec, [{"x": [float(i)] * 4, "y": [i % 3]} for i in range(10)])
    d = DataConf(name="tfrecord", train=str(vec), features={"x": FeatureConf()}, label="y")
    spec = inputs.input_spec(d)
    assert spec.features == {"x": ((4,), "float32")} and spec.single
    assert (spec.label, spec.label_shape, spec.label_dtype) == ("y", (), "int64")
    x, y = _batches(inputs.train_dataset(d, 0, 1, 0), 1)[0]
    assert x.shape == (64, 4) and y.shape == (64,)


def test_csv_header_columns_defaults_and_delimiter(files: Path, tmp_path: Path) -> None:
    d = _csv(files)
    spec = inputs.input_spec(d)
    assert spec.features["k"] == ((), "int64") and spec.label_dtype == "int64"
    x, y = _batches(inputs.train_dataset(d, 0, 1, 0), 1)[0]
    assert set(x) == {"a", "b", "c", "k"} and "id" not in x
    assert y.numpy().tolist() == [0, 30, 60, 90, 1, 31, 61, 91]
    np.testing.assert_allclose(x["c"].numpy(), y.numpy() / 7.0, rtol=1e-6)
    # no header: data.columns names them; ';' delimiter; an empty field takes its default
    p = tmp_path / "nohead.csv"
    p.write_text("1;2.5;0\n2;;1\n3;4.0;1\n")
    d = DataConf(
        name="csv",
        train=str(p),
        header=False,
        columns=("id", "v", "label"),
        field_delim=";",
        features={"v": FeatureConf("float32", default=-1.0)},
        batch_size=3,
        shuffle_buffer=0,
    )
    (v, y) = next(iter(inputs.eval_dataset(d)))
    assert spec_single(d) and v.numpy().tolist() == [2.5, -1.0, 4.0]
    assert y.numpy().tolist() == [0, 1, 1]
    # every column but the label when data.features is empty, numbers as float32
    spec = inputs.input_spec(_csv(files, features={}))
    assert spec.features == {n: ((), "float32") for n in ("id", "a", "b", "c", "k")}


def spec_single(d: DataConf) -> bool:
    return inputs.input_spec(d).single


def test_npz_memory_maps_concatenates_and_casts(files: Path, tmp_path: Path) -> None:
    d = _npz(files)
    spec = inputs.input_spec(d)
    # float64 arrays are fed as float32, int32 as int64; shapes from the files
    assert spec.features == {"x": ((3,), "float32"), "k": ((), "int64")}
    assert spec.label_dtype == "int64"
    labels = sorted(int(v) for _, y in inputs.eval_dataset(d) for v in y.numpy())
    assert labels == list(range(N))  # 4 files concatenated; eval = the first eval_examples
    table, _, _ = _npz_table(d, inputs.resolve_files(d.train, "data.train"), "data.train")
    assert isinstance(table._part(2)["x"], np.memmap)  # np.savez: mapped, not loaded
    x, _ = next(iter(inputs.eval_dataset(d)))
    np.testing.assert_allclose(x["x"].numpy()[3], [1.5, -3.0, 3 / 7.0], rtol=1e-6)
    # np.savez_compressed cannot be mapped: read whole; a configured dtype is a cast
    np.savez_compressed(tmp_path / "z.npz", f=np.arange(12.0).reshape(6, 2), y=np.arange(6))
    d = DataConf(
        name="npz",
        train=str(tmp_path / "z.npz"),
        features={"f": FeatureConf("float64")},
        label="y",
        batch_size=4,
    )
    assert inputs.input_spec(d).features == {"f": ((2,), "float64")}
    f, y = next(iter(inputs.eval_dataset(d)))
    assert f.dtype == tf.float64 and f.numpy().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_in_memory_sets_move_onto_the_pipeline() -> None:
    d = DataConf(name="digits", batch_size=32, shuffle_buffer=0)
    spec = inputs.input_spec(d)
    assert spec.features == {"x": ((64,), "float32")} and spec.single
    assert (spec.label, spec.label_shape, spec.label_dtype) == ("label", (), "int64")
    assert inputs.sharding(d, 3) == "record"
    ds = datasets.load(d)
    for i in range(3):  # replica i's examples are recipes.datasets.shard's, in order
        x_sh, y_sh = datasets.shard(ds.x_train, ds.y_train, i, 3)
        got_x, got_y = zip(*_batches(inputs.train_dataset(d, i, 3, 0), 5), strict=True)
        gx, gy = (
            np.concatenate([t.numpy() for t in got_x]),
            np.concatenate([t.numpy() for t in got_y]),
        )
        np.testing.assert_array_equal(gx, x_sh[:160])
        np.testing.assert_array_equal(gy, y_sh[:160])
    ev = list(inputs.eval_dataset(d))
    np.testing.assert_array_equal(np.concatenate([x.numpy() for x, _ in ev]), ds.x_eval)
    assert sum(len(y) for _, y in inputs.eval_dataset(d, max_examples=70)) == 70
    # shuffled: a fresh seeded permutation each epoch, full batches
    shuffled = _batches(inputs.train_dataset(DataConf(name="digits", batch_size=32), 0, 1, 5), 3)
    assert all(x.shape == (32, 64) for x, _ in shuffled)


# ----------------------------------------------------------------------------- sharding


@pytest.mark.parametrize("source", ["tfrecord", "csv", "npz"])
@pytest.mark.parametrize(
    ("shard", "num_shards"), [("file", 2), ("file", 4), ("record", 3), ("auto", 5)]
)
def test_shards_are_disjoint_and_cover_the_set(
    files: Path, source: str, shard: str, num_shards: int
) -> None:
    d = SOURCES[source](files, shard=shard)
    mode = inputs.sharding(d, num_shards)
    assert mode == ("record" if shard == "auto" and num_shards > N_FILES else shard)
    parts = []
    for i in range(num_shards):
        ds = inputs.train_dataset(d, i, num_shards, seed=i)
        epoch = _one_epoch(_labels(ds, 2 * N // num_shards // 8 + 4))
        assert len(epoch) == len(set(epoch))  # nothing twice within an epoch
        parts.append(set(epoch))
    assert sum(len(p) for p in parts) == N and set().union(*parts) == set(range(N))
    assert max(map(len, parts)) - min(map(len, parts)) <= (PER_FILE if mode == "file" else 1)


def test_sharding_choice_and_reason(files: Path) -> None:
    d = _tfrecord(files)
    assert inputs.sharding(d, 4) == "file" and inputs.sharding(d, 5) == "record"
    assert "4 files for 2 workers (2 each)" in inputs.sharding_reason(d, 2)
    assert "fewer files than workers" in inputs.sharding_reason(d, 5)
    assert inputs.sharding(_tfrecord(files, shard="record"), 2) == "record"
    with pytest.raises(InputError, match=r"^data\.shard=file: data\.train has 4 files for 6"):
        inputs.sharding(_tfrecord(files, shard="file"), 6)
    with pytest.raises(InputError, match=r"^data\.shard='rows': use auto, file, record or none"):
        inputs.sharding(_tfrecord(files, shard="rows"), 2)
    assert inputs.sharding(_tfrecord(files, shard="none"), 4) == "none"
    assert "each of 4 workers reads all of it" in inputs.sharding_reason(
        _tfrecord(files, shard="none"), 4
    )
    with pytest.raises(InputError, match=r"^data\.shard=file: data\.name=digits"):
        inputs.sharding(DataConf(name="digits", shard="file"), 2)


@pytest.mark.parametrize("source", ["tfrecord", "csv", "npz", "digits"])
def test_shuffle_is_seeded(files: Path, source: str) -> None:
    if source == "digits":
        d = DataConf(name="digits", batch_size=8, shuffle_buffer=100)
    else:
        d = SOURCES[source](files, shuffle_buffer=50)

    def first(seed: int) -> list[int]:
        return _labels(inputs.train_dataset(d, 0, 2, seed), 6)

    a = first(1)
    assert a == first(1) and a != first(2)
    assert a != sorted(a)


def test_eval_is_finite_ordered_and_unsharded(files: Path) -> None:
    d = _tfrecord(files, eval=str(files / "eval.tfrecord"), shuffle_buffer=1000)
    labels = [int(v) for _, y in inputs.eval_dataset(d) for v in y.numpy()]
    assert labels == list(range(1000, 1025))  # every record, in file order, then the end
    assert [len(y) for _, y in inputs.eval_dataset(d)] == [8, 8, 8, 1]
    assert sum(len(y) for _, y in inputs.eval_dataset(d, max_examples=10)) == 10
    # scored in larger batches (recipes/evaluator.py): the same records, in the same order
    wide = inputs.eval_dataset(d, min_batch=16)
    assert [len(y) for _, y in wide] == [16, 9]
    assert [int(v) for _, y in wide for v in y.numpy()] == labels
    assert [len(y) for _, y in inputs.train_sample_dataset(d, 20, min_batch=16)] == [16, 4]
    # no data.eval: the first eval_examples records of the train files, and said so
    d = _tfrecord(files, eval_examples=50)
    assert [int(v) for _, y in inputs.eval_dataset(d) for v in y.numpy()] == list(range(50))
    assert "first 50 records of data.train" in inputs.eval_source(d)
    for make in (_csv, _npz):
        d = make(files, eval_examples=20)
        assert [int(v) for _, y in inputs.eval_dataset(d) for v in y.numpy()] == list(range(20))


def test_compressed_tfrecord(tmp_path: Path) -> None:
    for comp in ("GZIP", "ZLIB"):
        p = tmp_path / f"z-{comp}.tfrecord"
        _write_tfrecord(p, [_row(i) for i in range(10)], comp)
        d = _tfrecord(tmp_path, train=str(p), compression=comp)
        assert inputs.input_spec(d).features["k"] == ((), "int64")
        assert [int(v) for _, y in inputs.eval_dataset(d) for v in y.numpy()] == list(range(10))
        with pytest.raises(InputError, match=r"data\.train: .*not a TFRecord file .*compression"):
            inputs.train_dataset(_tfrecord(tmp_path, train=str(p)), 0, 1, 0)


# ------------------------------------------------------------------------------ factory

FACTORY = """
import tensorflow as tf

CALLS = []


def make(split, shard_index, num_shards, batch_size, seed, scale=1.0):
    CALLS.append((split, shard_index, num_shards, batch_size, seed, scale))
    n = 40 if split == "train" else 10
    x = tf.data.Dataset.range(n).shard(num_shards, shard_index)
    ds = x.map(lambda i: ({"f": tf.cast(i, tf.float32) * scale}, i))
    return ds.batch(batch_size)


def single(split, shard_index, num_shards, batch_size, seed):
    return tf.data.Dataset.range(12).map(lambda i: (tf.fill([3], tf.cast(i, tf.float32)), i)).batch(batch_size)


def unbatched(split, shard_index, num_shards, batch_size, seed):
    return tf.data.Dataset.range(12).map(lambda i: (tf.cast(i, tf.float32), i))


def triples(split, shard_index, num_shards, batch_size, seed):
    return tf.data.Dataset.range(12).map(lambda i: (i, i, i)).batch(2)


def not_a_dataset(split, shard_index, num_shards, batch_size, seed):
    return [1, 2, 3]


def two_args(split, batch_size):
    return None


NOT_CALLABLE = 3
"""


@pytest.fixture()
def factory_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pkg = tmp_path / "userfac"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "data.py").write_text(FACTORY)
    (pkg / "broken.py").write_text("import not_a_real_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("userfac")]:
        monkeypatch.delitem(sys.modules, name)
    return "userfac.data"


def test_factory(factory_pkg: str) -> None:
    d = DataConf(name="factory", target=f"{factory_pkg}.make", kwargs={"scale": 2.0}, batch_size=4)
    spec = inputs.input_spec(d)
    assert spec.features == {"f": ((), "float32")} and not spec.single
    assert inputs.sharding(d, 3) == "factory"
    ds = inputs.train_dataset(d, 1, 2, seed=7)
    ys = _labels(ds, 8)  # repeated forever: 20 examples in this shard, 5 batches an epoch
    assert ys[:20] == list(range(1, 40, 2)) and ys[20:24] == [1, 3, 5, 7]
    x, _ = _batches(ds, 1)[0]
    assert x["f"].numpy().tolist() == [2.0, 6.0, 10.0, 14.0]
    calls = sys.modules[factory_pkg].CALLS
    assert ("train", 1, 2, 4, 7, 2.0) in calls
    ev = list(inputs.eval_dataset(d))
    assert sum(len(y) for _, y in ev) == 10
    assert [int(v) for _, y in inputs.eval_dataset(d, max_examples=5) for v in y.numpy()] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert ("eval", 0, 1, 4, 0, 2.0) in calls
    assert inputs.check(d) == spec
    single = DataConf(target=f"{factory_pkg}.single", batch_size=4)
    spec = inputs.input_spec(single)
    assert spec.single and spec.features == {"x": ((3,), "float32")}


@pytest.mark.parametrize(
    ("target", "pattern"),
    [
        (
            "nopkg_xyz.data.make",
            r"^data\._target_=nopkg_xyz\.data\.make: cannot import nopkg_xyz .*recipe\.code_dir",
        ),
        (
            "userfac.broken.make",
            r"^data\._target_=userfac\.broken\.make: importing userfac\.broken failed: No module named 'not_a_real_module_xyz'",
        ),
        (
            "userfac.data.nothing",
            r"^data\._target_=userfac\.data\.nothing: userfac\.data has no attribute 'nothing'",
        ),
        (
            "userfac.data.NOT_CALLABLE",
            r"^data\._target_=userfac\.data\.NOT_CALLABLE is a int, not a function",
        ),
        (
            "userfac.data.not_a_dataset",
            r"^data\._target_=userfac\.data\.not_a_dataset\(split='train'\) returned a list, not a tf\.data\.Dataset",
        ),
        (
            "userfac.data.triples",
            r"^data\._target_=userfac\.data\.triples\(split='train'\) yields .* not \(features, label\) pairs",
        ),
        (
            "userfac.data.unbatched",
            r"^data\._target_=userfac\.data\.unbatched\(split='train'\) yields unbatched examples",
        ),
        (
            "userfac.data.two_args",
            r"^data\._target_=userfac\.data\.two_args cannot be called with split, shard_index",
        ),
        ("make", r"^data\._target_='make' is not a dotted path to a function: use my_pkg"),
    ],
)
def test_factory_errors(factory_pkg: str, target: str, pattern: str) -> None:
    d = DataConf(name="factory", target=target)
    # a function that cannot be imported is a TargetError (recipes.targets, as for every
    # _target_); one that does not return batched (features, label) pairs an InputError
    with pytest.raises((TargetError, InputError), match=pattern) as e:
        inputs.train_dataset(d, 0, 1, 0)
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match=r"data\._target_ is not set"):
        inputs.input_spec(DataConf(name="factory"))


# ---------------------------------------------------------------------------- graph mode


def _graph_batches(make: Callable[[], tf.data.Dataset], n: int) -> list[Any]:
    with tf.Graph().as_default():
        iterator = v1.data.make_initializable_iterator(make())
        element = iterator.get_next()
        with v1.Session() as sess:
            sess.run(iterator.initializer, inputs.graph_feeds() or None)
            return [sess.run(element) for _ in range(n)]


@pytest.mark.parametrize("source", ["tfrecord", "csv", "npz", "digits"])
def test_graph_mode_initializable_iterator(files: Path, source: str) -> None:
    if source == "digits":
        d = DataConf(name="digits", batch_size=8, shuffle_buffer=0)
    else:
        d = SOURCES[source](files, shard="record")
    eager = _batches(inputs.train_dataset(d, 1, 3, seed=3), 3)
    graph = _graph_batches(lambda: inputs.train_dataset(d, 1, 3, seed=3), 3)
    for (ex, ey), (gx, gy) in zip(eager, graph, strict=True):
        np.testing.assert_array_equal(ey.numpy(), gy)
        if isinstance(ex, dict):
            assert set(ex) == set(gx)
            for k in ex:
                np.testing.assert_array_equal(ex[k].numpy(), gx[k])
        else:
            np.testing.assert_array_equal(ex.numpy(), gx)
    ev = _graph_batches(lambda: inputs.eval_dataset(d, max_examples=16), 2)
    assert [len(y) for _, y in ev] == [8, 8]


def test_graph_mode_keeps_in_memory_data_out_of_the_graph() -> None:
    d = DataConf(name="digits", batch_size=8)
    with tf.Graph().as_default() as g:
        v1.data.make_initializable_iterator(inputs.train_dataset(d, 0, 2, 0)).get_next()
        size = len(g.as_graph_def().SerializeToString())
        fed = inputs.graph_feeds()
    assert size < 100_000  # the 1437 x 64 float32 training set would be 368 KB
    # the shard (every other example) is fed once, at the iterator's initialisation
    assert sorted(rows.shape for rows in fed.values()) == [(719,), (719, 64)]


GRAPH_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
from recipes import inputs
from recipes.config import DataConf, FeatureConf
root = sys.argv[1]
confs = {
    "tfrecord": DataConf(name="tfrecord", train=root + "/train-*.tfrecord", batch_size=4,
                         features={"a": FeatureConf("float32"), "label": FeatureConf("int64")}),
    "csv": DataConf(name="csv", train=root + "/train-*.csv", batch_size=4, features={"a": None}),
    "npz": DataConf(name="npz", train=root + "/train-*.npz", batch_size=4, features=["x"]),
    "digits": DataConf(name="digits", batch_size=4),
    "factory": DataConf(name="factory", target="userfac.data.make", batch_size=4),
}
for name, d in confs.items():
    spec = inputs.check(d)
    it = tf.compat.v1.data.make_initializable_iterator(inputs.train_dataset(d, 0, 2, 1))
    x, y = it.get_next()
    ex, ey = tf.compat.v1.data.make_one_shot_iterator(inputs.eval_dataset(d, 6)).get_next()
    with tf.compat.v1.Session() as s:
        s.run(it.initializer, inputs.graph_feeds() or None)
        a, b = s.run([x, y])
        seen = 0
        try:
            while True:
                seen += len(s.run(ey))
        except tf.errors.OutOfRangeError:
            pass
    shape = a.shape if spec.single else a[next(iter(spec.features))].shape
    print(name, spec.single, shape, b.shape, seen)
"""


def test_tf1_graph_mode_in_a_subprocess(files: Path, factory_pkg: str, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    r = subprocess.run(
        [sys.executable, "-c", GRAPH_SCRIPT, str(files)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert lines == {
        "tfrecord": "True (4,) (4,) 6",
        "csv": "True (4,) (4,) 6",
        "npz": "True (4, 3) (4,) 6",
        "digits": "True (4, 64) (4,) 6",
        "factory": "False (4,) (4,) 6",
    }


# ----------------------------------------------------------------------------- bad input


def test_bad_paths_name_the_key(
    files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(inputs.DATA_ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        InputError,
        match=r"^data\.train='x/\*\.tfrecord' matches no file: check the path \(relative paths are relative to the current directory",
    ) as e:
        inputs.train_dataset(_tfrecord(files, train="x/*.tfrecord"), 0, 1, 0)
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match=r"^data\.eval='missing\.tfrecord': no such file"):
        inputs.eval_dataset(_tfrecord(files, eval="missing.tfrecord"))
    with pytest.raises(InputError, match=r"^data\.train='.*' is a folder: name its files"):
        inputs.input_spec(_csv(files, train=str(files)))
    with pytest.raises(InputError, match=r"^data\.train is not set"):
        inputs.train_dataset(DataConf(name="csv"), 0, 1, 0)
    # relative to TFPLAN_DATA_ROOT when set
    monkeypatch.setenv(inputs.DATA_ROOT_ENV, str(files))
    got = inputs.resolve_files(["train-1.tfrecord", "train-*.tfrecord"], "data.train")
    assert got == sorted(str(files / f"train-{s}.tfrecord") for s in range(N_FILES))
    with pytest.raises(InputError, match=rf"relative to {inputs.DATA_ROOT_ENV}={files}"):
        inputs.resolve_files("nope-*.csv", "data.train")
    with pytest.raises(InputError, match=r"^data\.name='parquet' is not a data source"):
        inputs.input_spec(DataConf(name="parquet"))


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        (
            {"z": FeatureConf("float32")},
            r"^data\.features\.z: the records have no feature 'z' \(e\.g\. train-0\.tfrecord; they have: a, b, c, k, label\)",
        ),
        (
            {"k": FeatureConf("float32")},
            r"^data\.features\.k\.dtype=float32: the records hold int64 values for 'k' .*set data\.features\.k\.dtype=int64",
        ),
        (
            {"a": FeatureConf("float32", (4,))},
            r"^data\.features\.a\.shape=\[4\]: the records hold 1 values for 'a' .*set data\.features\.a\.shape=\[1\]",
        ),
        (
            {"a": FeatureConf("float64")},
            r"^data\.features\.a\.dtype=float64: use one of float32, int64, string",
        ),
    ],
)
def test_tfrecord_spec_mismatch(files: Path, change: dict[str, FeatureConf], pattern: str) -> None:
    d = _tfrecord(files, features={**FEATURES, **change})
    for call in (inputs.check, lambda d: inputs.train_dataset(d, 0, 1, 0), inputs.eval_dataset):
        with pytest.raises(InputError, match=pattern) as e:
            call(d)
        assert "\n" not in str(e.value)


def test_absent_label_names_data_label(files: Path) -> None:
    for d in (
        _tfrecord(files, label="target"),
        _tfrecord(files, features={"a": FeatureConf()}, label="target"),
    ):
        with pytest.raises(
            InputError, match=r"^data\.label='target': the records have no feature 'target'"
        ):
            inputs.train_dataset(d, 0, 1, 0)
    with pytest.raises(
        InputError,
        match=r"^data\.label='target' is not a column of the header of train-0\.csv \(columns: id, a, b, c, k, label\)",
    ):
        inputs.check(_csv(files, label="target"))
    with pytest.raises(
        InputError,
        match=r"^data\.label='target': train-0\.npz has no array 'target' \(it has: x, k, label\)",
    ):
        inputs.check(_npz(files, label="target"))


def test_csv_bad_input(files: Path, tmp_path: Path) -> None:
    with pytest.raises(
        InputError, match=r"^data\.features\.zz is not a column of the header of train-0\.csv"
    ):
        inputs.train_dataset(_csv(files, features={"zz": FeatureConf()}), 0, 1, 0)
    p = tmp_path / "s.csv"
    p.write_text("name,v,label\nalice,1,0\nbob,2,1\n")
    with pytest.raises(
        InputError,
        match=r"^data\.features\.name\.dtype=float32: column 'name' holds 'alice' .*set data\.features\.name\.dtype=string",
    ):
        inputs.check(DataConf(name="csv", train=str(p), features={"name": FeatureConf("float32")}))
    with pytest.raises(InputError, match=r"^data\.columns is empty and data\.header=false"):
        inputs.input_spec(DataConf(name="csv", train=str(p), header=False))
    with pytest.raises(
        InputError, match=r"^data\.features\.v\.shape=\[2\]: a csv column holds one value"
    ):
        inputs.input_spec(
            DataConf(name="csv", train=str(p), features={"v": FeatureConf(shape=(2,))})
        )
    with pytest.raises(
        InputError,
        match=r"^data\.field_delim: the first record of s\.csv has 1 fields but there are 3",
    ):
        inputs.input_spec(
            DataConf(
                name="csv", train=str(p), header=False, columns=("a", "b", "label"), field_delim=";"
            )
        )
    # a bad field further down: found by TensorFlow, explained with the column's name
    q = tmp_path / "late.csv"
    q.write_text("v,label\n" + "".join(f"{i},{i % 2}\n" for i in range(5)) + "oops,1\n")
    d = DataConf(name="csv", train=str(q), features={"v": FeatureConf("int64")}, batch_size=8)
    with pytest.raises(
        InputError,
        match=r"^data\.features\.v\.dtype=int64: a record holds 'oops' in column 'v', which does not parse as int64: set data\.features\.v\.dtype=float32",
    ):
        inputs.check(d)
    r = tmp_path / "empty-late.csv"
    r.write_text("v,label\n1,0\n,1\n")
    d = DataConf(name="csv", train=str(r), features={"v": FeatureConf("float32")}, batch_size=8)
    with pytest.raises(
        InputError,
        match=r"^data\.features\.v: a record has an empty field 'v': give data\.features\.v\.default",
    ):
        inputs.check(d)


def test_a_bad_record_after_the_first_is_explained(files: Path, tmp_path: Path) -> None:
    p = tmp_path / "late.tfrecord"
    rows = [_row(i) for i in range(5)]
    rows.append({"a": 1.0, "label": 9})  # lacks b, c, k
    _write_tfrecord(p, rows)
    d = _tfrecord(files, train=str(p))
    with pytest.raises(
        InputError,
        match=r"^data\.features\.[bck]: a record has no feature '[bck]': give data\.features\.[bck]\.default",
    ):
        inputs.check(d)
    # with defaults the same records read fine
    feats = {**FEATURES, **{n: FeatureConf(FEATURES[n].dtype, (), 0) for n in "bck"}}
    assert inputs.check(_tfrecord(files, train=str(p), features=feats)).features["k"] == (
        (),
        "int64",
    )
    # explain_error on TensorFlow's own messages
    try:
        tf.io.parse_example(
            [_example({"a": [1.0, 2.0], "label": 1})], {"a": tf.io.FixedLenFeature([], tf.float32)}
        )
    except tf.errors.InvalidArgumentError as e:
        err = inputs.explain_error(e, _tfrecord(files))
    assert str(err).startswith("data.features.a.shape=[]: a record holds 2 values for 'a'")
    q = tmp_path / "garbage.tfrecord"
    q.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00" + b"\x00" * 30)
    with pytest.raises(
        InputError,
        match=r"^data\.train: the records of .*garbage\.tfrecord are not tf\.Example protos",
    ):
        inputs.check(_tfrecord(files, train=str(q)))


def test_npz_bad_input(files: Path, tmp_path: Path) -> None:
    with pytest.raises(
        InputError,
        match=r"^data\.features\.w: train-0\.npz has no array 'w' \(it has: x, k, label\)",
    ):
        inputs.input_spec(_npz(files, features={"w": FeatureConf()}))
    with pytest.raises(
        InputError,
        match=r"^data\.features\.x\.shape=\[4\]: train-0\.npz holds 'x' examples of shape \[3\]",
    ):
        inputs.input_spec(_npz(files, features={"x": FeatureConf(shape=(4,))}))
    np.savez(tmp_path / "r.npz", x=np.zeros((3, 2)), label=np.zeros(4))
    with pytest.raises(
        InputError, match=r"^data\.train: the arrays of r\.npz have different numbers of rows"
    ):
        inputs.input_spec(DataConf(name="npz", train=str(tmp_path / "r.npz")))
    (tmp_path / "t.npz").write_text("not a zip")
    with pytest.raises(InputError, match=r"^data\.train: .*t\.npz is not an \.npz file"):
        inputs.input_spec(DataConf(name="npz", train=str(tmp_path / "t.npz")))


# ------------------------------------------------------------------------------ streaming


def test_tfrecord_streams_reading_only_the_files_it_needs(tmp_path: Path) -> None:
    """40 files; after the pipeline is built, the last 20 are deleted: reading a few batches
    must not touch them (no cache, no full read, at most INTERLEAVE_FILES files open at once,
    plus the interleave's look-ahead)."""
    paths = []
    for s in range(40):
        p = tmp_path / f"part-{s:02d}.tfrecord"
        _write_tfrecord(p, [_row(s * 50 + i) for i in range(50)])
        paths.append(p)
    assert inputs.INTERLEAVE_FILES * 2 <= 20
    for shard in ("file", "record"):
        d = _tfrecord(tmp_path, train=str(tmp_path / "part-*.tfrecord"), shard=shard)
        ds = inputs.train_dataset(d, 0, 1, seed=0)
        hidden = [p.rename(p.with_suffix(".gone")) for p in paths[20:]]
        try:
            labels = _labels(ds, 5)
        finally:
            for h, p in zip(hidden, paths[20:], strict=True):
                h.rename(p)
        assert len(labels) == 40 and max(labels) < 20 * 50
    # the same files with a shard over every one of them: all 40 are listed, none loaded
    assert inputs.sharding_reason(d, 2).startswith("by record (data.shard=record): 40 file(s)")


def test_no_tensorflow_needed_for_plan_time_checks(files: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from recipes import inputs
        from recipes.config import DataConf
        from recipes.errors import TargetError
        d = DataConf(name="csv", train={str(files / "train-*.csv")!r}, features={{"a": None}})
        inputs.check_static(d)
        print(inputs.sharding_reason(d, 2))
        try:
            inputs.check_static(DataConf(name="npz", train={str(files / "train-*.npz")!r}, label="nope"))
        except inputs.InputError as e:
            print(e)
        try:
            inputs.check_static(DataConf(name="factory", target="nopkg_xyz.make"))
        except TargetError as e:
            print(e)
        assert "tensorflow" not in sys.modules
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.splitlines()
    assert out[0] == "by file: 4 files for 2 workers (2 each)"
    assert out[1].startswith("data.label='nope': train-0.npz has no array 'nope'")
    assert out[2].startswith("data._target_=nopkg_xyz.make: cannot find the module nopkg_xyz")


def test_check_static_finds_the_factory_in_the_code_dir(tmp_path: Path) -> None:
    """The planner passes recipe.code_dir: the user's package is found there without being on
    sys.path (tfplan ships it to the tasks), and is not imported."""
    pkg = tmp_path / "code" / "codedir_pkg_xyz"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('imported at plan time')\n")
    d = DataConf(name="factory", target="codedir_pkg_xyz.data.make")
    inputs.check_static(d, search_path=[str(tmp_path / "code")])
    assert "codedir_pkg_xyz" not in sys.modules
    with pytest.raises(TargetError, match=r"cannot find the module codedir_pkg_xyz: .*code_dir"):
        inputs.check_static(d)


def test_the_file_module_imports_neither_tensorflow_nor_numpy() -> None:
    """recipes.inputs.files is what the planner runs (globs, sharding): its module-level imports
    stay light, TensorFlow's file systems are imported only for a path with a scheme."""
    import ast

    tree = ast.parse((REPO / "recipes" / "inputs" / "files.py").read_text())
    top = {
        name.split(".")[0]
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
    }
    assert not top & {"tensorflow", "numpy"}, top


# -------------------------------------------------------------------------------- config


def test_run_config_parses_the_new_data_keys(tmp_path: Path) -> None:
    raw = {
        "output_dir": str(tmp_path / "out"),
        "data": {
            "name": "tfrecord",
            "batch_size": 32,
            "train": "shards/train-*.tfrecord",
            "eval": ["shards/eval-0.tfrecord", "shards/eval-1.tfrecord"],
            "eval_examples": 500,
            "features": {
                "x": {"dtype": "float32", "shape": [8], "default": None},
                "label": {"dtype": "int64", "shape": []},
                "w": "string",
            },
            "label": "label",
            "header": False,
            "columns": ["x", "label"],
            "field_delim": "\t",
            "compression": "GZIP",
            "shuffle_buffer": 0,
            "shard": "file",
            "prefetch": 2,
            "_target_": None,
            "kwargs": {},
            "unknown_key": 3,
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    d = load_run_config(str(path)).data
    assert d.train == ("shards/train-*.tfrecord",)
    assert d.eval == ("shards/eval-0.tfrecord", "shards/eval-1.tfrecord")
    assert d.features == {
        "x": FeatureConf("float32", (8,), None),
        "label": FeatureConf("int64", ()),
        "w": FeatureConf("string"),
    }
    assert (d.eval_examples, d.header, d.columns, d.field_delim, d.compression) == (
        500,
        False,
        ("x", "label"),
        "\t",
        "GZIP",
    )
    assert (d.shuffle_buffer, d.shard, d.prefetch, d.target, d.batch_size) == (
        0,
        "file",
        2,
        None,
        32,
    )
    raw["data"] = {"name": "factory", "_target_": "pkg.data.make", "kwargs": {"rows": 5}}
    path.write_text(yaml.safe_dump(raw))
    d = load_run_config(str(path)).data
    assert d.target == "pkg.data.make" and d.kwargs == {"rows": 5}
    # defaults: the old keys unchanged, the new ones as documented
    raw["data"] = {"name": "digits"}
    path.write_text(yaml.safe_dump(raw))
    d = load_run_config(str(path)).data
    assert d == DataConf(name="digits")
    assert (d.batch_size, d.eval_fraction, d.seed, d.image_size) == (64, 0.2, 0, 8)
    assert (d.train, d.eval, d.eval_examples, d.label, d.header, d.field_delim) == (
        (),
        (),
        10000,
        "label",
        True,
        ",",
    )
    assert (d.shuffle_buffer, d.shard, d.prefetch, d.compression, d.target) == (
        10000,
        "auto",
        -1,
        None,
        None,
    )


def test_gzip_csv(tmp_path: Path) -> None:
    p = tmp_path / "g.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write("v,label\n" + "".join(f"{i},{i}\n" for i in range(6)))
    d = DataConf(name="csv", train=str(p), compression="GZIP", batch_size=4)
    assert inputs.check(d).features == {"v": ((), "float32")}
    assert [int(v) for _, y in inputs.eval_dataset(d) for v in y.numpy()] == list(range(6))


@pytest.mark.parametrize("source", ["npz", "digits"])
def test_built_inside_a_tf_function_needs_no_python(files: Path, source: str) -> None:
    """ParameterServerStrategy traces the dataset_fn and runs it on remote workers, where no
    Python function exists: the rows become tensors there, in the same order as eagerly."""
    d = _npz(files, shuffle_buffer=10) if source == "npz" else DataConf(name="digits", batch_size=8)

    @tf.function  # autograph on, as create_per_worker_dataset wraps a dataset_fn
    def first_labels() -> tf.Tensor:
        return inputs.train_dataset(d, 1, 2, seed=4).take(1).get_single_element()[1]

    graph = first_labels.get_concrete_function().graph.as_graph_def()
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    assert not ops & {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
    eager = _batches(inputs.train_dataset(d, 1, 2, seed=4), 1)[0][1]
    np.testing.assert_array_equal(first_labels().numpy(), eager.numpy())


def test_input_error_is_a_data_error() -> None:
    assert issubclass(InputError, datasets.DataError)
    assert InputError is errors.InputError and datasets.DataError is errors.DataError


def test_a_scoring_batch_holds_up_to_1024_examples_and_4_mib_of_inputs() -> None:
    from recipes.evaluator import scoring_batch

    tabular = {"num": ((4,), "float32"), "cat": ((), "int64"), "city": ((), "string")}
    assert scoring_batch(tabular) == 1024
    assert scoring_batch({"image": ((224, 224, 3), "float32")}) == 6  # 588 KiB each
    assert scoring_batch({"video": ((64, 512, 512, 3), "float32")}) == 1
