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
    name -> (dtype, number of values). No TensorFlow: the planner checks a TFRecord source's
    label and features with it."""
    for path in files[:16]:
        raw = _first_record(path, compression, key)
        if raw is None:
            continue
        try:
            return path, example_features(raw)
        except ValueError:
            raise InputError(f"{key}: the records of {path} are not tf.Example protos") from None
    raise InputError(f"{key}: {files[0]} (and the files after it) hold no record")


# tf.train.Example's wire format (tensorflow/core/example/{example,feature}.proto): Example
# {1: Features}, Features {1: repeated map entry {1: name, 2: Feature}}, Feature {oneof 1:
# BytesList, 2: FloatList, 3: Int64List}, each list {1: repeated value (packed or not)}.
_KINDS = {1: "string", 2: "float32", 3: "int64"}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: bytes) -> list[tuple[int, int, bytes]]:
    """(field number, wire type, payload) of every field of one protobuf message (a varint's
    payload is left empty: only its presence is counted)."""
    out: list[tuple[int, int, bytes]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
            out.append((number, wire, b""))
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise ValueError("truncated field")
            out.append((number, wire, buf[pos : pos + length]))
            pos += length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            out.append((number, wire, buf[pos : pos + size]))
            pos += size
        else:
            raise ValueError(f"wire type {wire}")
    return out


def _count_values(kind: int, values: bytes) -> int:
    """How many values one BytesList, FloatList or Int64List holds."""
    count = 0
    for number, wire, payload in _fields(values):
        if number != 1:
            continue
        if kind == 2 and wire == 2:  # packed floats
            count += len(payload) // 4
        elif kind == 3 and wire == 2:  # packed varints
            packed, pos = payload, 0
            while pos < len(packed):
                _, pos = _varint(packed, pos)
                count += 1
        else:
            count += 1
    return count


def example_features(raw: bytes) -> dict[str, tuple[str, int]]:
    """A serialized tf.train.Example's features, name -> (dtype, number of values).

    Raises:
        ValueError: the bytes are not an Example.
    """
    out: dict[str, tuple[str, int]] = {}
    for number, wire, features in _fields(raw):
        if number != 1 or wire != 2:
            continue
        for entry_number, entry_wire, entry in _fields(features):
            if entry_number != 1 or entry_wire != 2:
                continue
            name, kind, count = "", 0, 0
            for field_number, _, payload in _fields(entry):
                if field_number == 1:
                    name = payload.decode()
                elif field_number == 2:
                    for k, _, values in _fields(payload):
                        if k in _KINDS:
                            kind, count = k, _count_values(k, values)
            out[name] = (_KINDS.get(kind, "float32"), count)
    return out
