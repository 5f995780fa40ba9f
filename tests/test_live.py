"""recipes/live.py: what a running task is told, and what it ignores."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recipes import live as live_module
from recipes.live import Live


@pytest.fixture(autouse=True)
def read_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_module, "READ_EVERY_SECS", 0.0)


def _touch_later(path: Path, text: str, than: Path | None = None, by_secs: float = 0.01) -> None:
    path.write_text(text)
    if than is not None:  # file systems with coarse times: make the order explicit
        stamp = than.stat().st_mtime_ns + int(by_secs * 1e9)
        os.utime(path, ns=(stamp, stamp))


def test_told_values_override_the_start_and_a_new_start_forgets_them(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("output_dir: /o\n")
    live = Live(str(run))
    assert live.get("replicas", 2) == 2 and live.get("max_steps", 100) == 100
    told = tmp_path / "live.json"
    _touch_later(told, json.dumps({"replicas": 4, "max_steps": 500}), than=run)
    assert live.get("replicas", 2) == 4 and live.get("max_steps", 100) == 500
    _touch_later(run, "output_dir: /o\n", than=told, by_secs=5)  # the task started again
    assert live.get("replicas", 2) == 2


def test_written_in_one_update_in_either_order_it_counts(tmp_path: Path) -> None:
    """A Kubernetes ConfigMap volume rewrites run.yaml and live.json together, in any order."""
    run = tmp_path / "run.yaml"
    told = tmp_path / "live.json"
    told.write_text(json.dumps({"replicas": 4, "leave": ["worker/3"]}))
    _touch_later(run, "output_dir: /o\n", than=told, by_secs=0.05)
    live = Live(str(run))
    assert live.get("replicas", 2) == 4
    assert live.names("leave") == ["worker/3"] and live.names("other") == []


def test_a_torn_or_strange_file_is_ignored(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("x")
    _touch_later(tmp_path / "live.json", "{not json", than=run)
    assert Live(str(run)).get("replicas", 3) == 3
    _touch_later(tmp_path / "live.json", json.dumps({"replicas": -1, "max_steps": "x"}), than=run)
    live = Live(str(run))
    assert live.get("replicas", 3) == 3 and live.get("max_steps", 7) == 7
    assert Live(None).get("replicas", 5) == 5
