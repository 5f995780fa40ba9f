"""Your trained Keras model back: a checkpoint's weights in the model your factory builds, saved
as a ``.keras`` file that ``keras.saving.load_model`` opens without tfplan or the recipes.

``python -m recipes.export --config run.yaml --checkpoint PATH --out PATH.keras``

Why rebuild instead of converting: a checkpoint holds only variables (``model/<Keras path>``,
recipes/checkpoint_names.py), not the architecture. The model is built exactly as the tasks
build it (``Workload.of``: your ``model._target_`` called with the ``model.*`` keys, Keras'
name counter reset first, built on a batch shaped as the data's features when it has no
``keras.Input``), so every weight's ``path`` is the name its checkpoint entry was saved under.
Every weight is read back, the non-trainable state too (a batch norm's moving statistics):
from the TF1 recipes' name-based checkpoints or the TF2 strategies' object ones. A variable split
over the parameter servers is one entry of a TF1 checkpoint (its parts are slices of it, read
whole); a TF2 one holds its parts (``<path>/part_<i>``, row ranges), joined along axis 0.

The chief of a run that trains a ``model._target_`` writes ``output_dir/model.keras`` from its
final checkpoint; a failed export is a warning there, never a failed run. The TF1 chief runs with
eager execution disabled (Keras saves eagerly), so it starts an exporter when it starts
(:func:`start_export`, ``--checkpoint -``): forked from the chief itself just after its
TensorFlow import and before it disables eager execution (TensorFlow and Keras come imported,
as a task forked from a warm seed gets them), or a subprocess that imports them when the chief
is past that point. The exporter builds the model while the cluster trains, at a lower
priority, then waits for the final checkpoint's path on its stdin (:func:`finish_export`); the
chief's exit for any reason closes that pipe and the exporter ends without writing. The eager TF2 strategies export in-process (:func:`export_final`). ``tfplan export model``
runs this module for any checkpoint of an experiment.

A model whose weights exceed ``trainer.export_join_bytes`` (default: a quarter of the memory the
exporter can still take)
cannot be joined in one process: it is written as its parts, ``<name>.parts/`` beside where
``<name>.keras`` would be, with a ``model.json`` and an ``assemble.py`` that joins them
(recipes/export_parts.py); its layout comes from a build that makes no value.

Exit codes as ``recipes/train.py``: 0 written; 2 the config, the checkpoint or ``--out`` is
wrong (one line naming it and the fix); 1 the user's code raised, or a bug.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from recipes import export_parts
from recipes.checkpoint_bundle import Bundle, BundleError
from recipes.checkpoint_names import MODEL_PREFIX, OBJECT_SUFFIX, PART, model_name, object_based
from recipes.config import load_run_config
from recipes.dynamic_export import resident_rows, with_lookups
from recipes.errors import ConfigError, RecipeError, report_failure
from recipes.export_parts import join_limit, parts_folder, stateless_layout, write_parts

if TYPE_CHECKING:
    from recipes.config import RunConfig

__all__ = [
    "EXPORT_TIMEOUT_SECS",
    "Exporter",
    "ForkedExporter",
    "MODEL_FILE",
    "export_final",
    "build_model",
    "export_model",
    "final_model_path",
    "finish_export",
    "main",
    "start_export",
]

MODEL_FILE = "model.keras"  # what the chief writes in output_dir at the end of training
# The chief waits this long for its export subprocess (TensorFlow's import, a build, a save).
EXPORT_TIMEOUT_SECS = 300.0
Log = Callable[[str], None]


# -- the export itself (eager TensorFlow) -----------------------------------------------------
def export_model(
    cfg: RunConfig,
    checkpoint: str,
    out: str,
    model: Any = None,
    join_bytes: Optional[int] = None,
) -> str:
    """Build the run's Keras model, load every weight from ``checkpoint`` (a prefix such as
    ``output_dir/model.ckpt-60``, or a folder: its latest) and save it as ``out`` (a
    ``.keras`` file, written atomically). Returns ``out``. A model whose weights exceed
    :func:`recipes.export_parts.join_limit` (``join_bytes``, else
    ``trainer.export_join_bytes``, else a quarter of the available memory) is written as its parts
    instead, and the parts folder is returned (recipes/export_parts.py); ``model`` (built
    already) means joined.

    Raises:
        ConfigError: a built-in model (not a Keras one), no such checkpoint, ``out`` not a
            ``.keras`` path, or a weight the checkpoint lacks or holds in another shape.
        recipes.errors.RecipeError: the model cannot be built (as a task would fail).
    """
    if not cfg.model.target:
        raise ConfigError(
            f"model.name={cfg.model.name} is a built-in model, not a Keras model: only a "
            "model._target_ Keras model exports to .keras (train your own with "
            "model._target_=my_pkg.models.build; the built-in weights stay readable with "
            "tf.train.load_checkpoint)"
        )
    if not out.endswith(".keras"):
        raise ConfigError(f"--out {out}: Keras saves a model as a .keras file: end it in .keras")
    path = _checkpoint_path(checkpoint)
    entries = _Entries(path)
    dynamic = set(cfg.model.dynamic)  # their tables are the resident ids' rows (joined always)
    if model is None:
        layout = None if dynamic else _too_large(cfg, join_bytes)
        if layout is not None:
            return write_parts(layout, entries.stored, entries.rows, os.path.abspath(out), path)
        model = build_model(cfg)
    tables = {}
    for name in sorted(dynamic):
        table = model.get_layer(name).embeddings
        tables[name] = resident_rows(entries.reader, table.path)
    for weight in [*model.trainable_variables, *model.non_trainable_variables]:
        if any(weight is model.get_layer(name).embeddings for name in dynamic):
            continue
        weight.assign(entries.value(weight.path, tuple(int(d) for d in weight.shape)))
    if tables:
        model = with_lookups(model, tables)
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    shutil.rmtree(parts_folder(out), ignore_errors=True)  # an earlier export as parts
    # Atomic: a reader (a copy back, a user's script) never opens half a zip. "*.tmp.*": what
    # tfplan's copy of per-host outputs leaves behind.
    tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.tmp.{os.getpid()}.keras")
    try:
        model.save(tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out


def _too_large(cfg: RunConfig, join_bytes: Optional[int]) -> Any:
    """The model's layout when its weights are too large to join in this process, else None."""
    layout = stateless_layout(cfg)
    return layout if layout.bytes > join_limit(cfg, join_bytes) else None


def build_model(cfg: RunConfig) -> Any:
    """The run's Keras model, built as the tasks build it: the same weight paths.

    Raises:
        ConfigError: a built-in model.
        recipes.errors.RecipeError: the model cannot be built (as a task would fail).
    """
    if not cfg.model.target:
        raise ConfigError(f"model.name={cfg.model.name} is a built-in model, not a Keras model")
    from recipes.workload import Workload

    return Workload.of(cfg).model.template()


def _checkpoint_path(checkpoint: str) -> str:
    """The checkpoint prefix ``checkpoint`` names: itself, or a folder's latest.

    Raises:
        ConfigError: a folder without a checkpoint, or no checkpoint at that prefix.
    """
    import tensorflow as tf

    if os.path.isdir(checkpoint):
        latest = tf.train.latest_checkpoint(checkpoint)
        if latest is None:
            raise ConfigError(f"no checkpoint in {checkpoint} yet: train first (tfplan apply)")
        return str(latest)
    if not tf.io.gfile.exists(checkpoint + ".index"):
        raise ConfigError(
            f"--checkpoint {checkpoint}: no such checkpoint ({checkpoint}.index is missing): "
            "give a prefix such as <output_dir>/model.ckpt-<step>, or the folder for its latest"
        )
    return checkpoint


class _Entries:
    """The model's entries of one checkpoint, by name (``model/<path>``), whichever its format
    (read one at a time: a large embedding is read once, when its weight asks)."""

    def __init__(self, path: str) -> None:
        import tensorflow as tf

        self.path = path
        self._reader = tf.train.load_checkpoint(path)
        self.reader = self._reader
        self._shapes = self._reader.get_variable_to_shape_map()
        self._dtypes = self._reader.get_variable_to_dtype_map()
        self._listing: Optional[bytes] = None  # the bundle's entries (:meth:`stored`)
        # the files read directly where they can be (recipes/checkpoint_bundle.py): any range
        # of rows for its own memory, where TensorFlow's reader reads a stored slice whole
        try:
            self._bundle: Optional[Bundle] = Bundle(path)
        except BundleError:
            self._bundle = None
        keys = list(self._shapes)
        tf2 = object_based(keys)
        self._keys = {
            key.removesuffix(OBJECT_SUFFIX) if tf2 else key: key
            for key in keys
            if key.startswith(MODEL_PREFIX) and (not tf2 or key.endswith(OBJECT_SUFFIX))
        }

    def value(self, path: str, shape: tuple[int, ...]) -> Any:
        """The value of the weight at ``path``: its entry, or its parts joined along axis 0.

        Raises:
            ConfigError: the checkpoint has no such weight, or holds it in another shape.
        """
        import numpy as np

        name = model_name(path)
        if name in self._keys:
            value = self._reader.get_tensor(self._keys[name])
        else:
            parts = self._old_parts(name)
            value = None
            if parts:
                value = np.concatenate([self._reader.get_tensor(k) for k, _, _ in parts], axis=0)
        if value is None:
            raise ConfigError(
                f"checkpoint {self.path} holds no {name}, a weight of this model: {_FIX}"
            )
        self._check(name, tuple(value.shape), shape)
        return value

    def rows(self, path: str, shape: tuple[int, ...], lo: int, hi: int) -> Any:
        """Rows ``[lo, hi)`` of the weight at ``path`` (of ``shape``): a slice of its entry
        (TensorFlow's RestoreV2 with a slice spec, from any split the checkpoint holds; it reads
        each stored slice the rows touch whole, so ask for one stored slice at a time:
        :meth:`stored`), or of the parts of an older checkpoint that cover them.

        Raises:
            ConfigError: the checkpoint has no such weight, or holds it in another shape.
        """
        import numpy as np
        import tensorflow as tf

        name = model_name(path)
        if name in self._keys:
            key = self._keys[name]
            self._check(name, tuple(int(d) for d in self._shapes[key]), shape)
            if not shape:
                return self._reader.get_tensor(key)
            if self._direct(key):
                assert self._bundle is not None
                return self._bundle.row_range(key, lo, hi)
            dims = " ".join(str(d) for d in shape)
            spec = f"{dims} " + ":".join([f"{lo},{hi - lo}"] + ["-"] * (len(shape) - 1))
            dtype = self._dtypes[key]
            return tf.raw_ops.RestoreV2(
                prefix=self.path, tensor_names=[key], shape_and_slices=[spec], dtypes=[dtype]
            )[0].numpy()
        parts = self._old_parts(name)
        if not parts:
            raise ConfigError(
                f"checkpoint {self.path} holds no {name}, a weight of this model: {_FIX}"
            )
        whole = (parts[-1][2], *tuple(int(d) for d in self._shapes[parts[0][0]])[1:])
        self._check(name, whole, shape)
        pieces = [
            self._reader.get_tensor(key)[max(lo, first) - first : min(hi, end) - first]
            for key, first, end in parts
            if first < hi and end > lo
        ]
        return np.concatenate(pieces, axis=0)

    def stored(self, path: str, shape: tuple[int, ...]) -> list[tuple[int, int]]:
        """The row ranges in which the checkpoint stores the weight at ``path``, in order: the
        slices its parameter servers saved (or an older checkpoint's parts), else all its rows
        at once. Why: TensorFlow's bundle reader reads a stored slice whole to give any rows of
        it, so rows are best read one stored slice at a time (:meth:`rows` of exactly one).
        Where the files are read directly (:meth:`_direct`), each slice in ranges of at most
        :data:`recipes.export_parts.CHUNK_BYTES`: the exporter holds one range, not a slice."""
        import re

        rows = shape[0] if shape else 1
        name = model_name(path)
        if name not in self._keys:
            return [(lo, hi) for _, lo, hi in self._old_parts(name)] or [(0, rows)]
        if shape and self._direct(self._keys[name]):  # any range costs only its rows
            import numpy as np

            assert self._bundle is not None
            entry = self._bundle.entries[self._keys[name]]  # a sliced one stores no bytes itself
            per_row = max(
                1, int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(entry.dtype).itemsize
            )
            step = max(1, export_parts.CHUNK_BYTES // per_row)
            return [
                (first + i, min(end, first + i + step))
                for first, end in self._bundle.slices(self._keys[name])
                for i in range(0, end - first, step)
            ]
        # The bundle's listing names each slice entry by TensorFlow's ordered code of the
        # tensor's name and the slice: b"\x00" + name + b"\x00\x01" + dims and (start, length)
        # pairs, then " (DT_...) [shape]"; entries sort by start.
        prefix = re.escape(b"\x00" + self._keys[name].encode() + b"\x00\x01")
        if self._listing is None:  # one line per entry: read once, not per weight
            self._listing = self._reader.debug_string()
        listing = self._listing
        sizes = [
            int(m.group(1).split(b",")[0])
            for m in re.finditer(prefix + rb".*? \(DT_\w+\) \[([\d,]+)\]\n", listing, re.S)
        ]
        if not sizes or sum(sizes) != rows:
            return [(0, rows)]
        bounds = [0]
        for size in sizes:
            bounds.append(bounds[-1] + size)
        return list(zip(bounds[:-1], bounds[1:], strict=True))

    def _direct(self, key: str) -> bool:
        """Whether ``key``'s rows are read from the files directly (a numeric tensor, stored
        whole or in row slices), not through TensorFlow's reader."""
        if self._bundle is None or not self._bundle.has(key):
            return False
        try:
            self._bundle.slices(key)
        except BundleError:
            return False
        return self._bundle.entries[key].dtype is not None

    def _old_parts(self, name: str) -> list[tuple[str, int, int]]:
        """The parts ``<name>/part_<i>`` an older checkpoint holds instead of ``name``, in
        order, with the rows each covers; empty when it holds none (or not all)."""
        numbered = sorted(
            (int(m.group(1)), key)
            for n, key in self._keys.items()
            if (m := PART.search(n)) and n[: m.start()] == name
        )
        if not numbered or [i for i, _ in numbered] != list(range(len(numbered))):
            return []
        parts, first = [], 0
        for _, key in numbered:
            rows = int(self._shapes[key][0])
            parts.append((key, first, first + rows))
            first += rows
        return parts

    def _check(self, name: str, stored: tuple[int, ...], shape: tuple[int, ...]) -> None:
        if stored != shape:
            raise ConfigError(
                f"checkpoint {self.path} holds {name} as {list(stored)}, but this model's "
                f"is {list(shape)}: {_FIX}"
            )


_FIX = "export with the run.yaml of the run that wrote it (the same model._target_, model.*)"


# -- at the end of training (the chief) ---------------------------------------------------------
def final_model_path(cfg: RunConfig) -> Optional[str]:
    """``output_dir/model.keras`` for a run that trains a Keras model; None for a built-in one,
    or when ``trainer.export_model`` is off."""
    if not cfg.model.target or not cfg.trainer.export_model:
        return None
    return os.path.join(cfg.output_dir, MODEL_FILE)


def _exported(out: str) -> str:
    """The line that says where the model went: ``out``, or its parts folder when the model
    was too large to join (the one of the two that exists: each export removes the other)."""
    folder = parts_folder(out)
    if not os.path.exists(out) and os.path.isdir(folder):
        return (
            f"exported the trained model as parts to {folder} (too large to join in one "
            f"process: trainer.export_join_bytes); python {folder}/assemble.py OUT.keras joins "
            "them where memory allows, its model.json says how they fit"
        )
    return f"exported the trained model to {out} (keras.saving.load_model opens it)"


def _not_exported(cfg: RunConfig, out: str, why: str) -> str:
    return (
        f"warning: the trained model was not exported to {out}: {why}; the checkpoints are "
        f"intact (tfplan export model -e {cfg.experiment_id} retries)"
    )


class ForkedExporter:
    """The exporter forked from the chief (:func:`start_export`), driven as the subprocess one
    is: the checkpoint's path on its stdin, its error lines on its stderr, its exit status."""

    def __init__(self, pid: int, stdin: int, stderr: int) -> None:
        self.pid = pid
        self._stdin = stdin
        self._stderr = stderr
        self.returncode: Optional[int] = None
        self.stderr = None  # read by communicate

    def communicate(self, input: str = "", timeout: Optional[float] = None) -> tuple[None, str]:
        """Write ``input`` and close the exporter's stdin, then read its stderr until it ends.

        Raises:
            subprocess.TimeoutExpired: it has not ended within ``timeout`` seconds.
        """
        if self._stderr < 0:  # killed: nothing more to read
            self.wait()
            return None, ""
        try:
            os.write(self._stdin, input.encode())
        except BrokenPipeError:
            pass  # it ended before it was asked: its stderr says why
        finally:
            os.close(self._stdin)
            self._stdin = -1
        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: list[bytes] = []
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._stderr], [], [], left)
            if not ready:
                raise subprocess.TimeoutExpired(["recipes.export"], timeout or 0.0)
            chunk = os.read(self._stderr, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(self._stderr)
        self._stderr = -1
        self.wait()
        return None, b"".join(chunks).decode(errors="replace")

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:  # reaped by someone else: its stderr said what it had
                self.returncode = 1
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)
        for fd in (self._stdin, self._stderr):
            if fd >= 0:
                os.close(fd)
        self._stdin = self._stderr = -1


Exporter = Union[ForkedExporter, "subprocess.Popen[str]"]


def _can_fork() -> bool:
    """This process may fork the exporter: TensorFlow imported, still eager and its runtime not
    started, and no other Python thread (whose locks the child would inherit): the state a warm
    seed forks its tasks in."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not tf.executing_eagerly() or threading.active_count() != 1:
        return False
    from tensorflow.python.eager import context

    # not yet initialised: no thread pool of TensorFlow's runtime the child would find without
    # its threads (an eager op, a tf.config call, or a session would have started it)
    return not getattr(context.context(), "_initialized", True)


def _fork_exporter(arguments: list[str]) -> ForkedExporter:
    """Fork ``python -m recipes.export ARGUMENTS`` from this process: stdin and stderr pipes
    to this one, stdout /dev/null, the same process group (stopped with the chief's)."""
    path_read, path_write = os.pipe()
    err_read, err_write = os.pipe()
    for stream in (sys.stdout, sys.stderr):  # else the child writes what is buffered again
        stream.flush()
    pid = os.fork()
    if pid == 0:  # the exporter
        code = 1
        try:
            os.close(path_write)
            os.close(err_read)
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(signum, signal.SIG_DFL)
            devnull = os.open(os.devnull, os.O_WRONLY)
            for fd, onto in ((path_read, 0), (devnull, 1), (err_write, 2)):
                os.dup2(fd, onto)
                os.close(fd)
            os.environ.update(_EXPORTER_ENV)
            for name in _NOT_A_TASK:
                os.environ.pop(name, None)
            code = main(arguments)
        except BaseException:  # noqa: BLE001 - the child never returns into the chief's code
            pass
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001, S110 - a closed stream must not stop the exit
                    pass
            # posix._exit, not os._exit: a task forked from a warm seed has os._exit record the
            # task's own exit status, which the exporter must not write
            import posix

            posix._exit(code)
    os.close(path_read)
    os.close(err_write)
    return ForkedExporter(pid, path_write, err_read)


# No GPU: the chief still holds its own, and a model's save needs none.
_EXPORTER_ENV = {"CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
_NOT_A_TASK = ("TF_CONFIG", "TFPLAN_STANDBY")  # the exporter has no cluster, is no standby


def start_export(cfg: RunConfig, run_yaml: Optional[str], log: Log) -> Optional[Exporter]:
    """Start the exporter of ``output_dir/model.keras`` with this task's environment: it builds
    the model now, while the cluster trains, then waits for the final checkpoint
    (:func:`finish_export`). Forked from this process where it is safe (:func:`_can_fork`: a
    TF1 chief just after its TensorFlow import), else a subprocess that imports TensorFlow
    itself. None when there is nothing to export (a built-in model) or no run.yaml to give it."""
    out = final_model_path(cfg)
    if out is None or not run_yaml:
        return None
    arguments = ["--config", run_yaml, "--checkpoint", "-", "--out", out]
    if _can_fork():
        try:
            return _fork_exporter(arguments)
        except OSError as e:
            log(_not_exported(cfg, out, f"cannot fork the exporter: {e}"))
            return None
    env = {**os.environ, **_EXPORTER_ENV}
    for name in _NOT_A_TASK:
        env.pop(name, None)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "recipes.export", *arguments],
            stdin=subprocess.PIPE,  # the final checkpoint's path comes here; EOF: no export
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    except OSError as e:
        log(_not_exported(cfg, out, f"cannot start {sys.executable}: {e}"))
        return None


def finish_export(
    proc: Optional[Exporter],
    cfg: RunConfig,
    checkpoint: str,
    log: Log,
    timeout: float = EXPORT_TIMEOUT_SECS,
) -> None:
    """Give :func:`start_export`'s exporter the final checkpoint and wait for it; one line
    either way (a failure is a warning: the run has succeeded, its checkpoints are there)."""
    out = final_model_path(cfg)
    if proc is None or out is None:
        return
    try:
        _, err = proc.communicate(input=checkpoint + "\n", timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        log(_not_exported(cfg, out, f"it took over {timeout:g}s"))
        return
    except BrokenPipeError:  # it ended before it was asked: its own error says why
        proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode == 0:
        log(_exported(out))
        return
    lines = [ln for ln in (err or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    why = (errors or lines or [f"exit status {proc.returncode}"])[-1]
    log(_not_exported(cfg, out, why.removeprefix("error: ").strip()))


def export_final(cfg: RunConfig, checkpoint: str, log: Log) -> None:
    """In-process (an eager chief: the TF2 strategies): export ``checkpoint`` to
    ``output_dir/model.keras``; one line either way, never an exception."""
    out = final_model_path(cfg)
    if out is None:
        return
    try:
        export_model(cfg, checkpoint, out)
    except RecipeError as e:
        log(_not_exported(cfg, out, str(e)))
    except Exception as e:  # noqa: BLE001 - Keras' save of an unusual model: say, not fail
        log(_not_exported(cfg, out, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"))
    else:
        log(_exported(out))


# -- python -m recipes.export ----------------------------------------------------------------------
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.export",
        description="Write a checkpoint's weights into your Keras model, saved as a .keras file.",
    )
    parser.add_argument("--config", required=True, help="the run's run.yaml")
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint prefix (<output_dir>/model.ckpt-<step>), or a folder for its latest; "
        "'-': build the model now, then read the checkpoint's path from stdin (a chief's "
        "exporter; nothing is written when stdin ends without one)",
    )
    parser.add_argument(
        "--out",
        required=True,
        help="the .keras file to write (a model too large to join: the folder <name>.parts "
        "beside it, recipes/export_parts.py)",
    )
    parser.add_argument(
        "--join-bytes",
        type=int,
        help="the most bytes of weights joined into one .keras file (default: the run's "
        "trainer.export_join_bytes, else a quarter of the available memory); larger: written as parts",
    )
    args = parser.parse_args(argv)
    try:
        cfg = load_run_config(args.config)
        if args.checkpoint == "-":
            os.nice(10)  # beside a training cluster: its steps come first
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
        if args.checkpoint != "-":
            print(
                export_model(cfg, args.checkpoint, args.out, join_bytes=args.join_bytes), flush=True
            )
            return 0
        # while the cluster trains: the model, unless it is too large to join (then nothing:
        # its parts are read from the checkpoint one range at a time)
        model = None if _too_large(cfg, args.join_bytes) is not None else build_model(cfg)
        checkpoint = sys.stdin.readline().strip()
        if not checkpoint:
            return 0  # the chief ended without a final checkpoint: nothing to export
        print(export_model(cfg, checkpoint, args.out, model, args.join_bytes), flush=True)
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - one line (the user's frames), the traceback on demand
        return report_failure(e)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(main())
