"""Where the parameter servers keep their in-memory snapshots, and where the chief records each
ps it restored (no TensorFlow import: tfplan reads both)."""

from __future__ import annotations

import hashlib
import os

__all__ = ["RECOVERIES_FILE", "REBASE_SHARE", "TABLE_BYTES", "VECTOR_BLOCK", "snapshot_folder"]

# in output_dir: one JSON line per ps recovery, appended by the chief as it restores (a restarted
# chief goes on appending): what `tfplan status` shows while the job runs
RECOVERIES_FILE = "ps_recoveries.jsonl"

# A ps's chain of snapshots (a full one, then deltas of the changed rows: recipes/snapshot_deltas.py)
# ends once its deltas add up to this share of the full one: the next snapshot is a full one.
# What it bounds: a ps's snapshot memory (two full ones, the chain in one slot and the one
# before it in the other: at most 2 + 2 x REBASE_SHARE times its variables' bytes, as the plan
# says, tfplan/planning/footprint.py) and a restore's work.
REBASE_SHARE = 0.25
# a numeric variable this large is snapshotted by its changed rows (a vector's: blocks of
# VECTOR_BLOCK elements), each row's fingerprint (8 bytes) kept beside it on its ps
TABLE_BYTES = 64 * 1024
VECTOR_BLOCK = 64


def snapshot_folder(folder: str, output_dir: str, ps_index: int) -> str:
    """Where ps ``ps_index`` of the job writing into ``output_dir`` keeps its snapshots, on its
    own host."""
    job = hashlib.sha1(os.path.abspath(output_dir).encode()).hexdigest()[:12]
    return os.path.join(folder, f"tfplan-snapshots-{job}", f"ps{ps_index}")
