"""The datasets themselves: :func:`input_spec`, :func:`train_dataset`, :func:`eval_dataset`,
:func:`train_sample_dataset`, whatever the source.

Each source module resolves its features and reads its files; this one puts the pieces of every
source together the same way (this worker's shard, shuffling, repetition, batching, prefetching)
so that a model sees the same batches from a tfrecord, a csv, an npz or an in-memory set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from recipes.config import DataConf
from recipes.errors import InputError
from recipes.inputs.arrays import _array_eval, _array_mode, _array_train, _fed_train
from recipes.inputs.csv_files import _csv_pair, _csv_plan, _csv_reader
from recipes.inputs.factory import _call_factory, _factory_spec
from recipes.inputs.files import _eval_files, _sharding, _train_files, source_kind
from recipes.inputs.lazy import _plain_python, _tf
from recipes.inputs.memory import _memory_feats, _memory_set, _memory_table
from recipes.inputs.npz import _npz_table
from recipes.inputs.peek import _check_compression
from recipes.inputs.specs import InputSpec, _finish_spec, _from_dict
from recipes.inputs.tfrecord import _parse_spec, _tfrecord_feats, _tfrecord_reader

if TYPE_CHECKING:
    import tensorflow as tf

INTERLEAVE_FILES = 8  # files read at once by one worker when sharding by file


@_plain_python
def input_spec(data: DataConf) -> InputSpec:
    """The features and label the datasets yield, from the config alone, or from a peek at the
    first record (or file header) when the config leaves something out.

    Raises:
        InputError: the config and the data disagree, or a file is missing.
    """
    kind = source_kind(data)
    if kind == "memory":
        return _finish_spec(*_memory_feats(data))
    if kind == "factory":
        return _factory_spec(data)
    if kind == "tfrecord":
        return _finish_spec(*_tfrecord_feats(data, None, peek=False))
    files = _train_files(data)
    if kind == "csv":
        plan = _csv_plan(data, files)
        return _finish_spec(plan.feats, plan.label)
    _, feats, label = _npz_table(data, files, "data.train")
    return _finish_spec(feats, label)


def _options(ds: Any) -> Any:
    tf = _tf()
    options = tf.data.Options()
    # the shards are made here: a strategy must not split them again
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def _prefetch(ds: Any, data: DataConf) -> Any:
    tf = _tf()
    n = int(data.prefetch)
    if n == 0:
        return ds
    return ds.prefetch(tf.data.AUTOTUNE if n < 0 else n)


def _check_batch(data: DataConf) -> int:
    if int(data.batch_size) < 1:
        raise InputError(f"data.batch_size={data.batch_size}: use a positive number")
    return int(data.batch_size)


def _train(data: DataConf, shard_index: int, num_shards: int, seed: int, shuffle: bool) -> Any:
    tf = _tf()
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} is not in [0, {num_shards})")
    batch = _check_batch(data)
    kind = source_kind(data)
    shuffle = shuffle and int(data.shuffle_buffer) > 0
    if kind == "factory":
        ds = _call_factory(data, "train", shard_index, num_shards, seed).repeat()
        return _prefetch(_options(ds), data)
    if kind == "memory":
        mode, _ = _sharding(data, num_shards)
        ds_mem = _memory_set(data)
        feats, label = _memory_feats(data)
        table = _memory_table(ds_mem.x_train, ds_mem.y_train)
        rows = np.arange(shard_index, table.n, num_shards, dtype=np.int64)
        if _array_mode(False) == "py":  # TF1 graph: the shard fed once, at the iterator's init
            ds = _fed_train(table, rows, feats, label, batch, seed, shuffle)
        else:
            ds = _array_train(table, rows, feats, label, batch, seed, shuffle, False, "data.name")
        return _prefetch(_options(ds), data)
    files = _train_files(data)
    mode, _ = _sharding(data, num_shards, files)
    if kind == "npz":
        table, feats, label = _npz_table(data, files, "data.train")
        if mode == "file":
            my_files = range(shard_index, len(files), num_shards)
            rows = np.concatenate(
                [
                    np.arange(table.offsets[i], table.offsets[i + 1], dtype=np.int64)
                    for i in my_files
                ]
            )
        else:
            rows = np.arange(shard_index, table.n, num_shards, dtype=np.int64)
        if _array_mode(False) == "py":
            # TF1 graph: the shard fed once, at the iterator's init, as the bundled sets are (a
            # numpy_function per batch cannot run on a worker of a cluster: its op is pinned to
            # /job:localhost)
            ds = _fed_train(table, rows, feats, label, batch, seed, shuffle)
        else:
            ds = _array_train(table, rows, feats, label, batch, seed, shuffle, True, "data.train")
        return _prefetch(_options(ds), data)
    if kind == "tfrecord":
        feats, label = _tfrecord_feats(data, files)
        reader = _tfrecord_reader(_check_compression(data))
        spec = _parse_spec(feats, label)
        to_pair = _from_dict(list(feats), label.name)

        def parse(serialized: Any) -> Any:
            return to_pair(tf.io.parse_example(serialized, spec))

    else:
        plan = _csv_plan(data, files)
        reader = _csv_reader(data, plan)
        parse = _csv_pair(plan)
    if mode == "file":
        mine = files[shard_index::num_shards]
        ds = tf.data.Dataset.from_tensor_slices(mine)
        if shuffle and len(mine) > 1:
            ds = ds.shuffle(len(mine), seed=seed, reshuffle_each_iteration=True)
        ds = ds.interleave(
            reader,
            cycle_length=min(len(mine), INTERLEAVE_FILES),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    else:
        ds = reader(files)  # the same stream on every worker, each keeps its own records
        if num_shards > 1:
            ds = ds.shard(num_shards, shard_index)
    if shuffle:
        ds = ds.shuffle(int(data.shuffle_buffer), seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat().batch(batch, drop_remainder=True)
    if kind == "tfrecord":
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
        ds = ds.map(parse)
    return _prefetch(_options(ds), data)


@_plain_python
def train_dataset(data: DataConf, shard_index: int, num_shards: int, seed: int) -> tf.data.Dataset:
    """This worker's training data: ``(features, label)`` batches of ``data.batch_size``,
    shuffled (seeded by ``seed``), repeated forever, prefetched.

    Raises:
        InputError: bad config or data, found at build time (files, globs, headers, the first
            record's features); later records are checked by TensorFlow as they are read
            (:func:`explain_error`).
    """
    return _train(data, shard_index, num_shards, seed, shuffle=True)


@_plain_python
def eval_dataset(
    data: DataConf, max_examples: Optional[int] = None, min_batch: int = 0
) -> tf.data.Dataset:
    """The held-out data: finite, batched (``data.batch_size``, or ``min_batch`` when larger),
    in a fixed order, not sharded; at most ``max_examples`` examples when given. See
    :func:`eval_source`.

    Raises:
        InputError: as :func:`train_dataset`.
    """
    return _finite(data, "eval", max_examples, min_batch)


@_plain_python
def train_sample_dataset(data: DataConf, max_examples: int, min_batch: int = 0) -> tf.data.Dataset:
    """The first ``max_examples`` training examples (all shards), finite, batched (as
    :func:`eval_dataset`), in a fixed order: what a chief scores its final checkpoint's
    training loss on.

    Raises:
        InputError: as :func:`train_dataset`.
    """
    return _finite(data, "train", max_examples, min_batch)


def _finite(data: DataConf, split: str, max_examples: Optional[int], min_batch: int = 0) -> Any:
    tf = _tf()
    batch = max(_check_batch(data), int(min_batch))
    kind = source_kind(data)
    limit = None if max_examples is None else max(0, int(max_examples))
    if kind == "factory":
        ds = _call_factory(data, split, 0, 1, data.seed)
        if limit is not None:
            ds = ds.unbatch().take(limit).batch(batch)
        return _prefetch(_options(ds), data)
    if kind == "memory":
        ds_mem = _memory_set(data)
        feats, label = _memory_feats(data)
        if split == "eval":
            table = _memory_table(ds_mem.x_eval, ds_mem.y_eval)
        else:
            table = _memory_table(ds_mem.x_train, ds_mem.y_train)
        n = table.n if limit is None else min(limit, table.n)
        rows = np.arange(n, dtype=np.int64)
        return _prefetch(_options(_array_eval(table, rows, feats, label, batch, False)), data)
    files = _eval_files(data) if split == "eval" else None
    key = "data.eval"
    if files is None:
        files, key = _train_files(data), "data.train"
        if split == "eval":
            limit = data.eval_examples if limit is None else min(limit, data.eval_examples)
    if kind == "npz":
        table, feats, label = _npz_table(data, files, key)
        n = table.n if limit is None else min(limit, table.n)
        rows = np.arange(n, dtype=np.int64)
        return _prefetch(_options(_array_eval(table, rows, feats, label, batch, True)), data)
    if kind == "tfrecord":
        feats, label = _tfrecord_feats(data, files, key)
        ds = _tfrecord_reader(_check_compression(data))(files)
        spec = _parse_spec(feats, label)
        to_pair = _from_dict(list(feats), label.name)

        def parse(serialized: Any) -> Any:
            return to_pair(tf.io.parse_example(serialized, spec))

    else:
        plan = _csv_plan(data, files, key)
        ds = _csv_reader(data, plan)(files)
        parse = _csv_pair(plan)
    if limit is not None:
        ds = ds.take(limit)
    ds = ds.batch(batch).map(parse)
    return _prefetch(_options(ds), data)
