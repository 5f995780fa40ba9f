"""The Keras side of dynamic tables (recipes/dynamic_table.py): which Embedding layers are
dynamic (``model.dynamic``), the dtype of their ids, and the ``call`` that reads through a
:class:`recipes.dynamic_table.DynamicTable` during a forward pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from recipes.dynamic_table import DynamicSettings, DynamicTable
from recipes.errors import ModelError
from recipes.sparse_lookup import ForwardContext, fed_by, sparse_capable

__all__ = [
    "DynamicLayer",
    "dynamic_call",
    "dynamic_layers",
    "tables_reading",
]

_tables = ForwardContext()  # table path -> (table, shard variables, training), in a forward


@dataclass(frozen=True)
class DynamicLayer:
    """A dynamic Embedding of the model: its layer, table path, ids' dtype and settings."""

    layer: Any
    path: str
    key_dtype: Any  # tf.int64 | tf.string
    settings: DynamicSettings

    @property
    def width(self) -> int:
        return int(self.layer.embeddings.shape[1])


def _input_dtype(layer: Any) -> Optional[Any]:
    """The dtype of the ids ``layer`` is called with (its first call's input), or None."""
    for node in getattr(layer, "_inbound_nodes", ()):
        tensors = getattr(node, "input_tensors", ())
        if tensors:
            return tf.as_dtype(tensors[0].dtype)
    return None


def dynamic_layers(
    model: Any,
    names: Sequence[str],
    capacity: Optional[int],
    min_count: int,
    ttl_steps: int,
) -> list[DynamicLayer]:
    """The layers of ``model`` named in ``model.dynamic``.

    Raises:
        ModelError: a name is no layer of the model, or no plain Embedding, or its ids are
            floats.
    """
    if not names:
        return []
    layers = {layer.name: layer for layer in model._flatten_layers(include_self=False)}  # noqa: SLF001
    embeddings = sorted(n for n, layer in layers.items() if sparse_capable(layer))
    out = []
    for name in names:
        layer = layers.get(name)
        if layer is None or not sparse_capable(layer):
            what = "is no layer of the model" if layer is None else f"is a {type(layer).__name__}"
            raise ModelError(
                f"model.dynamic: {name!r} {what}, not a keras.layers.Embedding: name one of the "
                f"model's Embedding layers ({', '.join(embeddings) or 'it has none'})"
            )
        dtype = _input_dtype(layer) or tf.int64
        if dtype.is_floating or dtype.is_bool:
            feature = fed_by(layer)
            raise ModelError(
                f"model.dynamic: the Embedding {name!r} gets its ids as {dtype.name}: a dynamic "
                f'table takes raw ids as int64 or string: give the keras.Input that feeds it dtype="int64" '
                f'or dtype="string"'
                + (f" (data.features.{feature}.dtype to match)" if feature else "")
            )
        key_dtype = tf.string if dtype == tf.string else tf.int64
        rows = int(capacity) if capacity else int(layer.embeddings.shape[0])
        out.append(
            DynamicLayer(
                layer,
                layer.embeddings.path,
                key_dtype,
                DynamicSettings(capacity=rows, min_count=min_count, ttl_steps=ttl_steps),
            )
        )
    return out


def tables_reading(active: Mapping[str, tuple[DynamicTable, Sequence[Any], bool]]) -> Any:
    """While inside, a dynamic Embedding whose path is in ``active`` reads through its table."""
    return _tables.holding(active)


def dynamic_call(layer: Any, path: str, key_dtype: Any) -> Callable[[Any], Any]:
    """A ``call`` for the dynamic Embedding ``layer``: its ids looked up in the table that
    :func:`tables_reading` gives for ``path`` (outside of one: Keras' own call, which only an
    eager build of shapes reaches)."""
    from keras import ops

    own = layer.call
    feature = fed_by(layer)

    def call(inputs: Any) -> Any:
        active = _tables.get()
        if not active or path not in active:
            return (
                own(tf.zeros_like(inputs, dtype=tf.int32))
                if inputs.dtype == tf.string
                else own(inputs)
            )
        table, shards, training = active[path]
        if inputs.dtype.is_floating or inputs.dtype.is_bool:
            raise ModelError(
                f"model.dynamic: the Embedding {layer.name!r} gets its ids as "
                f"{inputs.dtype.name}: raw ids must be int64 or string (a float32 holds ids "
                "exactly only up to 16,777,216)"
                + (f": read the feature as data.features.{feature}.dtype=int64" if feature else "")
            )
        if (inputs.dtype == tf.string) != (key_dtype == tf.string):
            got = inputs.dtype.name
            raise ModelError(
                f"model.dynamic: the Embedding {layer.name!r} was built for {key_dtype.name} ids "
                f"and gets {got}: give its keras.Input and its feature one dtype"
                + (f" (data.features.{feature}.dtype)" if feature else "")
            )
        return ops.cast(table.lookup(shards, inputs, training), dtype=layer.compute_dtype)

    return call
