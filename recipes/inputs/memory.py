"""The in-memory sets of :mod:`recipes.datasets` (``digits``, ``mnist*``, ``synthetic``) as
tables of rows for the array pipelines: one feature ``x``, the label ``label``.

A set is loaded once per process (the last one asked for is kept): the training and evaluation
datasets, and the checks, all read the same arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from recipes import datasets
from recipes.config import DataConf
from recipes.inputs.npz import _Columns
from recipes.inputs.specs import _Feat

_MEMORY_CACHE: dict[tuple[Any, ...], datasets.Dataset] = {}


def _memory_set(data: DataConf) -> datasets.Dataset:
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
        _MEMORY_CACHE[key] = datasets.load(data)
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
