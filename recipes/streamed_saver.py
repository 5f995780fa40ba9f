"""Checkpoints of parameter servers that share no output folder with the chief, streamed through
the chief in bounded chunks: one chunk of at most :data:`CHUNK_BYTES` crosses it at a time (its
peak for a save measured at +248 MiB for a 488 MiB table and +230 for 977 MiB, gRPC's buffers
included, against +995 and +1,937 gathered whole: docs/bench_table_init.md).

Where every ps sees the chief's output folder, each ps saves its own variables there (TensorFlow's
sharded saver, recipes/ps_saving.py). Where they do not (per-host output: docs/per_host_output.md),
the checkpoint must be written on the chief's host, where the evaluator reads it and where resume,
re-sharding and ``tfplan export`` find it. A plain ``Saver`` does that by gathering: its one
``SaveV2`` on the chief takes every variable as an input, so the chief holds the whole model at
once (+946 MiB for a 488 MiB table, docs/bench_table_init.md) and a table larger than the chief's
memory cannot be saved at all. This saver writes the same checkpoint in pieces:

- the variables are cut into chunks of at most :data:`CHUNK_BYTES` (a large variable by rows, its
  chunks written as slices of its one name; small ones packed together; a string variable, whose
  bytes are not known before it is read, e.g. the ``row_ids`` of a dynamic table of string ids,
  whole); each chunk is read on its variable's ps (a slice of the rows, on the ps's device:
  only the chunk crosses the network) and written by a ``SaveV2`` of its own on the chief into
  ``<prefix>_temp_<id>/part-<i>``. Each chunk's read waits on the previous chunk's save (a
  control dependency): one chunk is in the chief at a time, in one ``session.run``;
- ``MergeV2Checkpoints`` then joins the parts into ``<prefix>.index`` and its data files, one V2
  checkpoint of the usual names: a split table's parts are slices of its one name, as the sharded
  saver writes them, so every reader (the evaluator, the scorer, ``tfplan export``, a resume with
  another number of ps) reads it unchanged;
- a restore runs the other way, chunk by chunk: a ``RestoreV2`` of the chunk's slices on the
  chief, assigned into those rows on the ps, the next chunk's read waiting on that assignment. A
  variable restored in chunks is first set to zeros on its ps (a slice can only be assigned into
  a variable that holds a value): the ps's own memory, which holds the variable anyway.

The bookkeeping (the ``checkpoint`` file, ``max_to_keep``) is ``Saver``'s own: this module only
builds the graph its ``SaverDef`` names.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import tensorflow as tf

__all__ = ["CHUNK_BYTES", "Chunk", "chunks", "streamed_saver"]

v1 = tf.compat.v1
CHUNK_BYTES = 64 << 20  # the most of the checkpoint the chief holds at once


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, start + rows)`` of one variable (all of it when ``rows`` is None), saved
    under the checkpoint name ``name`` as the slice ``spec`` ("" for a whole variable)."""

    name: str
    var: Any
    start: int
    rows: int | None
    spec: str

    def read(self) -> Any:
        with v1.device(self.var.device):
            if self.rows is None:
                return self.var.read_value()
            return self.var[self.start : self.start + self.rows]

    def assign(self, value: Any) -> Any:
        with v1.device(self.var.device):
            if self.rows is None:
                return v1.assign(self.var, value) if _is_ref(self.var) else self.var.assign(value)
            return self.var[self.start : self.start + self.rows].assign(value)


@dataclass(frozen=True)
class Chunk:
    """The pieces written by one ``SaveV2``."""

    pieces: tuple[Piece, ...]


def _is_ref(var: Any) -> bool:
    return not hasattr(var, "handle")


def _parts(var_list: dict[str, Any]) -> Iterator[tuple[str, Any, list[int], list[int]]]:
    """(checkpoint name, variable, the full shape of the name, the variable's offset in it)."""
    for name, value in var_list.items():
        for var in value if isinstance(value, (list, tuple)) else [value]:
            shape = var.shape.as_list()
            info = getattr(var, "_save_slice_info", None)
            if isinstance(value, (list, tuple)) and info is not None:
                yield info.full_name, var, list(info.full_shape), list(info.var_offset)
            else:
                yield name, var, shape, [0] * len(shape)


def _spec(full: list[int], offset: list[int], shape: list[int]) -> str:
    """A slice spec "d0 d1 s0,l0:s1,l1" (TensorFlow's ``shape_and_slices``)."""
    return (
        " ".join(str(d) for d in full)
        + " "
        + ":".join(f"{o},{n}" for o, n in zip(offset, shape, strict=True))
    )


def chunks(var_list: dict[str, Any], chunk_bytes: int = CHUNK_BYTES) -> list[Chunk]:
    """``var_list`` (a Saver's: name -> variable, or the parts of a split one) cut into chunks of
    at most ``chunk_bytes`` (a row larger than that is a chunk of its own)."""
    out: list[Chunk] = []
    packed: list[Piece] = []
    packed_bytes = 0
    for name, var, full, offset in _parts(var_list):
        shape = var.shape.as_list()
        size = var.dtype.base_dtype.size * math.prod(shape)
        whole = shape == full
        if size <= chunk_bytes or not shape:
            spec = "" if whole else _spec(full, offset, shape)
            if packed and packed_bytes + size > chunk_bytes:
                out.append(Chunk(tuple(packed)))
                packed, packed_bytes = [], 0
            packed.append(Piece(name, var, 0, None, spec))
            packed_bytes += size
            continue
        row_bytes = size // shape[0] if shape[0] else size
        per = max(1, chunk_bytes // max(1, row_bytes))
        for start in range(0, shape[0], per):
            rows = min(per, shape[0] - start)
            spec = _spec(full, [offset[0] + start, *offset[1:]], [rows, *shape[1:]])
            out.append(Chunk((Piece(name, var, start, rows, spec),)))
    if packed:
        out.append(Chunk(tuple(packed)))
    return out


def streamed_saver(
    var_list: dict[str, Any], keep: int = 5, chunk_bytes: int = CHUNK_BYTES, name: str = "streamed"
) -> Any:
    """A ``Saver`` of ``var_list`` whose save and restore stream it through the chief in chunks of
    at most ``chunk_bytes`` (the module's docstring says how); its checkpoints are the usual V2
    ones. Create it once the graph is complete."""
    cut = chunks(var_list, chunk_bytes)
    with v1.name_scope(name):
        filename = v1.placeholder_with_default("model", [], name="filename")
        temp = tf.strings.join([filename, f"_temp_{uuid.uuid4().hex}/part"])
        prefixes, saves = [], []
        previous: list[Any] = []
        for i, chunk in enumerate(cut):
            with tf.control_dependencies(previous):
                values = [piece.read() for piece in chunk.pieces]
            prefix = tf.strings.join([temp, f"-{i:05d}-of-{len(cut):05d}"])
            save = tf.raw_ops.SaveV2(
                prefix=prefix,
                tensor_names=[p.name for p in chunk.pieces],
                shape_and_slices=[p.spec for p in chunk.pieces],
                tensors=values,
            )
            prefixes.append(prefix)
            saves.append(save)
            previous = [save]
        with tf.control_dependencies(saves):
            merge = tf.raw_ops.MergeV2Checkpoints(
                checkpoint_prefixes=tf.stack(prefixes) if prefixes else tf.constant([], tf.string),
                destination_prefix=filename,
                delete_old_dirs=True,
            )
        with tf.control_dependencies([merge]):
            saved = tf.identity(filename, name="saved")
        restored: list[Any] = []
        zeroed = _zeroed(cut)
        previous = zeroed
        for chunk in cut:
            with tf.control_dependencies(previous):
                values = tf.raw_ops.RestoreV2(
                    prefix=filename,
                    tensor_names=[p.name for p in chunk.pieces],
                    shape_and_slices=[p.spec for p in chunk.pieces],
                    dtypes=[p.var.dtype.base_dtype for p in chunk.pieces],
                )
            assigned = [
                piece.assign(value) for piece, value in zip(chunk.pieces, values, strict=True)
            ]
            previous = [tf.group(*assigned)]
            restored.extend(previous)
        restore = tf.group(*restored, *zeroed, name="restore_all")
    saver_def = v1.train.SaverDef(
        filename_tensor_name=filename.name,
        save_tensor_name=saved.name,
        restore_op_name=restore.name,
        max_to_keep=keep,
        sharded=False,
        keep_checkpoint_every_n_hours=10000.0,
        version=v1.train.SaverDef.V2,
    )
    return v1.train.Saver(saver_def=saver_def, max_to_keep=keep, allow_empty=True)


def _zeroed(cut: list[Chunk]) -> list[Any]:
    """Zeros assigned, on its ps, to each variable restored in chunks (in the chunks' order)."""
    order: dict[int, Any] = {}  # by id: a variable's == builds an op
    for chunk in cut:
        for piece in chunk.pieces:
            if piece.rows is not None:
                order.setdefault(id(piece.var), piece.var)
    ops = []
    for var in order.values():
        with v1.device(var.device):
            zeros = tf.zeros(var.shape, var.dtype.base_dtype)
            ops.append(v1.assign(var, zeros) if _is_ref(var) else var.assign(zeros))
    return ops
