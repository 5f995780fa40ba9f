"""Data loaders, sharding, config parsing, and the one-line error for a missing data file."""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from recipes.config import DataConf, load_run_config, task_from_env
from recipes.datasets import DataError, batches, load, shard

REPO = Path(__file__).resolve().parent.parent


def test_digits_load_split_and_sharding_is_disjoint_and_covering() -> None:
    ds = load(DataConf(name="digits", eval_fraction=0.2, seed=0))
    assert ds.x_train.shape[1] == 64 and len(ds.x_train) + len(ds.x_eval) == 1797
    assert len(ds.x_eval) == 359 and 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    assert set(np.unique(ds.y_train)) == set(range(10))
    idx = np.arange(len(ds.x_train))
    parts = [shard(idx, idx, k, 3)[0] for k in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == idx.tolist()  # covering, no duplicates
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1
    # same seed, same split: every task holds out the same examples
    again = load(DataConf(name="digits", eval_fraction=0.2, seed=0))
    np.testing.assert_array_equal(again.y_eval, ds.y_eval)


def test_batches_are_seeded_and_full() -> None:
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    it1, it2 = batches(x, x[:, 0], 4, seed=1), batches(x, x[:, 0], 4, seed=1)
    a, b = [next(it1)[0] for _ in range(5)], [next(it2)[0] for _ in range(5)]
    assert all(len(v) == 4 for v in a) and all((u == v).all() for u, v in zip(a, b, strict=True))


def _fake_mnist(n_train: int = 12, n_test: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.RandomState(0)
    return {
        "x_train": rng.randint(0, 256, (n_train, 28, 28)).astype(np.uint8),
        "y_train": rng.randint(0, 10, n_train).astype(np.uint8),
        "x_test": rng.randint(0, 256, (n_test, 28, 28)).astype(np.uint8),
        "y_test": rng.randint(0, 10, n_test).astype(np.uint8),
    }


def test_mnist_npz_loader(tmp_path: Path) -> None:
    arrays = _fake_mnist()
    np.savez(tmp_path / "mnist.npz", **arrays)
    ds = load(DataConf(name="mnist_npz", path=str(tmp_path / "mnist.npz"), image_size=28))
    assert ds.x_train.shape == (12, 784) and ds.x_eval.shape == (5, 784)
    np.testing.assert_allclose(ds.x_train[3], arrays["x_train"][3].reshape(-1) / 255.0)
    np.testing.assert_array_equal(ds.y_eval, arrays["y_test"])


def _write_idx(path: Path, arr: np.ndarray, gz: bool) -> None:
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    data = header + arr.tobytes()
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_loader_gz_or_plain(tmp_path: Path, gz: bool) -> None:
    arrays = _fake_mnist()
    names = {
        "x_train": "train-images-idx3-ubyte",
        "y_train": "train-labels-idx1-ubyte",
        "x_test": "t10k-images-idx3-ubyte",
        "y_test": "t10k-labels-idx1-ubyte",
    }
    for key, name in names.items():
        _write_idx(tmp_path / name, arrays[key], gz)
    for loader in ("mnist_idx", "mnist"):  # "mnist" picks IDX for a folder
        ds = load(DataConf(name=loader, path=str(tmp_path), image_size=28))
        np.testing.assert_array_equal(ds.y_train, arrays["y_train"])
        np.testing.assert_allclose(ds.x_eval[4], arrays["x_test"][4].reshape(-1) / 255.0)


def test_missing_files_raise_one_line_errors_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "mnist.npz"
    with pytest.raises(DataError) as e:
        load(DataConf(name="mnist_npz", path=str(missing), image_size=28))
    assert str(missing) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DataError, match="t10k-images|train-images"):
        (tmp_path / "empty").mkdir()
        load(DataConf(name="mnist_idx", path=str(tmp_path / "empty"), image_size=28))
    with pytest.raises(DataError, match="image_size"):
        load(DataConf(name="digits", image_size=28))


def test_synthetic_has_requested_shape_and_classes() -> None:
    ds = load(DataConf(name="synthetic", image_size=4, synthetic_examples=500, seed=3))
    assert ds.dim == 16 and len(ds.x_train) + len(ds.x_eval) == 500
    assert set(np.unique(ds.y_train)) == set(range(10))


def test_task_roles_for_both_chief_conventions() -> None:
    def task(cluster: dict[str, list[str]], typ: str, index: int):  # type: ignore[no-untyped-def]
        return task_from_env(
            {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": typ, "index": index}})}
        )

    w0 = {"ps": ["a:1"], "worker": ["b:1", "c:1"]}
    assert task(w0, "worker", 0).is_chief and not task(w0, "worker", 1).is_chief
    assert task(w0, "worker", 1).replica_index == 1 and task(w0, "worker", 1).n_replicas == 2
    sep = {**w0, "chief": ["d:1"]}
    assert task(sep, "chief", 0).is_chief and not task(sep, "worker", 0).is_chief
    assert [task(sep, "worker", i).replica_index for i in (0, 1)] == [1, 2]
    assert task(sep, "chief", 0).n_replicas == 3


def test_run_config_keeps_algorithm_specific_keys(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "output_dir": str(tmp_path / "out"),
                "algo": {
                    "name": "downpour",
                    "lr": 0.05,
                    "optimizer": "sgd",
                    "sync": False,
                    "window": 5,
                    "ps_optimizer": "adagrad",
                },
                "model": {"name": "mlp", "hidden": [16, 8]},
                "data": {"name": "digits", "path": None},
                "trainer": {"max_steps": 10, "checkpoint_secs": None},
            }
        )
    )
    cfg = load_run_config(str(path))
    assert cfg.algo.get("window") == 5 and cfg.algo.get("ps_optimizer") == "adagrad"
    assert cfg.model.hidden == (16, 8) and cfg.trainer.checkpoint_steps == 200


def test_missing_data_file_exits_nonzero_with_just_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "mnist.npz"
    (tmp_path / "run.yaml").write_text(
        yaml.safe_dump(
            {
                "output_dir": str(tmp_path / "out"),
                "algo": {"name": "hogwild"},
                "model": {"name": "logreg"},
                "data": {"name": "mnist_npz", "path": str(missing), "image_size": 28},
            }
        )
    )
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        TF_CONFIG=json.dumps(
            {
                "cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "recipes.train", "--config", str(tmp_path / "run.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and str(missing) in proc.stderr, proc.stderr
