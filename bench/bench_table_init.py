"""Where a split table is initialised and saved: each process's memory, and the save's time.

Usage: ``.venv/bin/python bench/bench_table_init.py [--rows 2000000] [--dim 64] [--repeats 3]
[--out docs/bench_table_init.md]``

A TF1 cluster on loopback: 2 parameter servers (``tf.distribute.Server`` processes, forked from
the run's process after its TensorFlow import, as tfplan's warm seeds fork tasks) and the
process that builds the graph and runs the initialiser (the chief's role), with a model whose
``Embedding`` table (``rows`` x ``dim`` float32) is split into one part per ps by
recipes/keras_model.py, as the recipes build it under the ``replica_device_setter``.

Initialisation, two initializers side by side in alternating runs:

- ``row-wise``: Keras' ``RandomUniform`` (the Embedding's default): each part is initialised on
  its own ps at the part's shape (issue 35 item 1);
- ``whole``: the same uniform values from an initializer with no row-wise form (a user's own
  class): the parts are sliced from the whole table's initial value, computed once, as every
  split table was before.

Saving, in runs of their own (a row-wise initialisation, then one checkpoint by the recipes'
chief saver, recipes/runtime.py ``chief_saver``):

- ``gathered``: the chief pulls every variable and writes the checkpoint (a plain non-sharded
  ``Saver``: what every save did before, and what the saves of hosts without a shared folder
  did until the streamed saver);
- ``on-ps``: sharded, each ps writes its own variables and one merges the parts
  (recipes/ps_saving.py, where every ps sees the output folder; issue 35 item 3);
- ``streamed``: the checkpoint written on the chief's host, streamed from the ps in chunks of
  64 MiB (recipes/streamed_saver.py: where the ps do not see the output folder).

Figures: the peak RSS (``VmHWM``) of each ps and of the chief's process before and after the
initialiser and the save, the save's wall time and the checkpoint's bytes; medians of the
repeats. Nothing but loopback is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODES = ("row-wise", "whole")
SAVES = ("gathered", "on-ps", "streamed")
SAVE_LABELS = {
    "gathered": "gathered by the chief",
    "on-ps": "on each ps (sharded)",
    "streamed": "streamed through the chief",
}

# One run: started as its own interpreter (graph mode and the servers are process-wide).
RUN = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.path.insert(0, {repo!r})
    spec, mode, rows, dim = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    save, folder = sys.argv[5], sys.argv[6]
    import signal
    import tensorflow as tf

    # each ps forked from here once TensorFlow is imported and before its runtime starts (as
    # tfplan's warm seeds fork tasks): one import per run, not three
    servers = []
    for i in range(len(spec["ps"])):
        pid = os.fork()
        if pid == 0:
            tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="ps", task_index=i).join()
            os._exit(0)
        servers.append(pid)
    try:
        import keras
        from recipes.checkpoint_names import sliced_names
        from recipes.keras_model import KerasModel
        from recipes.runtime import chief_saver

        v1 = tf.compat.v1
        v1.disable_eager_execution()
        cluster = tf.train.ClusterSpec(spec)
        me = tf.distribute.Server(cluster, job_name="worker", task_index=0)

        class Uniform(keras.initializers.Initializer):  # no row-wise form: sliced from the whole
            def __call__(self, shape, dtype=None):
                return keras.random.uniform(shape, -0.05, 0.05, seed=1, dtype=dtype)

        def model():
            init = "uniform" if mode == "row-wise" else Uniform()
            ids = keras.Input((), dtype="int64", name="ids")
            h = keras.layers.Embedding(rows, dim, embeddings_initializer=init, name="table")(ids)
            return keras.Model(ids, keras.layers.Dense(1, name="out")(h))

        def hwm(pid):
            for line in open(f"/proc/{{pid}}/status"):
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) * 1024
            raise RuntimeError("no VmHWM")

        def peaks():
            return [hwm(pid) for pid in servers] + [hwm(os.getpid())]

        with tf.Graph().as_default():
            km = KerasModel(model, {{}}, partitions=len(spec["ps"]), partition_bytes=1024)
            setter = v1.train.replica_device_setter(worker_device="/job:worker/task:0", cluster=cluster)
            with v1.device(setter):
                params = km.create_params(None)
                step = v1.train.get_or_create_global_step()
            assert [k for k in params if k.startswith("table/")] == [
                f"table/embeddings/part_{{i}}" for i in range(len(spec["ps"]))
            ], sorted(params)
            named = {{"global_step": step, **{{"model/" + k: v for k, v in params.items()}}}}
            saver = chief_saver(
                sliced_names(named), 1, sharded=(save == "on-ps"), streamed=(save == "streamed")
            )
            with v1.Session(me.target) as sess:
                sess.run(v1.report_uninitialized_variables())  # every ps answers
                before = peaks()
                started = time.monotonic()
                sess.run(v1.global_variables_initializer())
                took = time.monotonic() - started
                after = peaks()
                saved = {{}}
                if save != "none":
                    started = time.monotonic()
                    prefix = saver.save(sess, os.path.join(folder, "model.ckpt"), global_step=0)
                    saved["secs"] = time.monotonic() - started
                    saved["after"] = peaks()
                    name = os.path.basename(prefix)
                    saved["bytes"] = sum(
                        os.path.getsize(os.path.join(folder, f))
                        for f in os.listdir(folder)
                        if f.startswith(name + ".")
                    )
        print("RESULT " + json.dumps(
            {{"before": before, "after": after, "secs": took, "save": saved}}
        ))
    finally:
        for pid in servers:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(mode: str, rows: int, dim: int, n_ps: int, save: str = "none") -> dict[str, Any]:
    spec = {
        "ps": [f"127.0.0.1:{free_port()}" for _ in range(n_ps)],
        "worker": [f"127.0.0.1:{free_port()}"],
    }
    with tempfile.TemporaryDirectory(prefix="bench-table-") as folder:
        command = [sys.executable, "-c", RUN.format(repo=str(REPO)), json.dumps(spec), mode]
        proc = subprocess.run(
            [*command, str(rows), str(dim), save, folder],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    lines = [s for s in proc.stdout.splitlines() if s.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"run {mode}/{save} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def _median(runs: list[dict[str, Any]], *path: Any) -> float:
    values = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value[key]
        values.append(float(value))
    return statistics.median(values)


def _rss_cells(runs: list[dict[str, Any]], before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    low, high = _median(runs, *before), _median(runs, *after)
    return f"{mib(low)} -> {mib(high)} (+{mib(high - low)})"


def report(
    runs: dict[str, list[dict[str, Any]]],
    saves: dict[str, list[dict[str, Any]]],
    args: argparse.Namespace,
) -> str:
    n_ps = args.ps
    names = [f"ps/{i}" for i in range(n_ps)] + ["chief"]
    table_bytes = args.rows * args.dim * 4
    lines = [
        "# Where a split table is initialised and saved (bench/bench_table_init.py)",
        "",
        f"`.venv/bin/python bench/bench_table_init.py --rows {args.rows} --dim {args.dim} "
        f"--repeats {args.repeats}` on {platform.node()} ({os.cpu_count()} cores), "
        f"{time.strftime('%Y-%m-%d')}. A table of {args.rows:,} x {args.dim} float32 "
        f"({mib(table_bytes)} MiB) split over {n_ps} ps ({mib(table_bytes / n_ps)} MiB each) "
        "by recipes/keras_model.py under the replica_device_setter; the chief's process builds "
        "the graph, runs the initialiser and saves over gRPC on loopback. Peak RSS (VmHWM) in "
        f"MiB, medians of {args.repeats} alternating runs.",
        "",
        "Initialisation. `row-wise`: Keras' RandomUniform, each part initialised on its own ps at "
        "its shape; `whole`: the same values from an initializer with no row-wise form, the "
        "parts sliced from the whole initial value (what every split table did before).",
        "",
        "| process | " + " | ".join(f"{m}: before init -> peak" for m in MODES) + " |",
        "|---|" + "---|" * len(MODES),
    ]
    for i, name in enumerate(names):
        cells = [_rss_cells(runs[m], ("before", i), ("after", i)) for m in MODES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    secs = [f"{_median(runs[m], 'secs'):.2f}" for m in MODES]
    lines += [
        "| initialiser wall time (s) | " + " | ".join(secs) + " |",
        "",
        "One checkpoint of a row-wise run by the recipes' chief saver (recipes/runtime.py "
        "`chief_saver`): `gathered by the chief`, a plain non-sharded saver: the chief pulls "
        "every variable and writes the checkpoint (what every save did before, and the saves of "
        "hosts without a shared folder until the streamed saver); `on each ps`, sharded: each ps "
        "writes its own variables and one merges the parts (recipes/ps_saving.py, where every ps "
        "sees the output folder); `streamed through the chief`: written on the chief's host in "
        "chunks of 64 MiB, each read on its ps (recipes/streamed_saver.py, where the ps do not "
        "see it). Peak RSS after the initialiser -> after the save.",
        "",
        "| process | " + " | ".join(SAVE_LABELS[m] for m in SAVES) + " |",
        "|---|" + "---|" * len(SAVES),
    ]
    for i, name in enumerate(names):
        cells = [_rss_cells(saves[m], ("after", i), ("save", "after", i)) for m in SAVES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    seconds = [f"{_median(saves[m], 'save', 'secs'):.2f}" for m in SAVES]
    sizes = [mib(_median(saves[m], "save", "bytes")) for m in SAVES]
    lines += [
        "| save wall time (s) | " + " | ".join(seconds) + " |",
        "| checkpoint (MiB) | " + " | ".join(sizes) + " |",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench_table_init.md")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    saves: dict[str, list[dict[str, Any]]] = {m: [] for m in SAVES}
    for r in range(args.repeats):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            runs[mode].append(one_run(mode, args.rows, args.dim, args.ps))
            print(f"round {r + 1}: {mode} done", flush=True)
        for save in SAVES if r % 2 == 0 else SAVES[::-1]:
            saves[save].append(one_run("row-wise", args.rows, args.dim, args.ps, save))
            print(f"round {r + 1}: save {save} done", flush=True)
    text = report(runs, saves, args)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
