"""``data.name=npz``: numpy ``.npz`` files, and the random access to rows that the array
pipelines read (:class:`_Columns`, shared with the in-memory sets).

The arrays' shapes and dtypes are read from the ``.npy`` headers inside the zip, never from the
data, so that checking a file (plan time included) costs nothing; an array stored uncompressed is
memory-mapped where it lies in the zip, so that a set larger than memory can be read.
"""

from __future__ import annotations

import os
import struct
import zipfile
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from recipes.config import DataConf, FeatureConf
from recipes.errors import InputError
from recipes.inputs.specs import _conf_features, _dtype, _Feat, _shape


@dataclass(frozen=True)
class _Member:
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    offset: Optional[int]  # where the data starts in the .npz, when stored uncompressed


def _read_npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    fmt = np.lib.format
    version = fmt.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = fmt.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = fmt.read_array_header_2_0(f)
    else:
        # v3.0 has no public reader
        shape, fortran, dtype = fmt._read_array_header(f, version)  # type: ignore[attr-defined]
    return tuple(shape), bool(fortran), np.dtype(dtype)


def _npz_members(path: str, key: str) -> dict[str, _Member]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise InputError(f"{key}: {path} is not an .npz file ({e})") from None
    out: dict[str, _Member] = {}
    with zf, open(path, "rb") as raw:
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            try:
                with zf.open(info) as f:
                    shape, fortran, dtype = _read_npy_header(f)
                    header_len = f.tell()
            except (ValueError, OSError, zipfile.BadZipFile) as e:
                raise InputError(f"{key}: {path}: cannot read {info.filename} ({e})") from None
            offset = None
            if info.compress_type == zipfile.ZIP_STORED and not dtype.hasobject:
                raw.seek(info.header_offset)
                local = raw.read(30)
                n_name, n_extra = struct.unpack("<HH", local[26:30])
                offset = info.header_offset + 30 + n_name + n_extra + header_len
            out[info.filename[:-4]] = _Member(shape, dtype, fortran, offset)
    return out


def _np_target(name: str, dtype: np.dtype) -> str:
    if dtype.kind in "US":
        return "string"
    if dtype.kind in "iub":
        return "int64"
    if dtype.kind == "f":
        return "float32"
    raise InputError(
        f"data.features.{name}: arrays of dtype {dtype} cannot be fed; use numbers or strings"
    )


class _Columns:
    """Random access to the rows of named columns: in-memory arrays, or the members of several
    .npz files (memory-mapped when stored uncompressed), concatenated."""

    def __init__(
        self,
        names: list[str],
        sources: list[Any],  # per part: a dict name -> array, or an .npz path
        counts: list[int],
        dtypes: dict[str, str],
        shapes: dict[str, tuple[int, ...]],
        members: Optional[list[dict[str, _Member]]] = None,
    ) -> None:
        self.names, self.sources, self.dtypes, self.shapes = names, sources, dtypes, shapes
        self.members = members
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self._open: dict[int, dict[str, Any]] = {}

    def _part(self, i: int) -> dict[str, Any]:
        if i not in self._open:
            src = self.sources[i]
            if isinstance(src, dict):
                self._open[i] = src
            else:
                arrays: dict[str, Any] = {}
                loaded = None
                for name in self.names:
                    m = self.members[i][name] if self.members else None
                    if m is not None and m.offset is not None and int(np.prod(m.shape)) > 0:
                        arrays[name] = np.memmap(
                            src,
                            dtype=m.dtype,
                            mode="r",
                            offset=m.offset,
                            shape=m.shape,
                            order="F" if m.fortran else "C",
                        )
                    else:
                        if loaded is None:
                            loaded = np.load(src, allow_pickle=False)
                        arrays[name] = loaded[name]
                self._open[i] = arrays
        return self._open[i]

    def _cast(self, name: str, a: np.ndarray) -> np.ndarray:
        a = a.reshape((len(a), *self.shapes[name]))
        if self.dtypes[name] == "string":
            return np.char.encode(a, "utf-8") if a.dtype.kind == "U" else a.astype(np.bytes_)
        return np.ascontiguousarray(a, dtype=self.dtypes[name])

    def take(self, rows: np.ndarray) -> list[np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        if len(self.sources) == 1:
            part = self._part(0)
            return [self._cast(n, np.asarray(part[n][rows])) for n in self.names]
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        cols: list[Optional[np.ndarray]] = [None] * len(self.names)
        for i in np.unique(which):
            mask = which == i
            local = rows[mask] - self.offsets[i]
            part = self._part(int(i))
            for k, n in enumerate(self.names):
                values = self._cast(n, np.asarray(part[n][local]))
                col = cols[k]
                if col is None:
                    col = cols[k] = np.empty((len(rows), *values.shape[1:]), values.dtype)
                col[mask] = values
        if cols[0] is None:
            return [
                np.empty(
                    (0, *self.shapes[n]),
                    self.dtypes[n] if self.dtypes[n] != "string" else np.bytes_,
                )
                for n in self.names
            ]
        return cols  # type: ignore[return-value]


def _npz_table(
    data: DataConf, files: list[str], key: str
) -> tuple[_Columns, dict[str, _Feat], _Feat]:
    conf = _conf_features(data)
    label = data.label
    members = [_npz_members(p, key) for p in files]
    first = members[0]
    names = list(conf) if conf else [n for n in first if n != label]
    if label not in names:
        names.append(label)
    counts = []
    for path, mem in zip(files, members, strict=True):
        where = os.path.basename(path)
        for name in names:
            if name not in mem:
                have = ", ".join(mem) or "none"
                if name == label:
                    raise InputError(
                        f"data.label={label!r}: {where} has no array {name!r} (it has: {have}): "
                        "set data.label to one of them"
                    )
                raise InputError(
                    f"data.features.{name}: {where} has no array {name!r} (it has: {have}): "
                    "fix the name or remove it"
                )
            if len(mem[name].shape) == 0:
                raise InputError(f"data.features.{name}: {where}'s {name!r} is a scalar, not rows")
        rows = {n: mem[n].shape[0] for n in names}
        if len(set(rows.values())) != 1:
            raise InputError(
                f"{key}: the arrays of {where} have different numbers of rows "
                f"({', '.join(f'{n}: {r}' for n, r in rows.items())})"
            )
        counts.append(rows[names[0]])
    feats: dict[str, _Feat] = {}
    for name in names:
        fc = conf.get(name, FeatureConf())
        fkey = f"data.features.{name}"
        per = first[name].shape[1:]
        for path, mem in zip(files[1:], members[1:], strict=True):
            if mem[name].shape[1:] != per:
                raise InputError(
                    f"{key}: {name!r} has examples of shape {list(per)} in "
                    f"{os.path.basename(files[0])} but {list(mem[name].shape[1:])} in "
                    f"{os.path.basename(path)}"
                )
        shape = _shape(name, fc.shape)
        if not shape:  # None, or [] (the schema's default): as in the file
            shape = per
        elif int(np.prod(shape)) != int(np.prod(per)):
            raise InputError(
                f"{fkey}.shape={list(shape)}: {os.path.basename(files[0])} holds {name!r} "
                f"examples of shape {list(per)}: set {fkey}.shape={list(per)}"
            )
        dtype = _dtype(name, fc.dtype) or _np_target(name, first[name].dtype)
        if (dtype == "string") != (first[name].dtype.kind in "US"):
            raise InputError(
                f"{fkey}.dtype={dtype}: {os.path.basename(files[0])} holds {name!r} as "
                f"{first[name].dtype}: set {fkey}.dtype={_np_target(name, first[name].dtype)}"
            )
        feats[name] = _Feat(name, dtype, tuple(shape), None, fkey)
    lab = feats.pop(label)
    table = _Columns(
        [*feats, label],
        list(files),
        counts,
        {n: f.dtype for n, f in [*feats.items(), (label, lab)]},
        {n: f.shape for n, f in [*feats.items(), (label, lab)]},
        members,
    )
    return table, feats, lab
