"""Test helper for the in-process snapshot cases (tests/test_ps_snapshots.py,
tests/test_snapshot_deltas.py): a case script, formatted with the repository, the tests folder,
a snapshot folder and an output folder under ``tmp_path``, run in its own interpreter (graph
mode is process-wide); what it printed after ``REPORT `` is returned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_snapshot_case(case: str, tmp_path: Path) -> dict[str, Any]:
    folder, out = tmp_path / "shm", tmp_path / "out"
    out.mkdir()
    script = case.format(
        root=str(ROOT), tests=str(ROOT / "tests"), folder=str(folder), out=str(out)
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(lines[0][len("REPORT ") :])
    return report
