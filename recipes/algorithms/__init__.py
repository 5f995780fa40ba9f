"""Training algorithms, by name.

Each algorithm is one module with one :class:`~recipes.algorithms.base.Algorithm` subclass. To add
one, write ``recipes/algorithms/<name>.py`` and add a line to ``_MODULES``; modules are imported
lazily so an unknown name fails fast and cheaply.
"""

from __future__ import annotations

import importlib

from recipes.algorithms.base import Algorithm
from recipes.errors import ConfigError

__all__ = ["available", "get_algorithm"]

_MODULES: dict[str, str] = {
    "hogwild": "recipes.algorithms.hogwild:Hogwild",
    "downpour": "recipes.algorithms.downpour:Downpour",
    "sync": "recipes.algorithms.sync:SyncSGD",
    "downpour_easy": "recipes.algorithms.downpour_easy:DownpourEasy",
    "agn": "recipes.algorithms.agn:AGN",
    "sagn": "recipes.algorithms.sagn:SAGN",
    "sync_lr": "recipes.algorithms.sync_lr:SyncLR",
    "dynsgd": "recipes.algorithms.dynsgd:DynSGD",
    "adag": "recipes.algorithms.adag:ADAG",
    "easgd": "recipes.algorithms.easgd:EASGD",
    "eamsgd": "recipes.algorithms.eamsgd:EAMSGD",
    "multi_gpu": "recipes.algorithms.multi_gpu:MultiGPU",
}


def available() -> list[str]:
    return sorted(_MODULES)


def get_algorithm(name: str) -> Algorithm:
    """Instantiate the algorithm registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    if name not in _MODULES:
        raise ConfigError(f"unknown algorithm '{name}'; valid: {', '.join(available())}")
    module, cls = _MODULES[name].split(":")
    algo: Algorithm = getattr(importlib.import_module(module), cls)()
    return algo
