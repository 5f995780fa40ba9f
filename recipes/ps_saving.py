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
import re
import uuid
from typing import Any, Optional

import tensorflow as tf

__all__ = ["PROBE_TIMEOUT_MS", "missing_file_line", "ps_see_output"]

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


_MISSING = re.compile(r"(\S+\.(?:index|data-\d{5}-of-\d{5}))(?:'|\")?; No such file or directory")
_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")


def missing_file_line(
    error: Any, cluster: dict[str, list[str]], own: str, output_dir: Optional[str]
) -> Optional[str]:
    """The one line for a restore that failed on a missing checkpoint file (``error``, a
    ``NotFoundError``): which file, on which task's host (the op's device: a ps for a sharded
    restore, else this chief, whose address is ``own``) and the fix; None for another error."""
    message = getattr(error, "message", str(error))
    found = _MISSING.search(message)
    if not found:
        return None
    path = found.group(1)
    device = getattr(getattr(error, "op", None), "device", "") or ""
    task = _TASK.search(device)
    if task and task.group(1) == "ps":
        k = int(task.group(2))
        addresses = cluster.get("ps", [])
        host = addresses[k].rsplit(":", 1)[0] if k < len(addresses) else "?"
        return (
            f"checkpoint file {path} is missing on ps/{k}'s host {host}, which reads its own "
            f"part of the checkpoint there: make {output_dir} the same shared folder on every "
            "host again (each ps wrote its part into it), or start a new experiment.id"
        )
    host = own.rsplit(":", 1)[0] if own else "this host"
    return (
        f"checkpoint file {path} is missing on the chief's host {host}, where the checkpoints "
        f"of hosts without a shared folder are kept: copy {os.path.dirname(path)} back from "
        "where it went, or start a new experiment.id"
    )
