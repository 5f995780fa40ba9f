"""Composed configs kept between tfplan's runs: a repeated plan or apply skips Hydra's composition.

Hydra composes a config in about 0.4 s of CPU (reading and merging every group's file against
the schema), most of a `tfplan plan`'s own time, and the same composition is done again by the
`tfplan apply` that follows a plan, by each re-apply of an experiment, by a resumed run. The
result depends only on what this module keys it by:

- the overrides, as given (their order included);
- the config tree Hydra reads (its resolved path, and tfplan's own tree searched after a tree
  of the user's groups) and the content of every ``.yaml`` file under both;
- the code that composes: tfplan's ``config`` package and its Hydra search-path plugin (their
  sources), and the installed Hydra and OmegaConf.

A composition that could read anything else is never kept: a file or override with a
resolver (``${oc.env:...}``, ``${now:...}``, anything ``${name:...}``) is composed every time.
Interpolations between keys (``${experiment.id}``) are part of the tree and are kept.

The value is the composed, resolved ``DictConfig`` (pickled: it keeps each node's schema), in
``<cache>/compose/<key>.pickle`` (``<cache>``: ``$TFPLAN_CACHE_DIR``, else
``$XDG_CACHE_HOME/tfplan``, else ``~/.cache/tfplan``), written atomically; at most
:data:`KEPT` files, the oldest removed first. A file that cannot be read back (another Python,
a partial write) is a miss. ``TFPLAN_COMPOSE_CACHE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
from collections.abc import Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from tfplan.files import write_atomic

__all__ = ["KEPT", "cache_key", "load", "store", "user_cache_dir"]

KEPT = 500  # composed configs kept; the oldest go first
_RESOLVER = re.compile(r"\$\{\s*[\w.]+\s*:")  # ${name:...}: a resolver, whose value may change
_PACKAGE = Path(__file__).resolve().parent  # tfplan/config
_PLUGIN = _PACKAGE.parents[1] / "hydra_plugins" / "tfplan_searchpath"


def user_cache_dir() -> Path:
    """Where tfplan keeps what it learnt across projects: ``$TFPLAN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/tfplan``, else ``~/.cache/tfplan``."""
    chosen = os.environ.get("TFPLAN_CACHE_DIR")
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "tfplan")


@cache
def _code_digest() -> str:
    """tfplan's composing code and the installed Hydra and OmegaConf."""
    h = hashlib.sha256()
    for folder in (_PACKAGE, _PLUGIN):
        for path in sorted(folder.glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("hydra-core", "omegaconf"):
        try:
            h.update(f"{dist}={metadata.version(dist)}\0".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=?\0".encode())
    return h.hexdigest()


def cache_key(overrides: Sequence[str], trees: Sequence[Path]) -> str | None:
    """The key of composing ``overrides`` over the config ``trees`` (Hydra's primary folder
    first); None when the composition may read something the key does not cover (a resolver)
    or the cache is off."""
    if os.environ.get("TFPLAN_COMPOSE_CACHE", "1") == "0":
        return None
    if any(_RESOLVER.search(o) for o in overrides):
        return None
    h = hashlib.sha256(_code_digest().encode())
    h.update(repr(list(overrides)).encode())
    for tree in trees:
        h.update(b"\0tree\0" + str(tree).encode())
        for path in sorted(tree.rglob("*.yaml")) + sorted(tree.rglob("*.yml")):
            try:
                text = path.read_bytes()
            except OSError:
                return None
            if _RESOLVER.search(text.decode(errors="replace")):
                return None
            h.update(str(path.relative_to(tree)).encode() + b"\0" + text + b"\0")
    return h.hexdigest()[:32]


def _folder() -> Path:
    return user_cache_dir() / "compose"


def load(key: str) -> Any | None:
    """The composed config kept under ``key``, or None."""
    path = _folder() / f"{key}.pickle"
    try:
        with open(path, "rb") as f:
            composed = pickle.load(f)  # noqa: S301 - the user's own cache, written by store()
        os.utime(path)  # used: the last to be trimmed
        return composed
    except Exception:  # noqa: BLE001 - missing, partial, another version: a miss
        return None


def store(key: str, composed: Any) -> None:
    """Keep ``composed`` under ``key`` (atomically), then trim to :data:`KEPT` files; a cache
    that cannot be written is skipped."""
    folder = _folder()
    try:
        data = pickle.dumps(composed, protocol=pickle.HIGHEST_PROTOCOL)
        write_atomic(folder / f"{key}.pickle", data, mode=0o600)
        kept = sorted(folder.glob("*.pickle"), key=lambda p: p.stat().st_mtime)
        for old in kept[: max(0, len(kept) - KEPT)]:
            old.unlink(missing_ok=True)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return
