"""Rows of a checkpoint's tensors read straight from its files, memory-mapped.

Why: TensorFlow's own readers (``tf.train.load_checkpoint``, ``RestoreV2`` with a slice spec)
read a stored tensor, or a stored slice, whole to give any rows of it: ten rows of a 256 MiB
slice cost 256 MiB of the reader's memory. A process that scores a model over a table larger
than itself (the evaluator, the chief's final scores) needs only the rows its batches ask for.

A V2 checkpoint (a "tensor bundle") is ``<prefix>.index``, an immutable sorted table (LevelDB's
format: blocks of prefix-compressed keys, an index block, a 48-byte footer) whose values are
``BundleEntryProto`` records (dtype, shape, data shard, offset, size), and
``<prefix>.data-<k>-of-<n>``, each numeric tensor stored raw in its shard at its offset, in
little-endian C order. A tensor saved in slices (a table split over the parameter servers) has
one entry listing its slices, and one entry per slice whose key is TensorFlow's ordered code of
the name and the slice's extents; the slice entries of one tensor sort by their first row.
:class:`Bundle` parses the index once and maps the data files (``numpy.memmap``): a row read is
a page read; nothing else of the tensor enters memory (pages the kernel may drop again).

Only what this needs is read: numeric tensors, slices along the first axis. A string tensor, a
compressed block, another slicing or a file that is not a local path raises
:class:`BundleError`, and the caller reads through TensorFlow instead. Checksums are not
verified here (TensorFlow checks a tensor's crc32c when it reads it whole); a torn file shows
as a short data file (:class:`BundleError`).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

__all__ = ["Bundle", "BundleError", "Entry"]

_MAGIC = 0xDB4775248B80FB57  # LevelDB's table magic, which TensorFlow's table keeps
_FOOTER = 48
_BLOCK_TRAILER = 5  # compression type (1 byte) + crc32c (4)

# TensorFlow's DataType enum -> the NumPy type its bytes are (types.proto)
_DTYPES = {
    1: np.float32,
    2: np.float64,
    3: np.int32,
    4: np.uint8,
    5: np.int16,
    6: np.int8,
    9: np.int64,
    10: np.bool_,
    17: np.uint16,
    19: np.float16,
    22: np.uint32,
    23: np.uint64,
}


class BundleError(Exception):
    """The bundle cannot be read here this way (the caller reads through TensorFlow)."""


@dataclass(frozen=True)
class Entry:
    """One stored tensor or slice: its NumPy type, shape, data shard and byte range."""

    dtype: Any
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _block(data: bytes, offset: int, size: int) -> list[tuple[bytes, bytes]]:
    """The (key, value) pairs of the table block at ``offset``."""
    if data[offset + size] != 0:
        raise BundleError("a compressed index block")
    raw = data[offset : offset + size]
    restarts = struct.unpack_from("<I", raw, len(raw) - 4)[0]
    end = len(raw) - 4 - 4 * restarts
    pairs, key, i = [], b"", 0
    while i < end:
        shared, i = _varint(raw, i)
        own, i = _varint(raw, i)
        length, i = _varint(raw, i)
        key = key[:shared] + raw[i : i + own]
        i += own
        pairs.append((key, raw[i : i + length]))
        i += length
    return pairs


def _table(data: bytes) -> list[tuple[bytes, bytes]]:
    """Every (key, value) pair of a whole table file, in key order."""
    if len(data) < _FOOTER or struct.unpack("<Q", data[-8:])[0] != _MAGIC:
        raise BundleError("not a checkpoint index (no table footer)")
    footer = data[-_FOOTER:]
    _, i = _varint(footer, 0)  # the metaindex block: unused
    _, i = _varint(footer, i)
    index_offset, i = _varint(footer, i)
    index_size, _ = _varint(footer, i)
    pairs = []
    for _, handle in _block(data, index_offset, index_size):
        offset, j = _varint(handle, 0)
        size, _ = _varint(handle, j)
        pairs.extend(_block(data, offset, size))
    return pairs


def _slice_name(key: bytes) -> Optional[str]:
    """The tensor name of a slice entry's key (ordered code: a 0 byte, the name with 0x00 and
    0xff escaped, terminated by 0x00 0x01, then the extents), or None for a plain entry."""
    if not key.startswith(b"\x00"):
        return None
    end = key.find(b"\x00\x01", 1)
    if end < 0:
        return None
    return key[1:end].replace(b"\x00\xff", b"\x00").replace(b"\xff\x00", b"\xff").decode()


class Bundle:
    """The entries of the checkpoint ``prefix`` and its data files, memory-mapped on first use.

    Raises (at construction):
        BundleError: the index is not readable this way, or not a local file.
    """

    def __init__(self, prefix: str) -> None:
        if "://" in prefix:
            raise BundleError(f"{prefix}: not a local file")
        self.prefix = prefix
        try:
            with open(prefix + ".index", "rb") as f:
                data = f.read()
        except OSError as e:
            raise BundleError(f"{prefix}.index: {e.strerror}") from None
        from tensorflow.core.protobuf import tensor_bundle_pb2  # protobuf classes only

        self.entries: dict[str, Entry] = {}
        self._sliced: dict[str, list[tuple[int, int]]] = {}  # name -> slices' row ranges
        self._slice_entries: dict[str, list[Entry]] = {}
        shards = 1
        for key, value in _table(data):
            if key == b"":
                header = tensor_bundle_pb2.BundleHeaderProto()
                header.ParseFromString(value)
                shards = max(1, header.num_shards)
                if header.endianness != header.LITTLE:
                    raise BundleError("a big-endian checkpoint")
                continue
            proto = tensor_bundle_pb2.BundleEntryProto()
            proto.ParseFromString(value)
            entry = Entry(
                _DTYPES.get(proto.dtype),
                tuple(int(d.size) for d in proto.shape.dim),
                int(proto.shard_id),
                int(proto.offset),
                int(proto.size),
            )
            whole = _slice_name(key)
            if whole is not None:
                self._slice_entries.setdefault(whole, []).append(entry)
                continue
            name = key.decode()
            self.entries[name] = entry
            if proto.slices:
                self._sliced[name] = sorted(self._rows_of(name, s, entry) for s in proto.slices)
        self._shards = shards
        self._maps: dict[int, Any] = {}

    @staticmethod
    def _rows_of(name: str, piece: Any, entry: Entry) -> tuple[int, int]:
        extents = list(piece.extent)
        # the other axes whole: no length (TensorFlow's "full"), or the tensor's own
        whole_rest = all(
            not e.HasField("length") or (e.start == 0 and e.length == size)
            for e, size in zip(extents[1:], entry.shape[1:], strict=False)
        )
        if not extents or not whole_rest or not extents[0].HasField("length"):
            raise BundleError(f"{name}: sliced along another axis than its rows")
        start = int(extents[0].start)
        return start, start + int(extents[0].length)

    def has(self, name: str) -> bool:
        return name in self.entries

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def slices(self, name: str) -> list[tuple[int, int]]:
        """The row ranges ``name`` is stored in, in order (all its rows when not sliced)."""
        if name in self._sliced:
            return list(self._sliced[name])
        shape = self.entries[name].shape
        return [(0, shape[0] if shape else 1)]

    def _array(self, entry: Entry, name: str) -> Any:
        """The stored bytes of ``entry`` as an array of its shape, memory-mapped."""
        if entry.dtype is None:
            raise BundleError(f"{name}: not a numeric tensor")
        expected = int(np.prod(entry.shape, dtype=np.int64)) * np.dtype(entry.dtype).itemsize
        if expected != entry.size:
            raise BundleError(f"{name}: {entry.size} bytes stored for {expected}")
        if entry.size == 0:
            return np.zeros(entry.shape, entry.dtype)
        data = self._map(entry.shard)
        if entry.offset + entry.size > len(data):
            raise BundleError(f"{name}: its data file is shorter than its entry (torn)")
        count = entry.size // np.dtype(entry.dtype).itemsize
        return np.frombuffer(data, entry.dtype, count, entry.offset).reshape(entry.shape)

    def map_data(self) -> None:
        """Map every data file now: a checkpoint deleted later (rotated away) stays readable
        through its maps until :meth:`close`.

        Raises:
            BundleError: a data file is missing or unreadable.
        """
        for shard in range(self._shards):
            self._map(shard)

    def _map(self, shard: int) -> Any:
        if shard not in self._maps:
            path = f"{self.prefix}.data-{shard:05d}-of-{self._shards:05d}"
            try:
                with open(path, "rb") as f:
                    self._maps[shard] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise BundleError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
        return self._maps[shard]

    def rows(self, name: str, ids: Any) -> Any:
        """Rows ``ids`` (integers, any order, repeats allowed) of the tensor ``name``, as a new
        array of ``len(ids)`` rows; only those rows' pages are read.

        Raises:
            KeyError: no such tensor. IndexError: an id outside its rows.
            BundleError: stored in a way this reader does not read.
        """
        entry = self.entries[name]
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if name not in self._sliced:
            return np.array(self._array(entry, name)[ids])
        ranges = self._sliced[name]
        # slice entries sort by their key, i.e. by their first row: paired with the slices so
        by_key = self._slice_entries.get(name, [])
        if len(by_key) != len(ranges):
            raise BundleError(f"{name}: {len(by_key)} slice entries for {len(ranges)} slices")
        rows_total = ranges[-1][1]
        if ids.size and (ids.min() < 0 or ids.max() >= rows_total):
            raise IndexError(f"{name}: an id outside its {rows_total} rows")
        out = np.empty((ids.size, *entry.shape[1:]), dtype=entry.dtype)
        for (lo, hi), stored in zip(ranges, by_key, strict=True):
            if stored.shape[:1] != (hi - lo,):
                raise BundleError(f"{name}: slice [{lo}, {hi}) stored as {stored.shape}")
            mine = np.nonzero((ids >= lo) & (ids < hi))[0]
            if mine.size:
                out[mine] = self._array(stored, name)[ids[mine] - lo]
        return out

    def row_range(self, name: str, lo: int, hi: int) -> Any:
        """Rows ``[lo, hi)`` of the tensor ``name``, read from its files (``pread``, not the
        maps: a long sequential read leaves no pages in this process). Memory: those rows.

        Raises:
            KeyError: no such tensor. IndexError: a range outside its rows.
            BundleError: stored in a way this reader does not read, or a file is short.
        """
        entry = self.entries[name]
        pieces = (
            list(zip(self._sliced[name], self._slice_entries.get(name, []), strict=False))
            if name in self._sliced
            else [((0, entry.shape[0] if entry.shape else 1), entry)]
        )
        total = pieces[-1][0][1]
        if not 0 <= lo <= hi <= total:
            raise IndexError(f"{name}: rows [{lo}, {hi}) outside its {total} rows")
        out = np.empty((hi - lo, *entry.shape[1:]), dtype=entry.dtype)
        for (first, end), stored in pieces:
            a, b = max(lo, first), min(hi, end)
            if a >= b:
                continue
            if stored.dtype is None:
                raise BundleError(f"{name}: not a numeric tensor")
            row = stored.size // max(1, end - first)
            view = out[a - lo : b - lo].reshape(-1).view(np.uint8)
            self._pread(stored.shard, stored.offset + (a - first) * row, view, name)
        return out

    def _pread(self, shard: int, offset: int, into: Any, name: str) -> None:
        path = f"{self.prefix}.data-{shard:05d}-of-{self._shards:05d}"
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise BundleError(f"{path}: {e.strerror}") from None
        try:
            done = 0
            while done < len(into):
                got = os.preadv(fd, [memoryview(into)[done:]], offset + done)
                if got <= 0:
                    raise BundleError(f"{name}: its data file is shorter than its entry (torn)")
                done += got
        finally:
            os.close(fd)

    def tensor(self, name: str) -> Any:
        """The whole tensor ``name`` (a copy), its slices joined."""
        rows = self.slices(name)[-1][1]
        if name not in self._sliced:
            return np.array(self._array(self.entries[name], name))
        return self.rows(name, np.arange(rows))

    def close(self) -> None:
        for data in self._maps.values():
            try:
                data.close()
            except BufferError:  # an array still views it: the map ends with the array
                pass
        self._maps.clear()
