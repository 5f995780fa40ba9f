"""A process's own folder for temporary files.

Why: TensorFlow's autograph writes a module file into the temporary folder for every function it
converts (each ``tf.data`` map, each Keras call) and removes them only at interpreter exit, which
the recipes skip (``os._exit``: a started gRPC server never shuts down cleanly) and which a killed
task never reaches. Every task left its files in the system's temporary folder (3,400 of them
after one run of the test suite). A task's own folder in its working folder
(``.tmp-<type>-<index>``: tasks may share a working folder), emptied when it starts, bounds them
to one life of one task, however it ends.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

__all__ = ["SCRATCH_PREFIX", "use_scratch"]

SCRATCH_PREFIX = ".tmp-"  # + the task's type and index, in its working folder


def use_scratch(folder: Path) -> Path:
    """Make ``folder`` (emptied first) this process's temporary folder; returns it."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    tempfile.tempdir = str(folder)
    return folder
