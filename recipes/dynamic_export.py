"""A dynamic table in the exported model (``tfplan export model``): raw ids in, as in training.

The checkpoint holds each shard's rows beside the id each row holds and when it was last seen
(recipes/dynamic_table.py). The export keeps the resident rows (last seen >= 0) and puts, in the
place of the dynamic ``Embedding``, a ``keras.Sequential`` of the same name: an
``IntegerLookup`` (int64 ids) or ``StringLookup`` (string ids) whose vocabulary is the resident
ids, then a plain ``Embedding`` with a row per resident id after row 0, zeros, for an id it does
not know (what training reads for an id without a row). Only built-in Keras layers: the file
opens with ``keras.saving.load_model`` anywhere, without tfplan. The other layers are the trained
model's own (``clone_model`` reuses them, weights and all). A functional or Sequential model is
needed (``clone_model`` rebuilds its graph); a subclassed one is refused in one line.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from recipes.checkpoint_names import DYNAMIC_PREFIX, PlainNames, model_name
from recipes.errors import ConfigError

__all__ = ["resident_rows", "with_lookups"]


def resident_rows(reader: Any, path: str) -> tuple[np.ndarray, np.ndarray]:
    """The ids (int64, or str) and rows of the dynamic table at ``path`` (its Keras path) that
    are resident in the checkpoint ``reader`` reads, over every shard."""
    reader = PlainNames(reader)  # either format: a TF1 recipe's checkpoint or pss's
    shard = re.compile(re.escape(model_name(path)) + r"/shard_(\d+)$")
    names = sorted(
        (int(m.group(1)), name)
        for name in reader.get_variable_to_shape_map()
        if (m := shard.match(name))
    )
    if not names:
        raise ConfigError(
            f"the checkpoint holds no dynamic table {path!r} (model.dynamic): export the model "
            "with the model.dynamic it was trained with"
        )
    ids, rows = [], []
    for index, name in names:
        aux = f"{DYNAMIC_PREFIX}{path}/shard_{index}"
        seen = reader.get_tensor(f"{aux}/last_seen")
        live = seen >= 0
        ids.append(reader.get_tensor(f"{aux}/row_ids")[live])
        rows.append(reader.get_tensor(name)[live])
    joined = np.concatenate(ids)
    if joined.dtype == object:  # string ids come back as bytes
        joined = np.array(
            [i.decode() if isinstance(i, bytes) else str(i) for i in joined], dtype=str
        )
    return joined, np.concatenate(rows)


def _stand_in(ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One id (``""`` or 0) and a row of zeros, for a table without resident ids."""
    one = np.array([""]) if ids.dtype.kind in "US" else np.array([0], np.int64)
    return one, np.zeros((1, *rows.shape[1:]), rows.dtype)


def with_lookups(model: Any, tables: dict[str, tuple[np.ndarray, np.ndarray]]) -> Any:
    """``model`` with each dynamic Embedding (by layer name, in ``tables``: its resident ids and
    rows) replaced by a lookup of those ids and a plain Embedding of their rows."""
    import keras
    from keras.src.models.functional import Functional  # no public name for the class

    if not isinstance(model, (keras.Sequential, Functional)):
        raise ConfigError(
            f"model.dynamic: {type(model).__name__} is a subclassed model, which the export "
            "cannot rewire to take raw ids: build the model with keras.Input (functional), or "
            "read the resident ids and rows from the checkpoint (docs/dynamic_tables.md)"
        )

    # a table with no resident id (every row freed): one stand-in id whose row is zeros, as an
    # unknown id's is (a lookup layer takes no empty vocabulary): every id then reads zeros
    tables = {
        name: (ids, rows) if len(ids) else _stand_in(ids, rows)
        for name, (ids, rows) in tables.items()
    }

    def replace(layer: Any) -> Any:
        if layer.name not in tables:
            return layer  # the trained layer itself, with its weights
        ids, _ = tables[layer.name]
        if ids.dtype.kind in "US":
            lookup = keras.layers.StringLookup(
                vocabulary=list(ids), num_oov_indices=1, name=f"{layer.name}_ids"
            )
        else:
            lookup = keras.layers.IntegerLookup(
                vocabulary=ids.astype(np.int64), num_oov_indices=1, name=f"{layer.name}_ids"
            )
        rows = keras.layers.Embedding(
            len(ids) + 1, int(layer.output_dim), name=f"{layer.name}_rows", dtype=layer.dtype_policy
        )
        return keras.Sequential([lookup, rows], name=layer.name)

    exported = keras.models.clone_model(model, clone_function=replace)
    for name, (ids, rows) in tables.items():
        sequential = exported.get_layer(name)
        embedding = sequential.layers[-1]
        if not embedding.built:
            embedding.build((None,))
        width = int(embedding.output_dim)
        values = np.zeros((len(ids) + 1, width), embedding.embeddings.dtype)
        values[1:] = rows
        embedding.embeddings.assign(values)
    return exported
