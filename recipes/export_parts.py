"""A trained model too large for one process, exported as its parts (issue 35 item 5).

:func:`recipes.export.export_model` joins every weight into one ``.keras`` file, which needs the
whole model in the exporting process's memory. When the model's weights exceed
``trainer.export_join_bytes`` (default: a quarter of the memory the exporter can still take,
:func:`join_limit`),
it writes ``<name>.parts/`` beside where ``<name>.keras`` would be instead:

- ``weights/<path>.<first row>-<end row>.npy``: each weight in ranges of rows of at most
  ``chunk_bytes`` (a small weight: one file). A table is read one stored slice at a time (the
  part one parameter server saved, which one process held already: TensorFlow's bundle reader
  reads a stored slice whole to give any of its rows), so the exporter holds at most one
  ps's part of a table, never the table;
- ``model.json``: the architecture (``model.to_json()``, when the model has a config), the
  factory and keys that build it, and every weight in ``model.weights`` order with its shape,
  dtype and files;
- ``assemble.py`` (recipes/assemble_parts.py): joins them into one ``.keras`` file where memory
  allows, or serves a table's rows memory-mapped; it needs NumPy and Keras only.

The layout comes from a build inside ``keras.StatelessScope``: Keras creates no variable's value
there, so learning the shapes allocates nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from recipes import assemble_parts

if TYPE_CHECKING:
    from recipes.config import RunConfig

__all__ = [
    "CHUNK_BYTES",
    "Layout",
    "WeightSpec",
    "join_limit",
    "parts_folder",
    "stateless_layout",
    "write_parts",
]

CHUNK_BYTES = 64 << 20  # the largest file of rows written (model.partition_bytes' default)
# Rows of a weight: (path, shape, first row, end row) -> their values, read from the checkpoint.
ReadRows = Callable[[str, tuple[int, ...], int, int], Any]
# The row ranges in which the checkpoint stores a weight: (path, shape) -> [(first, end)].
StoredRanges = Callable[[str, tuple[int, ...]], list[tuple[int, int]]]


@dataclass(frozen=True)
class WeightSpec:
    path: str
    shape: tuple[int, ...]
    dtype: str
    trainable: bool

    @property
    def bytes(self) -> int:
        import numpy as np

        size = int(np.dtype(self.dtype).itemsize)
        for d in self.shape:
            size *= d
        return size


@dataclass(frozen=True)
class Layout:
    """What a model's export needs to know without its values."""

    weights: tuple[WeightSpec, ...]  # model.weights' order
    architecture: Optional[dict[str, Any]]  # Keras' JSON config; None: the model has none
    target: str
    kwargs: dict[str, Any]

    @property
    def bytes(self) -> int:
        return sum(w.bytes for w in self.weights)


def stateless_layout(cfg: RunConfig) -> Layout:
    """The run's model built as the tasks build it, inside ``keras.StatelessScope`` (no weight's
    value is made): its weights' paths, shapes and dtypes, and its architecture."""
    import keras

    from recipes.workload import Workload

    built = Workload.of(cfg).model
    built.prepare()  # a build that makes no value (recipes/keras_model.py)
    model = built.template()
    weights = tuple(
        WeightSpec(
            w.path,
            tuple(int(d) for d in w.shape),
            str(keras.backend.standardize_dtype(w.dtype)),
            bool(w.trainable),
        )
        for w in model.weights
    )
    try:
        architecture: Optional[dict[str, Any]] = json.loads(model.to_json())
    except (NotImplementedError, TypeError, ValueError):
        architecture = None  # a subclassed model without get_config: its factory builds it
    return Layout(weights, architecture, cfg.model.target or "", dict(cfg.model.kwargs))


def join_limit(cfg: RunConfig, override: Optional[int] = None) -> int:
    """The most bytes of weights joined into one ``.keras`` file: ``override``, else
    ``trainer.export_join_bytes``, else a quarter of the memory this process can still take: the
    host's available memory, or less where a memory cgroup limits it (a task's own limit,
    cluster.memory; a container's)."""
    if override is not None:
        return override
    if cfg.trainer.export_join_bytes is not None:
        return int(cfg.trainer.export_join_bytes)
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    left = cgroup_memory_left()
    # A quarter: a joined export holds 2.5-3 times the model at its peak (the model's own
    # values, each weight read from the checkpoint, Keras' save), and the chief's exporter runs
    # beside the chief's own last work in the same limit; measured on a 248 MiB model in a chief
    # of 1 GiB (bench_table_scale.py): half, then a third of what was left OOM-killed it.
    return (available if left is None else min(available, left)) // 4


def cgroup_memory_left(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> Optional[int]:
    """The bytes this process's memory cgroups (its own and each one above it) let it still
    take, the least of them; None when none sets a limit (or none can be read)."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: Optional[int] = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            base, limit_file, usage_file = root, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_file, usage_file = (
                os.path.join(root, "memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            folder = os.path.join(base, *parts[:depth])
            try:
                with open(os.path.join(folder, limit_file)) as f:
                    limit_text = f.read().strip()
                with open(os.path.join(folder, usage_file)) as f:
                    usage = int(f.read().strip())
            except (OSError, ValueError):
                continue
            if limit_text == "max" or int(limit_text) >= 1 << 60:  # v1's "no limit"
                continue
            left = max(0, int(limit_text) - usage)
            found = left if found is None else min(found, left)
    return found


def parts_folder(out: str) -> str:
    """Where the parts of ``out`` (a ``.keras`` path) go: ``<name>.parts`` beside it."""
    return out.removesuffix(".keras") + ".parts"


def _chunks(spec: WeightSpec, lo: int, hi: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """Rows ``[lo, hi)`` of ``spec`` in ranges of at most ``chunk_bytes`` (one row at least)."""
    per_row = max(1, spec.bytes // max(1, spec.shape[0])) if spec.shape else spec.bytes
    step = max(1, chunk_bytes // max(1, per_row))
    for first in range(lo, max(hi, lo + 1), step):
        yield first, min(hi, first + step) if spec.shape else 1


def write_parts(
    layout: Layout,
    stored: StoredRanges,
    read_rows: ReadRows,
    out: str,
    checkpoint: str,
    chunk_bytes: Optional[int] = None,
) -> str:
    """Write ``layout``'s weights (each stored range of ``stored(path, shape)`` read once by
    ``read_rows(path, shape, lo, hi)``) as the
    parts folder of ``out``, in files of at most ``chunk_bytes`` (default :data:`CHUNK_BYTES`);
    returns the folder. Written into a temporary folder that replaces
    the old one whole, and a stale ``out`` (an earlier joined export) is removed: the output
    folder holds one form of the model, the current one."""
    import numpy as np

    chunk = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    folder = parts_folder(out)
    parent = os.path.dirname(folder) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(folder)}.tmp.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "weights"))
    try:
        specs = []
        for spec in layout.weights:
            files = []
            ranges = stored(spec.path, spec.shape) if spec.shape else [(0, 1)]
            for first, end in ranges:  # one stored slice read at a time
                block = np.asarray(read_rows(spec.path, spec.shape, first, end))
                for lo, hi in _chunks(spec, first, end, chunk):
                    values = block[lo - first : hi - first] if spec.shape else block.reshape(())
                    name = f"weights/{spec.path.replace('/', '.')}.{lo}-{hi}.npy"
                    np.save(os.path.join(tmp, name), values, allow_pickle=False)
                    files.append({"file": name, "rows": [lo, hi]})
                del block
            specs.append(
                {
                    "path": spec.path,
                    "shape": list(spec.shape),
                    "dtype": spec.dtype,
                    "trainable": spec.trainable,
                    "files": files,
                }
            )
        data = {
            "format": assemble_parts.FORMAT,
            "checkpoint": checkpoint,
            "bytes": layout.bytes,
            "architecture": layout.architecture,
            "factory": {"target": layout.target, "kwargs": layout.kwargs},
            "weights": specs,
            "assemble": "python assemble.py OUT.keras joins every weight into one .keras file "
            "(the whole model's memory); in code, assemble.parts(folder, path) gives a "
            "weight's row ranges memory-mapped, assemble.load(folder) the model",
        }
        with open(os.path.join(tmp, assemble_parts.MANIFEST), "w") as f:
            json.dump(data, f, indent=1, default=str)
        shutil.copyfile(assemble_parts.__file__, os.path.join(tmp, "assemble.py"))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if os.path.exists(out):
        os.remove(out)  # an earlier joined export of another checkpoint
    return folder
