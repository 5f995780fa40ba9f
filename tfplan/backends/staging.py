"""What every backend puts where tasks read it: the built-in recipes, the user's packages and each
task's run.yaml."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Protocol

import yaml

from tfplan.planning.plan import Plan, UserCode

__all__ = ["RECIPES_DIR", "package_files", "run_yaml", "shipped_code", "ship_code"]

# The recipes package, shipped to <code_dir>/recipes so a host needs no tfplan.
RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


def run_yaml(plan: Plan) -> bytes:
    """The resolved experiment every task reads (docs/contract.md), as written to run.yaml."""
    return yaml.safe_dump(plan.run_config, sort_keys=True).encode()


class _Writer(Protocol):
    def put_tree(self, local_dir: Path, remote_dir: str) -> None: ...

    def write_file(self, path: str, data: bytes) -> None: ...


_SKIPPED_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".mypy_cache", ".pytest_cache"})
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


def package_files(source: Path) -> list[Path]:
    """The files shipped of a package folder (no caches, no hidden files) or a module file,
    sorted."""
    if source.is_file():
        return [source]
    files = []
    for root, dirs, names in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(names):
            if not name.endswith(_SKIPPED_SUFFIXES) and not name.startswith("."):
                files.append(Path(root) / name)
    return files


def shipped_code(plan: Plan) -> list[tuple[Path, str]]:
    """``(local source, path under code_dir)`` of everything a host needs beside run.yaml: the
    recipes (built-in recipes) and the user's packages (folders) or modules (``.py`` files)."""
    items: list[tuple[Path, str]] = []
    if plan.builtin_recipes:
        items.append((RECIPES_DIR, posixpath.join(plan.code_dir, "recipes")))
    for code in plan.user_code:
        items.append((Path(code.source), posixpath.join(plan.code_dir, _target_name(code))))
    return items


def _target_name(code: UserCode) -> str:
    return code.name if code.is_package else f"{code.name}.py"


def ship_code(plan: Plan, writer: _Writer) -> None:
    """Put :func:`shipped_code` on one host through its transport (``put_tree`` for folders,
    ``write_file`` for modules).

    Raises:
        BackendError: the host could not be written.
        OSError: a local source went away since the plan (then plan again).
    """
    for source, remote in shipped_code(plan):
        if source.is_dir():
            writer.put_tree(source, remote)
        else:
            writer.write_file(remote, source.read_bytes())
