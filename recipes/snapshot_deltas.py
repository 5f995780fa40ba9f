"""Snapshots of only the rows that changed: what keeps a large table's in-memory snapshots cheap.

A ps's snapshots form a *chain* in one slot of its snapshot folder: a full snapshot (the base:
every variable of the ps, recipes/ps_snapshots.py's ``Saver``), then deltas
``<prefix>-delta1``, ``-delta2``, ..., each holding, for every *table* of the ps (a numeric
variable of at least recipes/snapshot_paths.py ``TABLE_BYTES``: embedding tables, their optimizer
slots, a dynamic table's ids and last-seen steps, large kernels), only the rows that changed
since the snapshot before it (their indices and values; a vector's elements in blocks of
:data:`BLOCK`), and every other variable whole. A restore reads the base, then applies each delta in
order (the rows scattered into the table, the rest assigned).

Which rows changed is read from the values, not from the update ops (every algorithm updates its
variables its own way): each table has a fingerprint per row (``tf.fingerprint``, FarmHash of the
row's bytes: 28 ms for 1M x 64 floats on one core), kept in a variable beside it on its ps
(8 bytes a row, in no collection: never saved, never initialised by the session, not a model
variable). A delta computes the rows' fingerprints, takes the rows whose fingerprint differs from
the kept one, gathers them on the ps and writes them (on the ps's own host, and the copy on its
peer's: only those rows cross the network), and keeps the new fingerprints. A row written while
the delta runs is taken with its newer value or, if its fingerprint was read before the write,
by the next delta (its kept fingerprint is then the older value's): a chain restored holds
every row at least as new as its last delta's fingerprints.

A chain ends (the next snapshot of that ps is a full one, into the other slot: the chain in the
current slot stays whole until that one is complete) when its deltas add up to
:data:`REBASE_SHARE` of the base's bytes, after :data:`MAX_DELTAS` deltas, or when the ps's
values were replaced under it (a restore) or a snapshot failed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import tensorflow as tf

from recipes.snapshot_paths import REBASE_SHARE, VECTOR_BLOCK

__all__ = [
    "Chain",
    "MAX_DELTAS",
    "REBASE_SHARE",
    "RowDeltas",
    "delta_prefix",
    "deltas_pattern",
]

v1 = tf.compat.v1
MAX_DELTAS = 32  # a restore reads the base and at most this many deltas
BLOCK = VECTOR_BLOCK  # a vector's elements share a fingerprint in blocks of this many


def delta_prefix(prefix: str, n: int) -> str:
    """The files of delta ``n`` (1, 2, ...) of the chain whose base is ``prefix``."""
    return f"{prefix}-delta{n}"


def deltas_pattern(prefix: str) -> str:
    """Every delta file of the chain whose base is ``prefix`` (for emptying them)."""
    return f"{prefix}-delta*"


@dataclass(frozen=True)
class Chain:
    """The chief's record of one ps's current chain: the slot it lies in, its deltas, their
    bytes, and whether the next snapshot may add a delta to it (no: a full one into the other
    slot)."""

    slot: int  # index into recipes.ps_snapshots.SLOTS
    deltas: int = 0
    delta_bytes: int = 0
    extendable: bool = True

    def ended(self) -> Chain:
        return replace(self, extendable=False)


def _is_table(var: Any, table_bytes: Optional[int]) -> bool:
    shape, dtype = var.shape, var.dtype.base_dtype
    if table_bytes is None:  # deltas off: every variable whole in every snapshot
        return False
    if shape.rank is None or shape.rank < 1 or not shape.is_fully_defined():
        return False
    if not (dtype.is_floating or dtype.is_integer or dtype.is_bool):
        return False  # strings (a dynamic table's string ids): whole
    return _bytes(var) >= table_bytes and int(shape[0]) >= BLOCK


def _units(var: Any) -> int:
    """How many fingerprints ``var`` has: one per row, or per block of a vector."""
    rows = int(var.shape[0])
    return rows if var.shape.rank >= 2 else rows // BLOCK


def _fingerprints(var: Any) -> Any:
    """One int64 per row of ``var`` (FarmHash of the row's bytes); of a vector, one per block of
    :data:`BLOCK` elements (its tail, under a block, is in every delta)."""
    value = var.read_value()
    if var.shape.rank < 2:
        value = tf.reshape(value[: _units(var) * BLOCK], [_units(var), BLOCK])
    return tf.bitcast(tf.fingerprint(value), tf.int64)


def _indices(var: Any, units: Any) -> Any:
    """The first-dimension indices that the changed ``units`` (rows, or a vector's blocks) cover,
    with a vector's tail."""
    if var.shape.rank >= 2:
        return units
    rows = int(var.shape[0])
    covered = tf.reshape(units[:, None] * BLOCK + tf.range(BLOCK, dtype=tf.int64)[None, :], [-1])
    tail = tf.range(_units(var) * BLOCK, rows, dtype=tf.int64)
    return tf.concat([covered, tail], 0)


class RowDeltas:
    """The delta ops of one ps's variables (built in the chief's graph): the fingerprints kept
    per table row, the op that sets them (run before a full snapshot is written), the delta's
    save on each host that holds this ps's snapshots, and its restore from each.

    ``hosts``: the ps whose hosts hold this ps's snapshots (its own, then its copy's)."""

    def __init__(
        self, ps: int, variables: list[Any], hosts: list[int], table_bytes: Optional[int]
    ) -> None:
        self.ps = ps
        self.tables = [v for v in variables if _is_table(v, table_bytes)]
        self.whole = [v for v in variables if not _is_table(v, table_bytes)]
        self.base_bytes = sum(_bytes(v) for v in variables)
        self._whole_bytes = sum(_bytes(v) for v in self.whole)
        # the bytes of one table row (a vector's element), and of its index, in a delta
        self._row_bytes = [_bytes(t) // int(t.shape[0]) + 8 for t in self.tables]
        self.saves: dict[int, tuple[Any, Any]] = {}  # host -> (prefix placeholder, save op)
        self.restores: dict[int, tuple[Any, Any]] = {}  # host -> (prefix placeholder, op)
        if not self.tables:
            return
        with v1.device(f"/job:ps/task:{ps}"):
            prints = [
                v1.Variable(
                    tf.zeros([_units(t)], tf.int64),
                    trainable=False,
                    collections=[],
                    name=f"snapshot_prints_ps{ps}_{i}",
                )
                for i, t in enumerate(self.tables)
            ]
            now = [_fingerprints(t) for t in self.tables]
            self.set_prints = tf.group(*(p.assign(n) for p, n in zip(prints, now, strict=True)))
            found = [
                _indices(t, tf.where(tf.not_equal(n, p.read_value()))[:, 0])
                for t, p, n in zip(self.tables, prints, now, strict=True)
            ]
            # the bytes this delta needs, against the room its chain has left (fed): a delta
            # that does not fit writes no row (the chief takes a full snapshot instead), so a
            # chain never passes REBASE_SHARE of its base, which bounds the snapshots' memory
            self.room = v1.placeholder_with_default(
                tf.constant(2**62, tf.int64), [], name=f"delta_room_ps{ps}"
            )
            self.need = self._whole_bytes + tf.add_n(
                [
                    tf.size(ids, out_type=tf.int64) * b
                    for ids, b in zip(found, self._row_bytes, strict=True)
                ]
            )
            self.fits = self.need <= self.room
            changed = [ids[: tf.where(self.fits, tf.size(ids), 0)] for ids in found]
            rows = [tf.gather(t, ids) for t, ids in zip(self.tables, changed, strict=True)]
            with tf.control_dependencies(found):  # the kept prints read before they are set
                self.keep_prints = tf.group(
                    *(p.assign(n) for p, n in zip(prints, now, strict=True))
                )
            values = [v.read_value() for v in self.whole]
        names, tensors, dtypes = [], [], []
        for t, ids, got in zip(self.tables, changed, rows, strict=True):
            names += [f"{t.op.name}/.ids", f"{t.op.name}/.rows"]
            tensors += [ids, got]
            dtypes += [tf.int64, t.dtype.base_dtype]
        for v, value in zip(self.whole, values, strict=True):
            names.append(v.op.name)
            tensors.append(value)
            dtypes.append(v.dtype.base_dtype)
        slices = [""] * len(names)
        for host in hosts:
            with v1.device(f"/job:ps/task:{host}"):
                prefix = v1.placeholder(tf.string, [], name=f"delta_ps{ps}_on_ps{host}")
                save = tf.raw_ops.SaveV2(
                    prefix=prefix, tensor_names=names, shape_and_slices=slices, tensors=tensors
                )
                self.saves[host] = (prefix, save)
                where = v1.placeholder(tf.string, [], name=f"delta_restore_ps{ps}_on_ps{host}")
                got = tf.raw_ops.RestoreV2(
                    prefix=where, tensor_names=names, shape_and_slices=slices, dtypes=dtypes
                )
            with v1.device(f"/job:ps/task:{ps}"):
                n = len(self.tables)
                applied = [
                    v1.scatter_update(t, got[2 * i], got[2 * i + 1])
                    for i, t in enumerate(self.tables)
                ] + [v1.assign(v, got[2 * n + j]) for j, v in enumerate(self.whole)]
                self.restores[host] = (where, tf.group(*applied))

    @property
    def active(self) -> bool:
        """Whether this ps has tables (else every snapshot of it is a full one)."""
        return bool(self.tables)

    def room_left(self, chain: Chain) -> int:
        """The bytes a delta may hold to extend ``chain`` (fed to :attr:`room`)."""
        return max(0, int(REBASE_SHARE * self.base_bytes) - chain.delta_bytes)

    def ends(self, chain: Chain) -> bool:
        """Whether ``chain`` takes no more deltas (the next snapshot is a full one)."""
        return (
            not self.active
            or not chain.extendable
            or chain.deltas >= MAX_DELTAS
            or self.room_left(chain) <= self._whole_bytes
        )


def _bytes(var: Any) -> int:
    shape = var.shape
    if not shape.is_fully_defined():
        return 0
    return int(shape.num_elements()) * int(var.dtype.base_dtype.size)
