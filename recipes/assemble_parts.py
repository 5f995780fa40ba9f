"""Assemble a Keras model that tfplan exported as parts (copied as ``assemble.py`` into every
parts folder; it needs NumPy and Keras only, not tfplan).

A model too large to join in the exporting process (``trainer.export_join_bytes``) is written as
a folder: ``model.json`` (the architecture, the factory that builds it, and every weight: its
path, shape, dtype and the ``.npy`` files that hold its rows, in order) and ``weights/``. Each
file holds a contiguous range of a weight's rows; a small weight is one file.

- ``python assemble.py OUT.keras``: join every weight of the folder it lies in and save one ``.keras`` file
  (``keras.saving.load_model`` opens it). Needs the whole model's memory.
- In code: ``parts(folder, path)`` gives a weight's row ranges as memory-mapped arrays (a table
  served by rows without loading it), ``weight(folder, path)`` the joined array, ``load(folder)``
  the model with every weight set.

The architecture is Keras' own JSON (``model.to_json()``); a model that has none (a subclassed
model without ``get_config``) is built by calling its factory (``factory.target`` with
``factory.kwargs``), which must then be importable: run from your project's folder.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, Optional

import numpy as np

FORMAT = "tfplan-model-parts/1"
MANIFEST = "model.json"


def manifest(folder: str) -> dict[str, Any]:
    """The folder's ``model.json``."""
    with open(os.path.join(folder, MANIFEST)) as f:
        data: dict[str, Any] = json.load(f)
    if data.get("format") != FORMAT:
        raise ValueError(f"{folder}: not a model exported as parts ({FORMAT})")
    return data


def _spec(folder: str, path: str) -> dict[str, Any]:
    for spec in manifest(folder)["weights"]:
        if spec["path"] == path:
            return dict(spec)
    raise KeyError(f"{folder}: no weight {path}")


def parts(folder: str, path: str) -> list[tuple[int, int, np.ndarray]]:
    """The row ranges of the weight at ``path``: (first row, end row, rows memory-mapped)."""
    return _ranges(folder, _spec(folder, path))


def weight(folder: str, path: str) -> np.ndarray:
    """The weight at ``path``, its parts joined along the first axis."""
    return _joined(folder, _spec(folder, path))


def _ranges(folder: str, spec: dict[str, Any]) -> list[tuple[int, int, np.ndarray]]:
    return [
        (
            int(f["rows"][0]),
            int(f["rows"][1]),
            np.load(os.path.join(folder, f["file"]), mmap_mode="r"),
        )
        for f in spec["files"]
    ]


def _joined(folder: str, spec: dict[str, Any]) -> np.ndarray:
    pieces = [np.asarray(rows) for _, _, rows in _ranges(folder, spec)]
    value = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)
    if list(value.shape) != list(spec["shape"]):
        raise ValueError(
            f"{folder}: {spec['path']} assembles to {list(value.shape)}, not {spec['shape']}"
        )
    return value


def build(folder: str) -> Any:
    """The model, its weights as Keras initialises them: from the architecture, else the
    factory."""
    import keras

    data = manifest(folder)
    if data.get("architecture") is not None:
        return keras.models.model_from_json(json.dumps(data["architecture"]))
    target = data["factory"]["target"]
    module, _, name = target.rpartition(".")
    factory = getattr(importlib.import_module(module), name)
    return factory(**data["factory"].get("kwargs", {}))


def load(folder: str) -> Any:
    """The model with every weight of the folder set (joined: the whole model's memory)."""
    model = build(folder)
    by_path = {w.path: w for w in model.weights}
    specs = manifest(folder)["weights"]
    missing = [s["path"] for s in specs if s["path"] not in by_path]
    if missing or len(specs) != len(by_path):
        raise ValueError(
            f"{folder}: the model built has weights {sorted(by_path)}, the parts {missing or ''}"
            f"{[s['path'] for s in specs]}: build it with the same factory and keys"
        )
    for spec in specs:  # model.json read once, not once per weight
        by_path[spec["path"]].assign(_joined(folder, spec))
    return model


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or not args[0].endswith(".keras"):
        print(
            "usage: python assemble.py OUT.keras [FOLDER (default: this file's)]", file=sys.stderr
        )
        return 2
    folder = args[1] if len(args) == 2 else os.path.dirname(os.path.abspath(__file__))
    load(folder).save(args[0])
    print(args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
