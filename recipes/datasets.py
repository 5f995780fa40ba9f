"""Data sets for the recipes: packaged real data, local MNIST files, and a synthetic generator.

Everything is loaded into memory as float32 images flattened to ``[N, size*size*channels]`` in
[0, 1] and int64 labels. Nothing is downloaded: a missing file raises :class:`DataError`, whose
one-line message names the path and the fix.

Loaders (``data.name``):
- ``digits``: scikit-learn's 8x8 handwritten digits (1,797 real images, kept in recipes/digits_data.py).
- ``mnist_npz``: ``mnist.npz`` as Keras caches it (``x_train``, ``y_train``, ``x_test``, ``y_test``).
- ``mnist_idx`` (alias ``mnist_mlxtend``): a folder with the four standard IDX files, gzipped or not.
- ``mnist``: either of the two above, chosen by whether ``path`` is a file or a folder.
- ``synthetic``: Gaussian blobs around one random prototype per class (throughput benchmarks).

MNIST's own test set is the held-out split; the other sets hold out ``eval_fraction``.
"""

from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from recipes.config import DataConf
from recipes.errors import DataError
from recipes.vocabulary import IN_MEMORY_SOURCES, MNIST_SOURCES

__all__ = ["DataError", "Dataset", "batches", "load", "shard"]

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


@dataclass(frozen=True)
class Dataset:
    x_train: np.ndarray
    y_train: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.x_train.shape[1])


def _finish(
    x_train: np.ndarray, y_train: np.ndarray, x_eval: np.ndarray, y_eval: np.ndarray
) -> Dataset:
    def flat(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32)

    return Dataset(flat(x_train), y_train.astype(np.int64), flat(x_eval), y_eval.astype(np.int64))


def _split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int) -> Dataset:
    """Hold out ``fraction`` of the examples, chosen by a seeded permutation."""
    order = np.random.RandomState(seed).permutation(len(x))
    n_eval = max(1, int(round(len(x) * fraction))) if fraction > 0 else 0
    ev, tr = order[:n_eval], order[n_eval:]
    return _finish(x[tr], y[tr], x[ev], y[ev])


def _missing(path: str, what: str) -> DataError:
    return DataError(
        f"data file not found: {path} ({what}; set data.path to it, "
        "or use data=digits which needs no file)"
    )


def load_digits(cfg: DataConf) -> Dataset:
    from recipes.digits_data import load  # lazy: 117 KB of data only this data set needs

    pixels, labels = load()
    return _split(pixels / np.float32(16.0), labels, cfg.eval_fraction, cfg.seed)


def load_mnist_npz(path: str) -> Dataset:
    if not os.path.isfile(path):
        raise _missing(path, "expected mnist.npz as Keras caches it")
    try:
        with np.load(path) as f:
            parts = [f[k] for k in ("x_train", "y_train", "x_test", "y_test")]
    except (KeyError, ValueError, OSError) as e:
        raise DataError(
            f"cannot read {path} as mnist.npz ({e}); it needs arrays x_train, "
            "y_train, x_test, y_test"
        ) from None
    return _finish(parts[0] / np.float32(255.0), parts[1], parts[2] / np.float32(255.0), parts[3])


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (``.gz`` or plain): big-endian magic, dims, then uint8 data."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise DataError(f"{path} is not an IDX file of unsigned bytes (magic {data[:4].hex()})")
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise DataError(f"{path} is truncated: header says {dims}, found {arr.size} bytes")
    return arr.reshape(dims)


def load_mnist_idx(folder: str) -> Dataset:
    if not os.path.isdir(folder):
        raise _missing(folder, "expected a folder with the 4 MNIST IDX files")
    parts = {}
    for key, stem in IDX_FILES.items():
        for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
            if os.path.isfile(os.path.join(folder, name)):
                parts[key] = read_idx(os.path.join(folder, name))
                break
        else:
            raise _missing(os.path.join(folder, stem + "[.gz]"), "one of the 4 MNIST IDX files")
    return _finish(
        parts["x_train"] / np.float32(255.0),
        parts["y_train"],
        parts["x_test"] / np.float32(255.0),
        parts["y_test"],
    )


def load_synthetic(cfg: DataConf) -> Dataset:
    rng = np.random.RandomState(cfg.seed)
    dim = cfg.image_size * cfg.image_size * cfg.channels
    protos = rng.uniform(0.0, 1.0, size=(cfg.num_classes, dim)).astype(np.float32)
    y = rng.randint(0, cfg.num_classes, size=cfg.synthetic_examples)
    x = protos[y] + rng.normal(0.0, 0.35, size=(len(y), dim)).astype(np.float32)
    return _split(np.clip(x, 0.0, 1.0), y, cfg.eval_fraction, cfg.seed)


def load(cfg: DataConf) -> Dataset:
    """Load the data set that ``cfg.name`` names.

    Raises:
        DataError: unknown name, missing or malformed file, or a shape that disagrees with
            ``image_size * image_size * channels``.
    """
    path = os.path.abspath(os.path.expanduser(cfg.path)) if cfg.path else ""
    name = cfg.name
    if name == "mnist":
        name = "mnist_idx" if os.path.isdir(path) else "mnist_npz"
    if name == "digits":
        ds = load_digits(cfg)
    elif name == "synthetic":
        ds = load_synthetic(cfg)
    elif name in MNIST_SOURCES:  # "mnist" itself is one of the two others by now
        if not path:
            raise DataError(f"data.path is not set; {name} needs the local MNIST files")
        ds = load_mnist_npz(path) if name == "mnist_npz" else load_mnist_idx(path)
    else:
        raise DataError(f"unknown data set '{cfg.name}'; valid: {', '.join(IN_MEMORY_SOURCES)}")
    want = cfg.image_size * cfg.image_size * cfg.channels
    if ds.dim != want:
        raise DataError(
            f"{cfg.name} images have {ds.dim} values, but data.image_size="
            f"{cfg.image_size} and data.channels={cfg.channels} give {want}"
        )
    return ds


def shard(x: np.ndarray, y: np.ndarray, index: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Replica ``index`` of ``count`` gets every count-th example: disjoint, covering, balanced."""
    return x[index::count], y[index::count]


def batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless shuffled minibatches; each epoch is a fresh seeded permutation."""
    rng = np.random.RandomState(seed)
    n = len(x)
    batch_size = min(batch_size, n)
    while True:
        order = rng.permutation(n)
        for start in range(0, n - batch_size + 1, batch_size):
            idx = order[start : start + batch_size]
            yield x[idx], y[idx]
