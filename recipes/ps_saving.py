"""Checkpoints written where the rows live: each parameter server saves its own variables.

TensorFlow's sharded ``Saver`` puts one save op on each device that holds variables: each ps
writes its own variables and optimizer slots (a split table's part as its slices) into
``<prefix>_temp/part-<k>-of-<n>`` on its own file system, and one ps merges the parts into the
checkpoint (``MergeV2Checkpoints``); a restore reads each ps's variables on that ps. Nothing is
gathered into the chief. That needs every ps to see the chief's output folder (the same path,
the same files): on hosts that share no output folder the merge fails, or the checkpoint is
scattered (TF 2.21: ``NotFoundError: .../model.ckpt-0_temp/part-00000-of-00002 did not exist``).

So the chief asks first (:func:`ps_see_output`): it writes a token file into the output folder
and has an op on each ps read it back. Every ps sees it: a sharded saver (saving from the ps,
:func:`recipes.runtime.chief_saver` with ``sharded=True``); any does not: the chief's own saver
(the chief pulls every variable and writes the checkpoint on its host), as before. The files
are the same V2 format either way, so a checkpoint of one restores through the other.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import tensorflow as tf

__all__ = ["PROBE_TIMEOUT_MS", "ps_see_output"]

v1 = tf.compat.v1
PROBE_TIMEOUT_MS = 10_000  # a ps that cannot answer a file read in this long is not relied on


def ps_see_output(target: str, output_dir: str, n_ps: int, config: Any = None) -> bool:
    """Whether each of the ``n_ps`` parameter servers of the session ``target`` reads the file
    the chief writes into ``output_dir`` (a shared output folder), asked by an op on each ps."""
    if n_ps < 1:
        return False
    token = uuid.uuid4().hex
    marker = os.path.join(output_dir, f".ps-probe-{token}")
    with open(marker, "w") as f:
        f.write(token)
    try:
        with tf.Graph().as_default():
            reads = []
            for k in range(n_ps):
                with tf.device(f"/job:ps/task:{k}"):
                    reads.append(tf.io.read_file(marker))
            with v1.Session(target, config=config) as sess:
                got = sess.run(reads, options=v1.RunOptions(timeout_in_ms=PROBE_TIMEOUT_MS))
        return all(value == token.encode() for value in got)
    except tf.errors.OpError:  # not found, not allowed, too slow, gone: not relied on
        return False
    finally:
        os.remove(marker)
