"""The pipelines over rows held as arrays (npz files and the in-memory sets): which rows a
worker reads, in which order, and how they reach TensorFlow.

Positions are computed in the graph (a seeded permutation per epoch) and the rows gathered per
batch, so that no Python runs per example; how the rows get into the graph depends on where the
dataset is built (:func:`_array_mode`). Under TF1 an in-memory shard is fed once, through
placeholders, when the iterator is initialised (:func:`graph_feeds`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from recipes.errors import InputError
from recipes.inputs.lazy import _plain, _tf
from recipes.inputs.npz import _Columns
from recipes.inputs.specs import _Feat, _structure


def _array_mode(lazy: bool) -> str:
    """``py``: rows fed per batch by tf.numpy_function (nothing in the graph); ``tensor``: this
    shard's rows as tensors (portable to remote workers, and no GIL in the gathers)."""
    tf = _tf()
    if not tf.compat.v1.executing_eagerly_outside_functions():
        return "py"  # TF1 graph: keep the data out of the GraphDef and checkpoint .meta files
    if lazy and tf.executing_eagerly():
        return "py"  # TF2, built eagerly here: the rows stay on disk
    return "tensor"  # traced by a tf.function (e.g. PSS's dataset_fn, run on remote workers)


def _array_fetch(
    table: _Columns, rows: np.ndarray, feats: dict[str, _Feat], label: _Feat, lazy: bool
) -> Callable[[Any], Any]:
    tf = _tf()
    names = [*feats, label.name]
    to_pair = _structure(list(feats), label.name)
    shapes = [table.shapes[n] for n in names]
    tf_dtypes = [tf.as_dtype(table.dtypes[n]) for n in names]
    if _array_mode(lazy) == "tensor":
        consts = [tf.constant(c) for c in table.take(rows)]

        def fetch(pos: Any) -> Any:
            return to_pair(*[tf.gather(c, pos) for c in consts])

        return _plain(fetch)

    def take(pos: np.ndarray) -> list[np.ndarray]:
        return table.take(rows[pos])

    def fetch_py(pos: Any) -> Any:
        cols = tf.numpy_function(take, [pos], tf_dtypes, stateful=False)
        for c, shape in zip(cols, shapes, strict=True):
            c.set_shape(pos.shape.concatenate(shape))
        return to_pair(*cols)

    return _plain(fetch_py)


def _array_train(
    table: _Columns,
    rows: np.ndarray,
    feats: dict[str, _Feat],
    label: _Feat,
    batch: int,
    seed: int,
    shuffle: bool,
    lazy: bool,
    key: str,
) -> Any:
    tf = _tf()
    n = len(rows)
    if n == 0:
        raise InputError(
            f"{key}: this worker's shard holds no example (too few examples for the workers)"
        )
    fetch = _array_fetch(table, rows, feats, label, lazy)
    counter = (
        tf.data.Dataset.counter()
        if hasattr(tf.data.Dataset, "counter")
        else tf.data.Dataset.range(2**62)
    )
    if shuffle:
        reps = -(-batch // n)  # permutations per "epoch", so that one holds a full batch
        per = reps * n // batch
        seed_t = tf.constant(seed, tf.int64)

        def epoch(e: Any) -> Any:
            keys = tf.random.stateless_uniform([reps, n], seed=tf.stack([seed_t, e]))
            order = tf.cast(tf.reshape(tf.argsort(keys, axis=1), [-1]), tf.int64)
            # the epoch's last partial batch is dropped; the next epoch's order differs
            return tf.data.Dataset.from_tensor_slices(
                tf.reshape(order[: per * batch], [per, batch])
            )

        positions = counter.flat_map(_plain(epoch))
    else:
        offsets = tf.range(batch, dtype=tf.int64)
        positions = counter.map(_plain(lambda k: (k * batch + offsets) % n))  # a cycle: all used
    return positions.map(fetch)


FEEDS_COLLECTION = "recipes_input_feeds"


def _fed_train(
    table: _Columns,
    rows: np.ndarray,
    feats: dict[str, _Feat],
    label: _Feat,
    batch: int,
    seed: int,
    shuffle: bool,
) -> Any:
    """TF1 graph mode, an in-memory shard: ``from_tensor_slices`` of placeholders that the
    iterator's initialiser is fed with (:func:`graph_feeds`). The rows stay out of the GraphDef
    (and so of every checkpoint's ``.meta``) and every batch is cut in C++: no Python per batch
    (measured 1.1x the old ``feed_dict`` loop where ``numpy_function`` per batch was 0.78x:
    docs/bench_inputs.md)."""
    tf = _tf()
    v1 = tf.compat.v1
    if len(rows) == 0:
        raise InputError("data.name: this worker's shard holds no example (too few examples)")
    names = [*feats, label.name]
    cols = table.take(rows)
    graph = v1.get_default_graph()
    placeholders = []
    for name, col in zip(names, cols, strict=True):
        ph = v1.placeholder(tf.as_dtype(col.dtype), col.shape, name=f"input_rows_{name}")
        graph.add_to_collection(FEEDS_COLLECTION, (ph, col))
        placeholders.append(ph)
    to_pair = _structure(list(feats), label.name)
    ds = tf.data.Dataset.from_tensor_slices(tuple(placeholders))
    if shuffle:
        ds = ds.shuffle(len(rows), seed=seed, reshuffle_each_iteration=True)
    return ds.repeat().batch(batch, drop_remainder=True).map(_plain(to_pair))


def graph_feeds(graph: Any = None) -> dict[Any, np.ndarray]:
    """What the initialisers of this graph's training iterators must be fed (TF1 graph mode,
    in-memory sets): ``{placeholder: rows}``; empty when there is nothing to feed."""
    graph = graph or _tf().compat.v1.get_default_graph()
    return {ph: rows for ph, rows in graph.get_collection(FEEDS_COLLECTION)}


def _array_eval(
    table: _Columns, rows: np.ndarray, feats: dict[str, _Feat], label: _Feat, batch: int, lazy: bool
) -> Any:
    tf = _tf()
    n = len(rows)
    fetch = _array_fetch(table, rows, feats, label, lazy)
    starts = tf.data.Dataset.range(0, n, batch)
    return starts.map(_plain(lambda s: tf.range(s, tf.minimum(s + batch, n)))).map(fetch)
