"""The tables a scorer reads row by row from the checkpoint it scores, instead of loading them.

The evaluator and the chiefs' final scores (recipes/evaluator.py) restore a checkpoint into a
graph of their own. A table larger than ``trainer.score_rows_bytes`` is not restored: its
Embedding's lookup reads, for each batch, the rows of the batch's distinct ids from the
checkpoint's files, memory-mapped (recipes/checkpoint_bundle.py: only those rows' pages are
read), through a :class:`recipes.sparse_lookup.RowSource`. So a scorer holds the batch's rows of
a table, never the table: the table may be larger than the scorer's memory, and the scores are
still the checkpoint's weights.

Either checkpoint format (TF1 names, TF2 object keys), a table stored whole or in slices (split
over the parameter servers: any number of them), or as an older checkpoint's parts
(``<name>/part_<i>``). A checkpoint this reader cannot read so (not a local file, a compressed
index) is read whole through TensorFlow's reader instead, once per checkpoint, and said once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from recipes.checkpoint_bundle import Bundle, BundleError
from recipes.checkpoint_names import OBJECT_SUFFIX, model_name
from recipes.sparse_lookup import RowSource

__all__ = ["CheckpointRows", "TableShape"]


@dataclass(frozen=True)
class TableShape:
    """A table's shape and NumPy dtype name, as the model builds it."""

    shape: tuple[int, ...]
    dtype: str


# How one table's rows are read from one checkpoint: ids (int64, distinct) -> rows
Read = Callable[[Any], Any]


class CheckpointRows:
    """Row sources for the tables ``tables`` (path -> :class:`TableShape`), reading from the
    checkpoint :meth:`open` was last given. ``log``: where the one line of a fallback goes."""

    def __init__(self, tables: Mapping[str, TableShape], log: Callable[[str], None]) -> None:
        self.tables = dict(tables)
        self._log = log
        self._said = False
        self._bundle: Optional[Bundle] = None
        self._stored: dict[str, Read] = {}
        self.sources = {
            path: RowSource(self._reader(path), t.shape, t.dtype) for path, t in self.tables.items()
        }

    def _reader(self, path: str) -> Callable[[Any], Any]:
        def read(ids: Any) -> Any:
            stored = self._stored.get(path)
            if stored is None:
                raise ValueError(f"no checkpoint opened for {path}")  # a bug: restore first
            return stored(ids)

        return read

    def open(self, ckpt: str, tf2: bool) -> None:
        """Read the tables from ``ckpt`` from now on.

        Raises:
            tf.errors.NotFoundError, tf.errors.InvalidArgumentError: a table is missing from
                ``ckpt``, or stored in another shape: the errors (and messages) of a restore.
        """
        try:
            bundle = Bundle(ckpt)
            stored = {path: self._in_bundle(bundle, path, tf2) for path in self.tables}
            bundle.map_data()
        except BundleError as e:
            if not self._said:
                self._log(
                    f"scoring: {ckpt} cannot be memory-mapped ({e}): its large tables are read "
                    "whole through TensorFlow"
                )
                self._said = True
            stored = {path: self._whole(ckpt, path, tf2) for path in self.tables}
            bundle = None
        self.close()
        self._bundle, self._stored = bundle, stored

    def _check(self, path: str, shape: tuple[int, ...]) -> None:
        import tensorflow as tf

        want = self.tables[path].shape
        if tuple(shape) != want:  # as a restore says it (recipes/failures.py explains it)
            raise tf.errors.InvalidArgumentError(
                None,
                None,
                f"tensor_name = {model_name(path)}; shape in shape_and_slice spec {list(want)} "
                f"does not match the shape stored in checkpoint: {list(shape)}",
            )

    @staticmethod
    def _missing(path: str, ckpt: str) -> Exception:
        import tensorflow as tf

        error: Exception = tf.errors.NotFoundError(
            None, None, f"Key {model_name(path)} not found in checkpoint {ckpt}"
        )
        return error

    def _in_bundle(self, bundle: Bundle, path: str, tf2: bool) -> Read:
        suffix = OBJECT_SUFFIX if tf2 else ""
        name = model_name(path) + suffix
        if bundle.has(name):
            self._check(path, bundle.shape(name))
            return lambda ids: bundle.rows(name, ids)
        parts: list[tuple[str, int, int]] = []
        first = 0
        while bundle.has(part := f"{model_name(path)}/part_{len(parts)}{suffix}"):
            rows = bundle.shape(part)[0]
            parts.append((part, first, first + rows))
            first += rows
        if not parts:
            raise self._missing(path, bundle.prefix)
        self._check(path, (first, *bundle.shape(parts[0][0])[1:]))

        def read(ids: Any) -> Any:
            out = np.empty((len(ids), *self.tables[path].shape[1:]), self.tables[path].dtype)
            for part, lo, hi in parts:
                mine = np.nonzero((ids >= lo) & (ids < hi))[0]
                if mine.size:
                    out[mine] = bundle.rows(part, ids[mine] - lo)
            return out

        return read

    def _whole(self, ckpt: str, path: str, tf2: bool) -> Read:
        """The fallback: the table read whole once, by TensorFlow's reader."""
        import tensorflow as tf

        reader = tf.train.load_checkpoint(ckpt)
        suffix = OBJECT_SUFFIX if tf2 else ""
        name = model_name(path) + suffix
        if reader.has_tensor(name):
            value = reader.get_tensor(name)
        else:
            parts: list[Any] = []
            while reader.has_tensor(part := f"{model_name(path)}/part_{len(parts)}{suffix}"):
                parts.append(reader.get_tensor(part))
            if not parts:
                raise self._missing(path, ckpt)
            value = np.concatenate(parts, axis=0)
        self._check(path, tuple(value.shape))
        return lambda ids: value[ids]

    def close(self) -> None:
        self._stored = {}
        if self._bundle is not None:
            self._bundle.close()
            self._bundle = None
