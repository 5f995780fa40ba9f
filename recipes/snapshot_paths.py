"""Where the parameter servers keep their in-memory snapshots, and where the chief records each
ps it restored (no TensorFlow import: tfplan reads both)."""

from __future__ import annotations

import hashlib
import os

__all__ = ["RECOVERIES_FILE", "snapshot_folder"]

# in output_dir: one JSON line per ps recovery, appended by the chief as it restores (a restarted
# chief goes on appending): what `tfplan status` shows while the job runs
RECOVERIES_FILE = "ps_recoveries.jsonl"


def snapshot_folder(folder: str, output_dir: str, ps_index: int) -> str:
    """Where ps ``ps_index`` of the job writing into ``output_dir`` keeps its snapshots, on its
    own host."""
    job = hashlib.sha1(os.path.abspath(output_dir).encode()).hexdigest()[:12]
    return os.path.join(folder, f"tfplan-snapshots-{job}", f"ps{ps_index}")
