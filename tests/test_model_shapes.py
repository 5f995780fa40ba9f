"""The cache of model inspections (tfplan/engine/model_shapes.py): what its key holds, where it
lives, and that a hit builds nothing. No TensorFlow: a hit never starts the build's subprocess,
and a miss is seen by its source line (the builds themselves run in tests/test_plan_tables.py,
tests/test_user_model_apply.py and the plan checks)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tfplan.engine import model_shapes
from tfplan.engine.model_shapes import inspect_model, user_cache_dir
from tfplan.planning.plan import UserCode

CODE = (UserCode("tabular", "/src/tabular", 3, 1600, "abc123", ("model._target_",)),)


def _project(root: Path, rows: bytes = b"0123456789" * 100) -> dict[str, object]:
    """A run config naming two TFRecord shards and an eval file under ``root``, absolute as
    the planner writes them."""
    data = root / "data"
    data.mkdir(parents=True)
    for name in ("train-0.tfrecord", "train-1.tfrecord", "eval.tfrecord"):
        (data / name).write_bytes(rows + name.encode())
    return {
        "model": {"_target_": "tabular.models.build", "kwargs": {"units": 16}},
        "data": {
            "name": "tfrecord",
            "train": f"{data}/train-*.tfrecord",
            "eval": f"{data}/eval.tfrecord",
            "batch_size": 32,
        },
    }


def test_a_copy_of_the_project_has_the_same_key_and_other_data_another(tmp_path: Path) -> None:
    original = _project(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # as a test copies a generated project
    copy = json.loads(json.dumps(original).replace(str(tmp_path / "a"), str(tmp_path / "b")))
    key = model_shapes._key(original, CODE, "2.21.0", 1)
    assert model_shapes._key(copy, CODE, "2.21.0", 1) == key  # where the files lie: no matter
    # regenerated elsewhere with the same bytes (another module's make_data): the same
    regenerated = _project(tmp_path / "c")
    assert model_shapes._key(regenerated, CODE, "2.21.0", 1) == key
    # what they hold, the model, the code, the ps count, TensorFlow: each one changes it
    other_rows = _project(tmp_path / "d", rows=b"9876543210" * 100)
    assert model_shapes._key(other_rows, CODE, "2.21.0", 1) != key
    wider = {**original, "model": {"_target_": "tabular.models.build", "kwargs": {"units": 32}}}
    assert model_shapes._key(wider, CODE, "2.21.0", 1) != key
    changed = (UserCode("tabular", "/src/tabular", 3, 1600, "def456", ("model._target_",)),)
    assert model_shapes._key(original, changed, "2.21.0", 1) != key
    assert model_shapes._key(original, CODE, "2.21.0", 2) != key
    assert model_shapes._key(original, CODE, "2.15.1", 1) != key
    (tmp_path / "b" / "data" / "train-2.tfrecord").write_bytes(b"more")  # one more shard
    assert model_shapes._key(copy, CODE, "2.21.0", 1) != key


def test_large_files_are_keyed_by_size_and_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond HASHED_BYTES a copy that keeps modification times (copytree, cp -p, rsync -t)
    still hits; a file rewritten since misses."""
    monkeypatch.setattr(model_shapes, "HASHED_BYTES", 100)
    original = _project(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copy = json.loads(json.dumps(original).replace(str(tmp_path / "a"), str(tmp_path / "b")))
    key = model_shapes._key(original, CODE, "2.21.0", 1)
    assert model_shapes._key(copy, CODE, "2.21.0", 1) == key
    shard = tmp_path / "b" / "data" / "train-0.tfrecord"
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert model_shapes._key(copy, CODE, "2.21.0", 1) != key


def test_a_hit_builds_nothing_and_says_it_was_cached(tmp_path: Path) -> None:
    config = _project(tmp_path / "a")
    cache = tmp_path / "cache"
    key = model_shapes._key(config, CODE, "2.21.0", 1)
    listing = {
        "variables": [{"name": "hidden/kernel", "shape": [5, 16], "bytes": 320, "ps": 0}],
        "unused_features": ["extra"],
        "tables": [],
    }
    (cache).mkdir()
    (cache / f"model-{key}.json").write_text(json.dumps(listing))
    # code_dir names no package: a build would fail to import tabular, so a hit is the only
    # way to this answer
    found = inspect_model(config, CODE, str(tmp_path / "nowhere"), cache, "2.21.0", 1)
    assert found.source == "an inspection build of tabular.models.build (cached)"
    assert [(v.name, v.shape, v.bytes) for v in found.variables or ()] == [
        ("hidden/kernel", (5, 16), 320)
    ]
    assert found.unused_features == ("extra",)


def test_the_cache_lives_in_the_users_cache_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFPLAN_CACHE_DIR", "~/elsewhere")
    assert user_cache_dir() == Path("~/elsewhere").expanduser()
    monkeypatch.delenv("TFPLAN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert user_cache_dir() == Path("/xdg/tfplan")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/u")
    assert user_cache_dir() == Path("/home/u/.cache/tfplan")
