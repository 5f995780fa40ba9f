"""The one importer of the user's dotted callables (``model._target_``, ``data._target_``, a
dotted ``model.loss``), used by the tasks, the plan-time model inspection and the planner's
checks alike, so that all of them find the user's package the same way.

``my_pkg.models.build`` is split at each dot from the right until a module imports
(``my_pkg.models`` + ``build``, then ``my_pkg`` + ``models.build``), as Hydra's ``_target_``
does. Three outcomes are told apart, each one line naming the key:
- the module is not there (:class:`TargetError`, exit 2: put its folder in ``recipe.code_dir``);
- the module is there but importing it failed: a dependency it imports is missing
  (:class:`TargetError`) or its own code raised (:class:`UserCodeError`, exit 1, traceback kept);
- the module has no such attribute, or it is not callable (:class:`TargetError`).

Stdlib only: the planner calls :func:`find_target` without importing TensorFlow or the user's
code.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from typing import Any, Callable

from recipes.errors import TargetError, UserCodeError

__all__ = ["find_target", "import_target"]

_SHIP = (
    "put its folder in recipe.code_dir (default: the folder tfplan runs in) so that tfplan ships it"
)


def _parts(target: str, key: str) -> list[str]:
    parts = str(target or "").split(".")
    if len(parts) < 2 or not all(parts):
        raise TargetError(
            f"{key}={target!r} is not a dotted path to a function: use my_pkg.module.function"
        )
    return parts


def _is_missing(error: ModuleNotFoundError, name: str) -> bool:
    """Whether ``error`` says that ``name`` itself (or a parent package of it) is not there,
    rather than something ``name`` imports."""
    return bool(error.name) and (name == error.name or name.startswith(f"{error.name}."))


def import_target(target: str, key: str) -> Callable[..., Any]:
    """The callable ``target`` names, imported.

    Raises:
        TargetError: not a dotted path, no such module or attribute, a dependency of the
            module that is not installed, or not callable.
        UserCodeError: the user's module raised while it was imported.
    """
    parts = _parts(target, key)
    missing: ModuleNotFoundError | None = None
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if _is_missing(e, name):
                missing = missing or e
                continue
            raise TargetError(
                f"{key}={target}: importing {name} failed: {e}: install it where the tasks "
                "run, or ship its package with your code"
            ) from None
        except Exception as e:  # noqa: BLE001 - the user's module raised while importing
            raise UserCodeError(key, target, e, f"failed: importing {name} raised") from e
        obj: Any = module
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise TargetError(
                f"{key}={target}: {name} has no attribute {'.'.join(parts[cut:])!r}: check the name"
            ) from None
        if not callable(obj):
            raise TargetError(
                f"{key}={target} is a {type(obj).__name__}, not a function: name a callable"
            )
        return obj  # type: ignore[no-any-return]
    raise TargetError(f"{key}={target}: cannot import {parts[0]} ({missing}): {_SHIP}")


def find_target(target: str, key: str, search_path: Sequence[str] = ()) -> None:
    """Check, without importing anything, that the top-level module of ``target`` can be found
    in ``search_path`` (the user's ``recipe.code_dir``, which tfplan ships to the tasks) or
    among the installed packages.

    Raises:
        TargetError: not a dotted path, or no such module.
    """
    top = _parts(target, key)[0]
    if importlib.machinery.PathFinder.find_spec(top, [*search_path, *sys.path]) is not None:
        return
    # installed through a meta-path finder (an editable install), built in, or imported already
    if top in sys.modules or importlib.util.find_spec(top) is not None:
        return
    raise TargetError(f"{key}={target}: cannot find the module {top}: {_SHIP}")
