"""Files every layer reads and writes.

Atomic writes (a reader sees the old file or the new one, never half of either), the one reader
of the JSON records tfplan keeps beside a run (experiment.json, plan.json, result.json, ...), and
the one digest of a set of files (the user's code, the recipes, the data a model is built on).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["files_digest", "read_json_object", "write_atomic"]


def files_digest(paths: Iterable[Path], base: Path) -> str:
    """SHA-256 (hex) of the files, in the order given: each one's path relative to ``base``
    and the digest of its content, read in blocks. What they hold and are called below
    ``base``, not where ``base`` lies.

    Raises:
        OSError: a file cannot be read.
    """
    digest = hashlib.sha256()
    for path in paths:
        content = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                content.update(block)
        digest.update(Path(path).relative_to(base).as_posix().encode() + b"\0")
        digest.update(content.digest())
    return digest.hexdigest()


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644, durable: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    Args:
        path: the file; its folder is created.
        data: text (UTF-8) or bytes.
        mode: permissions of the new file (mkstemp would leave 0600).
        durable: fsync before the rename, so the new content survives a power cut (state files).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is none to read.

    None covers a missing or unreadable file, text that is not JSON (or not UTF-8), and JSON that
    is not an object. These records are written by tfplan or a training program, possibly one that
    was killed or is still running: a reader treats "not there yet" and "damaged" alike and goes on
    without it. Callers that must tell a missing file from a damaged one (state, plan and sweep
    files) read the file themselves and raise.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):  # ValueError: JSONDecodeError and UnicodeDecodeError
        return None
    return data if isinstance(data, dict) else None
