"""Start TensorBoard on an experiment's or a sweep's folder, on loopback, and wait until it serves.

An experiment's folder holds the chief's summaries and the evaluator's (``eval/``); a sweep's
holds one such folder per point (``<sweep dir>/<n>``), which TensorBoard shows as one run each.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tfplan.errors import TfplanError

__all__ = ["Board", "free_port", "start_tensorboard"]


@dataclass(frozen=True)
class Board:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path


def free_port(host: str, preferred: int = 6006) -> int:
    """``preferred`` when it is free on ``host``, else a port the kernel picks."""
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise TfplanError(f"no free port on {host} for TensorBoard")


def start_tensorboard(
    logdir: Path,
    log_path: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout: float = 120.0,
) -> Board:
    """Start ``python -m tensorboard.main`` in its own session and wait until its URL answers.

    Raises:
        TfplanError: TensorBoard is not installed, or it exited or did not answer in time (the
            message quotes the end of its log).
    """
    try:
        import tensorboard  # noqa: F401 - only to tell the user how to get it
    except ImportError:
        raise TfplanError("TensorBoard is not installed: pip install tensorboard") from None
    port = port or free_port(host)
    url = f"http://{host}:{port}/"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                str(logdir),
                "--host",
                host,
                "--port",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in tfplan's terminal is tfplan's to forward
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise TfplanError(
                f"TensorBoard exited with code {process.returncode}: "
                f"{_tail(log_path)} (log: {log_path})"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return Board(process, url, log_path)
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    process.terminate()
    raise TfplanError(
        f"TensorBoard did not answer on {url} within {timeout:.0f}s: "
        f"{_tail(log_path)} (log: {log_path})"
    )


def _tail(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"
