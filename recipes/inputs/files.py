"""Where the data files are, what kind of source ``data.name`` is, and how the workers split it.

The planner calls these at plan time (:func:`sharding_reason` for the plan, and through
:func:`recipes.inputs.check_static`), on a machine that may have no TensorFlow: this module
imports neither TensorFlow nor numpy (``tests/test_recipes_inputs.py`` checks it). Only a path
with a scheme (``gs://``, ``hdfs://``) needs TensorFlow's file systems, and imports them then.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from recipes.config import DataConf
from recipes.errors import InputError
from recipes.inputs.lazy import _plain_python, _tf
from recipes.vocabulary import FILE_SOURCES, IN_MEMORY_SOURCES

DATA_ROOT_ENV = "TFPLAN_DATA_ROOT"


def data_root() -> str:
    """The folder relative data paths are relative to: ``$TFPLAN_DATA_ROOT``, else the cwd."""
    root = os.environ.get(DATA_ROOT_ENV, "").strip()
    return os.path.abspath(os.path.expanduser(root)) if root else os.getcwd()


def _root_note() -> str:
    if os.environ.get(DATA_ROOT_ENV, "").strip():
        return f"relative paths are relative to {DATA_ROOT_ENV}={data_root()}"
    return (
        f"relative paths are relative to the current directory {os.getcwd()}; "
        f"{DATA_ROOT_ENV} changes that"
    )


_MAGIC = re.compile(r"[*?[]")


@_plain_python
def resolve_files(pattern_or_list: Any, key: str) -> list[str]:
    """Absolute paths of the files that a path, a glob pattern or a list of them name, sorted
    and deduplicated.

    Raises:
        InputError: nothing given, a pattern that matches no file, a missing file, or a folder.
    """
    if isinstance(pattern_or_list, (str, os.PathLike)):
        patterns = [os.fspath(pattern_or_list)]
    else:
        patterns = [os.fspath(p) for p in (pattern_or_list or ())]
    if not patterns or not all(p.strip() for p in patterns):
        raise InputError(
            f"{key} is not set: give a file, a glob such as 'data/*.tfrecord', or a list"
        )
    found: set[str] = set()
    for pattern in patterns:
        if "://" in pattern:  # gs://, hdfs://, s3://: TensorFlow's file systems
            gfile = _tf().io.gfile
            matches = gfile.glob(pattern) if _MAGIC.search(pattern) else [pattern]
            if not matches or not all(gfile.exists(m) for m in matches):
                raise InputError(f"{key}={pattern!r} matches no file: check the path")
            found.update(matches)
            continue
        path = os.path.expanduser(pattern)
        where = ""
        if not os.path.isabs(path):
            path = os.path.join(data_root(), path)
            where = f" ({_root_note()})"
        path = os.path.normpath(path)
        if _MAGIC.search(pattern):
            import glob

            matches = [m for m in glob.glob(path, recursive=True) if os.path.isfile(m)]
            if not matches:
                raise InputError(f"{key}={pattern!r} matches no file: check the path{where}")
            found.update(os.path.abspath(m) for m in matches)
        elif os.path.isdir(path):
            raise InputError(
                f"{key}={pattern!r} is a folder: name its files, e.g. "
                f"{key}='{pattern.rstrip('/')}/*'"
            )
        elif not os.path.isfile(path):
            raise InputError(f"{key}={pattern!r}: no such file{where}")
        else:
            found.add(path)
    return sorted(found)


@_plain_python
def source_kind(data: DataConf) -> str:
    """``memory``, ``tfrecord``, ``csv``, ``npz`` or ``factory``.

    Raises:
        InputError: an unknown ``data.name``, or ``data.name=factory`` without ``data._target_``.
    """
    if data.target:
        return "factory"
    if data.name == "factory":
        raise InputError(
            "data._target_ is not set: data=factory needs data._target_=my_pkg.data.make"
        )
    if data.name in FILE_SOURCES:
        return data.name
    if data.name in IN_MEMORY_SOURCES:
        return "memory"
    raise InputError(
        f"data.name={data.name!r} is not a data source: use one of "
        f"{', '.join(FILE_SOURCES + IN_MEMORY_SOURCES)}, or data._target_=my_pkg.data.make"
    )


def _train_files(data: DataConf) -> list[str]:
    return resolve_files(data.train, "data.train")


def _eval_files(data: DataConf) -> Optional[list[str]]:
    return resolve_files(data.eval, "data.eval") if data.eval else None


@_plain_python
def eval_source(data: DataConf) -> str:
    """One line saying what the evaluation reads."""
    kind = source_kind(data)
    if kind == "memory":
        return f"the held-out split of {data.name} (data.eval_fraction={data.eval_fraction})"
    if kind == "factory":
        return f"data._target_={data.target} with split='eval'"
    if data.eval:
        return f"data.eval={_show(data.eval)}"
    return (
        f"the first {data.eval_examples} records of data.train (data.eval is not set; "
        "they are trained on too)"
    )


def _show(paths: Any) -> str:
    if isinstance(paths, (str, os.PathLike)):
        return repr(os.fspath(paths))
    paths = list(paths)
    return repr(paths[0]) if len(paths) == 1 else repr(paths)


# -------------------------------------------------------------------------------- sharding


def _sharding(
    data: DataConf, num_shards: int, files: Optional[list[str]] = None
) -> tuple[str, str]:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    kind = source_kind(data)
    if data.shard not in ("auto", "file", "record", "none"):
        raise InputError(f"data.shard={data.shard!r}: use auto, file, record or none")
    if data.shard == "none":
        return "none", (
            f"not split (data.shard=none): each of {num_shards} workers reads all of it, in its "
            "own order (workers can join and leave a running job)"
        )
    if kind == "factory":
        return "factory", (
            f"data._target_={data.target} is given shard_index and num_shards={num_shards} "
            "and shards its own data"
        )
    if kind == "memory":
        if data.shard == "file":
            raise InputError(
                f"data.shard=file: data.name={data.name} is one in-memory array; "
                "use data.shard=auto or record"
            )
        return "record", (
            f"{data.name} is held in memory: each of {num_shards} workers takes every "
            f"{num_shards}-th example"
        )
    n_files = len(files if files is not None else _train_files(data))
    if data.shard == "file" or (data.shard == "auto" and n_files >= num_shards):
        if n_files < num_shards:
            raise InputError(
                f"data.shard=file: data.train has {n_files} files for {num_shards} workers, so "
                "some would get none: use data.shard=record (or auto), or split the data into "
                f"at least {num_shards} files"
            )
        lo, hi = n_files // num_shards, -(-n_files // num_shards)
        each = f"{lo}" if lo == hi else f"{lo}-{hi}"
        return "file", f"by file: {n_files} files for {num_shards} workers ({each} each)"
    why = "data.shard=record" if data.shard == "record" else "fewer files than workers"
    return "record", (
        f"by record ({why}): {n_files} file(s) for {num_shards} workers; each reads every "
        f"file and keeps every {num_shards}-th record"
    )


@_plain_python
def sharding(data: DataConf, num_shards: int) -> str:
    """How the train data is split between ``num_shards`` workers: ``"file"`` or ``"record"``
    (``"factory"`` for ``data._target_``, which shards its own data).

    Raises:
        InputError: a bad ``data.shard``, ``data.name`` or ``data.train``.
    """
    return _sharding(data, num_shards)[0]


@_plain_python
def sharding_reason(data: DataConf, num_shards: int) -> str:
    """:func:`sharding`'s choice and why, in one line (for the plan)."""
    return _sharding(data, num_shards)[1]
