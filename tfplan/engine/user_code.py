"""Find the user's packages that a config names, so that apply can ship them to every host.

``model._target_=my_pkg.models.build`` (and ``data._target_``, a dotted ``model.loss``) names a
top-level package or module, ``my_pkg``: it is looked up in ``recipe.code_dir`` (default: the
directory tfplan runs in) as ``my_pkg/`` or ``my_pkg.py``, and recorded in the plan with its
size and a digest of its files (a change to the code restarts the tasks, as a change to the
config does). A package that is not there but is installed in this environment (``pip install``)
is not shipped: the hosts must have it installed too, which the plan says. Nothing is imported
here: the user's code runs only in the tasks (and preflight).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tfplan.backends.staging import package_files
from tfplan.config.callables import named_targets
from tfplan.errors import ConfigError
from tfplan.files import files_digest
from tfplan.planning.plan import UserCode

if TYPE_CHECKING:
    from tfplan.config.schema import Config

__all__ = ["find_user_code"]

# Names the tasks import from elsewhere: never shipped from the user's folder.
_PROVIDED = frozenset({"recipes", "tensorflow", "keras", "tf_keras", "numpy", "builtins"})


def _describe(name: str, source: Path, keys: tuple[str, ...]) -> UserCode:
    files = package_files(source)
    total = sum(path.stat().st_size for path in files)
    digest = files_digest(files, source.parent)[:16]
    return UserCode(name, str(source), len(files), total, digest, keys)


def find_user_code(cfg: Config, cwd: str) -> tuple[UserCode, ...]:
    """The packages of the user's that ``cfg`` names, found in ``recipe.code_dir``.

    Raises:
        ConfigError: a named package is neither in ``recipe.code_dir`` nor installed here.
    """
    targets = named_targets(cfg)
    if not targets:
        return ()
    code_dir = Path(cwd, os.path.expanduser(cfg.recipe.code_dir or "."))
    code_key = "recipe.code_dir"
    shown = f"{code_key}={code_dir}" + ("" if cfg.recipe.code_dir else " (the current directory)")
    by_name: dict[str, list[str]] = {}
    for key, target in targets:
        if "." not in target:
            raise ConfigError(
                key, f"{target!r} is not a dotted path", "name a callable: my_pkg.module.function"
            )
        by_name.setdefault(target.split(".", 1)[0], []).append(key)
    found = []
    for name, keys in sorted(by_name.items()):
        if name in _PROVIDED:
            continue
        package, module = code_dir / name, code_dir / f"{name}.py"
        if package.is_dir():
            found.append(_describe(name, package, tuple(keys)))
        elif module.is_file():
            found.append(_describe(name, module, tuple(keys)))
        elif importlib.util.find_spec(name) is None:
            raise ConfigError(
                keys[0],
                f"no package {name!r} in {shown}, and none installed",
                f"run tfplan in the folder that holds {name}/ (or {name}.py), or set "
                f"{code_key}=/path/to/that/folder",
            )
    return tuple(found)
