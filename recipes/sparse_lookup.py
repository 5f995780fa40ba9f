"""Embedding lookups that read only the rows a batch asks for, on the device that holds them.

Why: Keras 3's ``Embedding.call`` is ``ops.take(self.embeddings, ids)``, which first converts the
whole table to a tensor; in graph mode with the table on a parameter server, every step moved the
whole table to the worker (2,000,000 x 64 rows: 25x slower than 50,000 with the same ids). Here the
batch's ids are de-duplicated on the worker, each table part gathers its own rows where it lives
(``tf.gather`` of a resource variable is a ``ResourceGather`` on the variable's device), and only
those rows travel; the rows are then spread back to the batch's shape. The gradient of the table is
an ``IndexedSlices`` of the same rows, as TensorFlow's own ``tf.nn.embedding_lookup`` gives.

:func:`sparse_call` replaces the ``call`` of a plain ``keras.layers.Embedding`` (not quantized, no
LoRA, ``call`` not overridden by a subclass) while :func:`tables_in_use` says where its table's
parts are; anything else keeps Keras' own call (the whole table read).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from recipes.errors import ModelError

__all__ = [
    "OUT_OF_RANGE",
    "ForwardContext",
    "Piece",
    "RowSource",
    "rows_from",
    "fed_by",
    "float_ids_error",
    "lookup_rows",
    "out_of_range_error",
    "sparse_call",
    "sparse_capable",
    "tables_in_use",
]

# A part of a table: its value (a variable or a tensor) and the rows [lo, hi) it holds.
Piece = tuple[Any, int, int]


class ForwardContext:
    """A value the layers' replaced calls read during one forward pass (this thread's, and
    restored after: forward passes nest when a model calls another)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def holding(self, value: Any) -> Iterator[None]:
        before = self.get()
        self._local.value = value
        try:
            yield
        finally:
            self._local.value = before

    def get(self) -> Any:
        return getattr(self._local, "value", None)


_pieces = ForwardContext()  # table path -> its pieces, during one forward pass


def tables_in_use(pieces: Mapping[str, Sequence[Piece]]) -> Any:
    """While inside, an Embedding whose table path is in ``pieces`` reads through them."""
    return _pieces.holding(pieces)


class RowSource:
    """A table read outside the graph's variables: ``read(ids)`` returns the rows ``ids`` (a
    NumPy int64 vector of distinct ids) as an array of ``[len(ids), *shape[1:]]`` in
    ``dtype``. While :func:`rows_from` holds it, an Embedding over that table calls it once per
    batch with the batch's distinct ids (``tf.numpy_function``, in the process that runs the
    step): the scorers read a table larger than themselves from the checkpoint this way
    (recipes/checkpoint_rows.py)."""

    def __init__(self, read: Callable[[Any], Any], shape: Sequence[int], dtype: Any) -> None:
        self.read = read
        self.shape = tuple(int(d) for d in shape)
        self.dtype = tf.as_dtype(dtype)

    def gather(self, ids: Any) -> Any:
        rows = tf.numpy_function(
            lambda i: self.read(i), [tf.cast(ids, tf.int64)], self.dtype, name="read_rows"
        )
        return tf.ensure_shape(rows, [None, *self.shape[1:]])


_sources = ForwardContext()  # table path -> its RowSource, during one forward pass


def rows_from(sources: Mapping[str, RowSource]) -> Any:
    """While inside, an Embedding whose table path is in ``sources`` reads its batch's rows
    from that source instead of the table's variables (which the step then never reads)."""
    return _sources.holding(sources)


def _gather_where_it_lives(table: Any, ids: Any) -> Any:
    """``table``'s rows ``ids``, gathered on the device that holds ``table``, whatever device
    scope the forward pass is built in (as ``tf.nn.embedding_lookup`` colocates its gathers)."""
    with tf.compat.v1.colocate_with(table):
        return tf.gather(table, ids)


# What an id outside its table fails with: recipes/failures.py makes it one line.
OUT_OF_RANGE = "tfplan-embedding-ids-out-of-range"


def lookup_rows(pieces: Sequence[Piece], ids: Any, what: str = "the table") -> Any:
    """The rows ``ids`` (any shape, int32/int64) of the table ``pieces`` make up, shaped
    ``ids.shape + [width]``. Each distinct id is read once, from the piece that holds it.
    An id outside the table fails the step with :data:`OUT_OF_RANGE`, ``what`` (the layer and
    its feature), the table's rows and the batch's smallest and largest ids."""
    flat = tf.reshape(ids, [-1])
    unique, back = tf.unique(flat)
    rows_total = max(hi for _, _, hi in pieces)
    low, high = tf.reduce_min(unique), tf.reduce_max(unique)
    inside = tf.logical_and(low >= 0, high < rows_total)
    check = tf.debugging.Assert(
        tf.logical_or(tf.equal(tf.size(unique), 0), inside),
        [f"{OUT_OF_RANGE}|{what}|{rows_total}|", low, high],
        summarize=1,
    )
    with tf.control_dependencies([check]):
        unique = tf.identity(unique)
    if isinstance(pieces[0][0], RowSource):
        rows = pieces[0][0].gather(unique)
    elif len(pieces) == 1:
        # received here (this scope's device) before it is spread: a gather of the ps's output
        # would colocate its gradient's ops with the ps and the worker at once
        rows = tf.identity(_gather_where_it_lives(pieces[0][0], unique))
    else:
        where = tf.range(tf.size(unique))
        positions, parts = [], []
        for table, lo, hi in pieces:
            mine = tf.logical_and(unique >= lo, unique < hi)
            positions.append(tf.boolean_mask(where, mine))
            local = tf.boolean_mask(unique, mine) - tf.cast(lo, unique.dtype)
            parts.append(_gather_where_it_lives(table, local))
        rows = tf.dynamic_stitch(positions, parts)
    out = tf.gather(rows, back)
    width = tf.shape(out)[1:]
    return tf.reshape(out, tf.concat([tf.shape(ids), width], axis=0))


def sparse_capable(layer: Any) -> bool:
    """A plain Keras Embedding whose lookup :func:`sparse_call` can take over."""
    from keras.layers import Embedding

    return (
        isinstance(layer, Embedding)
        and type(layer).call is Embedding.call
        and getattr(layer, "quantization_mode", None) is None
        and not getattr(layer, "lora_enabled", False)
    )


def fed_by(layer: Any) -> Optional[str]:
    """The name of the model input that feeds ``layer`` directly (a functional model's
    ``keras.Input``, named after a feature), else None."""
    try:
        tensor = layer._inbound_nodes[0].input_tensors[0]  # noqa: SLF001 - Keras' graph
        source = tensor._keras_history.operation  # noqa: SLF001
    except (AttributeError, IndexError):
        return None
    return str(tensor.name) if type(source).__name__ == "InputLayer" else None


def sparse_call(layer: Any, path: str) -> Callable[[Any], Any]:
    """A ``call`` for ``layer`` (whose table's path is ``path``) that reads through the pieces
    :func:`tables_in_use` gives, or Keras' own call outside of it."""
    from keras import ops

    own = layer.call
    feature = fed_by(layer)
    what = f"the Embedding {layer.name!r}" + (f" (feature {feature!r})" if feature else "")

    def call(inputs: Any) -> Any:
        pieces: Optional[Mapping[str, Sequence[Piece]]] = _pieces.get()
        sources: Optional[Mapping[str, RowSource]] = _sources.get()
        if sources and path in sources:
            pieces = {path: [(sources[path], 0, sources[path].shape[0])]}
        if not pieces or path not in pieces:
            return own(inputs)
        if inputs.dtype.is_floating:
            error = ModelError(float_ids_error(what, feature, inputs.dtype.name))
            error._keras_call_info_injected = True  # type: ignore[attr-defined] # Keras: as is
            raise error
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int64)
        return ops.cast(lookup_rows(pieces[path], inputs, what), dtype=layer.compute_dtype)

    return call


def float_ids_error(what: str, feature: Optional[str], dtype: str) -> str:
    """The one line for a table whose ids arrive as floats."""
    data = (
        f" and read the feature as integers (data.features.{feature}.dtype=int64)"
        if feature
        else ""
    )
    return (
        f"{what} gets its ids as {dtype}: ids must be integers (a float32 holds them exactly only "
        f"up to 16,777,216, above that distinct ids share a row): give the keras.Input that "
        f'feeds it dtype="int64"{data}, or cast the ids in the model'
    )


def out_of_range_error(message: str) -> Optional[str]:
    """The one line for a step failed by :func:`lookup_rows`' range check (``message``: the
    TensorFlow error's), or None for any other error."""
    import re

    m = re.search(rf"{OUT_OF_RANGE}\|(.*?)\|(\d+)\|\]?\s*\[?(-?\d+)\]?\s*\[?(-?\d+)", message)
    if not m:
        return None
    what = m.group(1).replace("\\'", "'")  # TensorFlow's Assert escapes quotes
    rows, low, high = int(m.group(2)), int(m.group(3)), int(m.group(4))
    bad = high if high >= rows else low
    return (
        f"an id of {bad:,} reached {what}, whose table has {rows:,} rows (ids 0 to {rows - 1:,}): "
        "give the layer an input_dim above the largest id (its model.* argument), or map the "
        "ids into range before the model (a vocabulary lookup or a hash)"
    )
