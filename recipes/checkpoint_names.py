"""How a variable is named in a checkpoint, for every algorithm (stdlib only).

The TF1 recipes (the twelve parameter-server algorithms) write name-based checkpoints: the
model's variables as ``model/<path>`` (``model/dense0/w``, or a Keras path such as
``model/hidden/kernel``) and the step as ``global_step``. The TF2 strategies (``allreduce``,
``pss``) write TF2 object checkpoints, whose keys are the same names followed by
:data:`OBJECT_SUFFIX`. Whoever reads a checkpoint (the evaluator, an export) tells the two
apart by the ``global_step`` key: :func:`object_based`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "DYNAMIC_PREFIX",
    "GLOBAL_STEP",
    "MODEL_PREFIX",
    "OBJECT_SUFFIX",
    "PART",
    "PlainNames",
    "model_name",
    "object_based",
    "sliced_names",
    "stored",
]

GLOBAL_STEP = "global_step"
# A dynamic table's variables beside its rows (recipes/dynamic_table.py):
# ``dynamic/<path>/shard_<i>/<what>`` (the id each row holds, when it was last seen, ...)
DYNAMIC_PREFIX = "dynamic/"
MODEL_PREFIX = "model/"
# A TF2 object checkpoint stores variable "model/dense0/w" under "model/dense0/w" + this suffix.
OBJECT_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
# A part of a split variable, ``<name>/part_<i>`` (recipes/keras_model.py splits by rows).
PART = re.compile(r"/part_(\d+)$")


def model_name(path: str) -> str:
    """The checkpoint name of the model variable at ``path`` (``dense0/w``)."""
    return MODEL_PREFIX + path


def stored(name: str, object_based: bool) -> str:
    """The key ``name`` is stored under in a checkpoint of either format."""
    return name + OBJECT_SUFFIX if object_based else name


def object_based(keys: Iterable[str]) -> bool:
    """Whether a checkpoint whose keys are ``keys`` is a TF2 object checkpoint."""
    return GLOBAL_STEP + OBJECT_SUFFIX in set(keys)


def sliced_names(named: Mapping[str, Any]) -> dict[str, Any]:
    """A Saver's ``var_list`` (checkpoint name -> variable) with the slices of each logical
    variable (``recipes.keras_model``'s split tables, and their optimizer slots) grouped under
    one name, in row order: the form in which a Saver writes and reads one tensor in slices.
    A part named ``<name>/part_<i>`` goes under ``<name>``; any other slice (a slot, named by
    its op) under its logical variable's name (TensorFlow's ``SaveSliceInfo.full_name``)."""
    out: dict[str, Any] = {}
    slices: dict[str, list[Any]] = {}
    for name, var in named.items():
        info = getattr(var, "_save_slice_info", None)
        if info is None:
            out[name] = var
            continue
        part = PART.search(name)
        slices.setdefault(name[: part.start()] if part else info.full_name, []).append(var)
    for whole, parts in slices.items():
        out[whole] = sorted(parts, key=lambda v: v._save_slice_info.var_offset[0])
    return out


class PlainNames:
    """A checkpoint reader (``tf.train.load_checkpoint``) of either format whose names are the
    plain ones (``model/dense0/w``, ``dynamic/...``): a TF2 object checkpoint's keys without
    :data:`OBJECT_SUFFIX`, its other entries (the object graph) left out."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        shapes = reader.get_variable_to_shape_map()
        self._tf2 = object_based(shapes)
        self._shapes = {
            key.removesuffix(OBJECT_SUFFIX) if self._tf2 else key: shape
            for key, shape in shapes.items()
            if not self._tf2 or key.endswith(OBJECT_SUFFIX)
        }

    def get_variable_to_shape_map(self) -> dict[str, Any]:
        return dict(self._shapes)

    def has_tensor(self, name: str) -> bool:
        return name in self._shapes

    def get_tensor(self, name: str) -> Any:
        return self._reader.get_tensor(stored(name, self._tf2))
