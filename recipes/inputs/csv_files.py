"""``data.name=csv``: delimited text files, one record a line.

The columns are planned once from the first lines of the first file (:func:`_csv_plan`: names,
types, which columns to read) without TensorFlow, so that the planner checks a header too; the
records are then read by ``CsvDataset``, which converts only the selected columns, in C++.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from recipes.config import DataConf, FeatureConf
from recipes.errors import InputError
from recipes.inputs.files import _train_files
from recipes.inputs.lazy import _tf
from recipes.inputs.peek import _check_compression, _head
from recipes.inputs.specs import _conf_features, _dtype, _Feat, _shape

READ_BUFFER = 256 * 1024  # bytes, per open file


@dataclass(frozen=True)
class _CsvPlan:
    columns: tuple[str, ...]
    select: tuple[int, ...]  # column indices, increasing (CsvDataset's order)
    selected: tuple[_Feat, ...]  # the same, as features (the label among them)
    feats: dict[str, _Feat]
    label: _Feat


def _csv_lines(path: str, compression: str, delim: str, key: str, n: int = 2) -> list[list[str]]:
    size = 64 * 1024
    while True:
        raw = _head(path, compression, size, key)
        lines = raw.splitlines()
        complete = raw.count(b"\n") >= n or len(raw) < size or size >= 16 << 20
        if complete:
            text = b"\n".join(lines[:n]).decode("utf-8", errors="replace")
            return [row for row in csv.reader(io.StringIO(text), delimiter=delim)][:n]
        size *= 4


def _infer_csv_dtype(value: str, is_label: bool) -> str:
    try:
        int(value)
        return "int64" if is_label else "float32"
    except ValueError:
        pass
    try:
        float(value)
        return "float32"
    except ValueError:
        return "string"


def _csv_plan(data: DataConf, files: list[str], key: str = "data.train") -> _CsvPlan:
    compression = _check_compression(data)
    delim = data.field_delim
    if len(delim) != 1:
        raise InputError(f"data.field_delim={delim!r}: give one character, e.g. ',' or '\\t'")
    first = files[0]
    rows = _csv_lines(first, compression, delim, key, 2)
    where = os.path.basename(first)
    if data.header:
        if not rows:
            raise InputError(f"{key}: {first} is empty, it has no header line (data.header=true)")
        columns = tuple(c.strip() for c in rows[0])
        body = rows[1] if len(rows) > 1 else None
        if data.columns and tuple(data.columns) != columns:
            raise InputError(
                f"data.columns={list(data.columns)} disagree with the header of {where} "
                f"({', '.join(columns)}): remove data.columns, or set data.header=false"
            )
    else:
        if not data.columns:
            raise InputError(
                "data.columns is empty and data.header=false: list the column names in "
                "file order, e.g. data.columns=[a,b,label]"
            )
        columns = tuple(str(c) for c in data.columns)
        body = rows[0] if rows else None
    if len(set(columns)) != len(columns):
        raise InputError(f"{key}: the columns of {where} repeat a name ({', '.join(columns)})")
    if body is not None and len(body) != len(columns):
        raise InputError(
            f"{'data.field_delim' if len(body) == 1 else 'data.columns'}: the first record of "
            f"{where} has {len(body)} fields but there are {len(columns)} columns "
            f"({', '.join(columns)}): check data.field_delim={delim!r} and the header/columns"
        )
    conf = _conf_features(data)
    label = data.label
    names = list(conf) if conf else [c for c in columns if c != label]
    if label not in names:
        names.append(label)
    source = "the header of " + where if data.header else "data.columns"
    feats: dict[str, _Feat] = {}
    for name in names:
        fc = conf.get(name, FeatureConf())
        fkey = f"data.features.{name}"
        if name not in columns:
            if name == label:
                raise InputError(
                    f"data.label={label!r} is not a column of {source} (columns: "
                    f"{', '.join(columns)}): set data.label to one of them"
                )
            raise InputError(
                f"data.features.{name} is not a column of {source} (columns: "
                f"{', '.join(columns)}): fix the name or remove it"
            )
        col = columns.index(name)
        dtype = _dtype(name, fc.dtype)
        value = body[col].strip() if body is not None else None
        if dtype is None:
            dtype = _infer_csv_dtype(value, name == label) if value else "float32"
        shape = _shape(name, fc.shape)
        if shape is not None and int(np.prod(shape)) != 1:
            raise InputError(
                f"{fkey}.shape={list(shape)}: a csv column holds one value per record; "
                "use shape [] (or [1])"
            )
        if value is not None:
            if value == "" and fc.default is None:
                raise InputError(
                    f"{fkey}: column {name!r} is empty in the first record of {where}: give "
                    f"{fkey}.default"
                )
            if value and dtype in ("int32", "int64"):
                try:
                    int(value)
                except ValueError:
                    fix = "float32" if _infer_csv_dtype(value, False) != "string" else "string"
                    raise InputError(
                        f"{fkey}.dtype={dtype}: column {name!r} holds {value!r} in the first "
                        f"record of {where}: set {fkey}.dtype={fix}"
                    ) from None
            if value and dtype in ("float32", "float64"):
                try:
                    float(value)
                except ValueError:
                    raise InputError(
                        f"{fkey}.dtype={dtype}: column {name!r} holds {value!r} in the first "
                        f"record of {where}: set {fkey}.dtype=string"
                    ) from None
        feats[name] = _Feat(name, dtype, shape if shape is not None else (), fc.default, fkey)
    lab = feats.pop(label)
    order = sorted([*feats.values(), lab], key=lambda f: columns.index(f.name))
    return _CsvPlan(
        columns=columns,
        select=tuple(columns.index(f.name) for f in order),
        selected=tuple(order),
        feats=feats,
        label=lab,
    )


def _csv_reader(data: DataConf, plan: _CsvPlan) -> Callable[[Any], Any]:
    tf = _tf()
    compression = _check_compression(data)
    defaults = []
    for f in plan.selected:
        if f.default is None:
            defaults.append(tf.constant([], tf.as_dtype(f.dtype)))
        else:
            try:
                if f.dtype == "string":
                    value: Any = str(f.default)
                elif f.dtype.startswith("int"):
                    value = int(f.default)
                else:
                    value = float(f.default)
            except (TypeError, ValueError):
                raise InputError(f"{f.key}.default={f.default!r} is not a {f.dtype}") from None
            defaults.append(tf.constant([value], tf.as_dtype(f.dtype)))

    def read(files: Any) -> Any:
        return tf.data.experimental.CsvDataset(
            files,
            defaults,
            compression_type=compression or None,
            buffer_size=READ_BUFFER,
            header=bool(data.header),
            field_delim=data.field_delim,
            select_cols=list(plan.select),
        )

    return read


def _csv_pair(plan: _CsvPlan) -> Callable[..., Any]:
    tf = _tf()
    names = list(plan.feats)
    index = {f.name: i for i, f in enumerate(plan.selected)}

    def to_pair(*cols: Any) -> Any:
        out = {}
        for f in [*plan.feats.values(), plan.label]:
            t = cols[index[f.name]]
            if f.shape:
                t = tf.reshape(t, [-1, *f.shape])
            out[f.name] = t
        feats = out[names[0]] if len(names) == 1 else {n: out[n] for n in names}
        return feats, out[plan.label.name]

    return to_pair


def _csv_field_name(data: DataConf, field: int) -> str:
    """The name of the ``field``-th column read (CsvDataset's errors count the selected columns
    only), for a message naming its key; "" when it cannot be told."""
    try:
        plan = _csv_plan(data, _train_files(data))
        return plan.selected[field].name
    except (InputError, IndexError):
        return ""
