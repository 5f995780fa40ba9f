"""Backends: where tasks run. One interface (:mod:`tfplan.backends.api`), one module per engine.

Built in: ``process`` (local and SSH hosts), ``slurm``, ``kubernetes``, ``spark``. Others register under
the entry-point group ``tfplan.backends`` in their own package::

    [project.entry-points."tfplan.backends"]
    mycloud = "mycloud_tfplan:MyCloudBackend"

and are chosen with ``cluster.backend=mycloud``. Modules are imported only when used.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from tfplan.errors import ConfigError

if TYPE_CHECKING:
    from tfplan.backends.api import Backend
    from tfplan.planning.plan import BackendRef

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "available", "backend_class", "open_backend"]

ENTRY_POINT_GROUP = "tfplan.backends"
BUILTIN: dict[str, str] = {
    "process": "tfplan.backends.process:ProcessBackend",
    "slurm": "tfplan.backends.slurm:SlurmBackend",
    "kubernetes": "tfplan.backends.kubernetes:KubernetesBackend",
    "spark": "tfplan.backends.spark:SparkBackend",
}


def _registered() -> dict[str, str]:
    """name -> "module:attr": the built-in ones, then any installed entry point."""
    from importlib import metadata  # scans every installed package: only when needed

    found = dict(BUILTIN)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry.value)
    return found


def available() -> list[str]:
    return sorted(_registered())


def backend_class(name: str) -> type[Backend]:
    """The backend class registered as ``name``.

    Raises:
        ConfigError: no backend of that name (the message lists the known ones), or its module
            cannot be imported.
    """
    from tfplan.backends.api import Backend

    registered = dict(BUILTIN) if name in BUILTIN else _registered()
    if name not in registered:
        raise ConfigError(
            "cluster.backend", f"unknown backend {name!r}", f"available: {', '.join(available())}"
        )
    module_name, _, attr = registered[name].partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ConfigError(
            "cluster.backend",
            f"backend {name!r} cannot be loaded ({error})",
            "install what it needs (pip install 'tfplan[<backend>]')",
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(
            "cluster.backend", f"{registered[name]} is not a tfplan Backend", "fix its entry point"
        )
    return cls


def open_backend(ref: BackendRef, scratch: Path) -> Backend:
    """A backend instance for a plan's or a state's reference (connects lazily)."""
    return backend_class(ref.name)(ref, scratch)
