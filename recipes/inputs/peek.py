"""Reading the start of a data file without TensorFlow's readers: decompressing its head,
the first TFRecord record, the first tf.Example's features.

What a file holds is peeked at where the config leaves it out (a dtype, a shape, the features),
and to say which ``data.*`` key to fix when the config and the files disagree, before any
pipeline is built. ``data.compression`` is checked here, as every reader needs it.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from typing import Optional

from recipes.config import DataConf
from recipes.errors import InputError
from recipes.inputs.lazy import _tf


def _check_compression(data: DataConf) -> str:
    c = (data.compression or "").upper()
    if c in ("", "NONE", "NULL"):
        return ""
    if c not in ("GZIP", "ZLIB"):
        raise InputError(f"data.compression={data.compression!r}: use null, GZIP or ZLIB")
    return c


def _head(path: str, compression: str, n: int, key: str) -> bytes:
    """The first ``n`` bytes of a file's (decompressed) content, fewer at its end."""
    try:
        if compression == "GZIP":
            with gzip.open(path, "rb") as f:
                return f.read(n)
        with open(path, "rb") as f:
            if compression != "ZLIB":
                return f.read(n)
            z, out = zlib.decompressobj(), b""
            while len(out) < n:
                chunk = f.read(64 * 1024)
                if not chunk:
                    break
                out += z.decompress(chunk, n - len(out))
                while z.unconsumed_tail and len(out) < n:
                    out += z.decompress(z.unconsumed_tail, n - len(out))
            return out
    except (OSError, EOFError, zlib.error) as e:
        hint = "" if compression else " (a compressed file? set data.compression=GZIP or ZLIB)"
        extra = f" with data.compression={compression}" if compression else ""
        raise InputError(f"{key}: cannot read {path}{extra}: {e}{hint}") from None


def _first_record(path: str, compression: str, key: str) -> Optional[bytes]:
    head = _head(path, compression, 12, key)
    if not head:
        return None
    if len(head) < 12:
        raise InputError(f"{key}: {path} is not a TFRecord file (it is {len(head)} bytes long)")
    (length,) = struct.unpack("<Q", head[:8])
    size_hint = os.path.getsize(path) if not compression else 1 << 40
    if length > min(size_hint, 1 << 31):
        hint = "" if compression else " (compressed? set data.compression=GZIP or ZLIB)"
        raise InputError(f"{key}: {path} is not a TFRecord file{hint}")
    body = _head(path, compression, 12 + length, key)
    if len(body) < 12 + length:
        raise InputError(f"{key}: {path} is truncated: its first record is incomplete")
    return body[12 : 12 + length]


def _peek_example(
    files: list[str], compression: str, key: str
) -> tuple[str, dict[str, tuple[str, int]]]:
    """The first record of the first non-empty file (of the first 16): its features as
    name -> (dtype, number of values)."""
    tf = _tf()
    for path in files[:16]:
        raw = _first_record(path, compression, key)
        if raw is None:
            continue
        try:
            example = tf.train.Example.FromString(raw)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError
            raise InputError(f"{key}: the records of {path} are not tf.Example protos") from None
        out = {}
        for name, feature in example.features.feature.items():
            kind = feature.WhichOneof("kind")
            dtype = {"float_list": "float32", "int64_list": "int64", "bytes_list": "string"}.get(
                kind or "", "float32"
            )
            values = getattr(feature, kind).value if kind else ()
            out[name] = (dtype, len(values))
        return path, out
    raise InputError(f"{key}: {files[0]} (and the files after it) hold no record")
