"""Where the parameter servers keep their in-memory snapshots (no TensorFlow import: tools that
clean up after a job read it too)."""

from __future__ import annotations

import hashlib
import os

__all__ = ["snapshot_folder"]


def snapshot_folder(folder: str, output_dir: str, ps_index: int) -> str:
    """Where ps ``ps_index`` of the job writing into ``output_dir`` keeps its snapshots, on its
    own host."""
    job = hashlib.sha1(os.path.abspath(output_dir).encode()).hexdigest()[:12]
    return os.path.join(folder, f"tfplan-snapshots-{job}", f"ps{ps_index}")
