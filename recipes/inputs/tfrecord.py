"""``data.name=tfrecord``: files of tf.Example records.

The features are resolved once, at build time, from ``data.features`` and the first record
(:func:`_tfrecord_feats`), so that a wrong name, dtype or shape is one line naming its key rather
than a parse error in the middle of training; the records are then parsed a batch at a time
(``tf.io.parse_example``: one op per batch, not per record).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import numpy as np

from recipes.config import DataConf, FeatureConf
from recipes.errors import InputError
from recipes.inputs.files import _train_files
from recipes.inputs.lazy import _tf
from recipes.inputs.peek import _check_compression, _peek_example
from recipes.inputs.specs import _conf_features, _dtype, _Feat, _shape


def _tfrecord_feats(
    data: DataConf, files: Optional[list[str]], key: str = "data.train", peek: bool = True
) -> tuple[dict[str, _Feat], _Feat]:
    conf = _conf_features(data)
    label = data.label
    needs_peek = (
        not conf
        or label not in conf
        or any(f.dtype is None or f.shape is None for f in conf.values())
    )
    record: Optional[dict[str, tuple[str, int]]] = None
    where = ""
    if needs_peek or peek:
        files = files if files is not None else _train_files(data)
        where, record = _peek_example(files, _check_compression(data), key)
        where = os.path.basename(where)
    names = list(conf) if conf else sorted(n for n in (record or {}) if n != label)
    if label not in names:
        names.append(label)
    feats: dict[str, _Feat] = {}
    for name in names:
        fc = conf.get(name, FeatureConf())
        fkey = f"data.features.{name}"
        dtype = _dtype(name, fc.dtype, ("float32", "int64", "string"))
        shape = _shape(name, fc.shape)
        if record is not None:
            if name not in record:
                if fc.default is None:
                    have = ", ".join(sorted(record)) or "none"
                    if name == label:
                        raise InputError(
                            f"data.label={label!r}: the records have no feature {name!r} "
                            f"(e.g. {where}; they have: {have}): set data.label to one of them"
                        )
                    raise InputError(
                        f"data.features.{name}: the records have no feature {name!r} (e.g. "
                        f"{where}; they have: {have}): fix the name, remove it, or give it a "
                        "default"
                    )
            else:
                r_dtype, count = record[name]
                if dtype is None:
                    dtype = r_dtype
                elif dtype != r_dtype:
                    raise InputError(
                        f"{fkey}.dtype={dtype}: the records hold {r_dtype} values for {name!r} "
                        f"(e.g. {where}): set {fkey}.dtype={r_dtype}"
                    )
                if shape is None:
                    shape = () if count == 1 else (count,)
                elif int(np.prod(shape)) != count:
                    raise InputError(
                        f"{fkey}.shape={list(shape)}: the records hold {count} values for "
                        f"{name!r} (e.g. {where}): set {fkey}.shape=[{count}] (or another "
                        f"shape of {count} values)"
                    )
        feats[name] = _Feat(
            name, dtype or "float32", shape if shape is not None else (), fc.default, fkey
        )
    lab = feats.pop(label)
    return feats, lab


def _parse_spec(feats: dict[str, _Feat], label: _Feat) -> dict[str, Any]:
    tf = _tf()
    spec = {}
    for f in [*feats.values(), label]:
        tf_dtype = tf.as_dtype(f.dtype)
        default = None
        if f.default is not None:
            np_dtype = object if f.dtype == "string" else f.dtype
            value = f.default.encode() if isinstance(f.default, str) else f.default
            try:
                default = np.broadcast_to(np.asarray(value, dtype=np_dtype), f.shape).tolist()
            except (TypeError, ValueError):
                raise InputError(
                    f"{f.key}.default={f.default!r} does not fit dtype {f.dtype} and shape "
                    f"{list(f.shape)}"
                ) from None
        spec[f.name] = tf.io.FixedLenFeature(list(f.shape), tf_dtype, default_value=default)
    return spec


def _tfrecord_reader(compression: str) -> Callable[[Any], Any]:
    tf = _tf()

    def read(files: Any) -> Any:
        return tf.data.TFRecordDataset(files, compression_type=compression or None)

    return read
