"""Examples/s of a model with a large embedding table, against the table's number of rows.

    .venv/bin/python bench/bench_embeddings.py [--rows 50000,2000000] [--algos hogwild,downpour,pss]
        [--baseline PATH] [--anchors] [--repeats 1] [--out docs/bench_embeddings.md]

examples/wide_deep (an Embedding of item ids x 16 and a one-column Embedding of the same ids, an
MLP over 8 dense features; Zipf-distributed click logs written by its own make_data.py, ids below
50,000 in every run) is copied to a temporary folder. Then, for each table size (``model.vocab``,
the only setting changed: every run reads the same ids) and each algorithm, ``tfplan apply`` on the
embedded local cluster with 2 ps (``model.partition_bytes=1000000``: the tables split over both)
and 2 workers (and a chief of its own for ``pss``, its coordinator); examples/s is the chief's
``result.json``. With ``--baseline PATH`` (another
checkout of tfplan, e.g. a worktree of the commit before sparse reads) every run is repeated with
that checkout's tfplan and recipes, interleaved, so the two are measured side by side. Medians of
``--repeats`` runs. The report says how much slower the largest table trains than the smallest
(goal: flat, within 20 %). ``--anchors`` adds, at each size, the same model trained by Keras'
own ``fit`` in one process (bench/_one_process_fit.py) and by TensorFlow's ParameterServerStrategy
with tf_keras (bench/_tf_pss_fit.py: 2 ps and 2 workers, the tables split as here), both for
``ANCHOR_STEPS`` steps after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _example_runs import (  # noqa: E402
    apply_example,
    click_run,
    wide_deep_with_data,
)

# Steps of each cluster run: enough that the chief, whose first step waits for it to initialise
# the tables and write the first checkpoint (10 s and more at 10^7 rows, while the other worker
# trains), still sees the job train for many seconds (its result.json's examples/s is the job's
# speed over the steps it saw; issue 34 measured 300 and 600, too few at 10^7 rows).
STEPS = 1500
# The anchors' steps, after their warm-up: one process's Keras fit slows with the table's size
# (it writes the whole table each step), 1,500 steps at 10^7 rows would take half an hour.
ANCHOR_STEPS = 300
TOPOLOGY = {"pss": ["cluster.chief=separate"]}  # its coordinator is a chief of its own
BATCH = 32
LR = 0.05  # algo.lr's default, which the cluster runs keep


def _ratio(value: float) -> str:
    """1.06x, 0.38x, 0.0038x: two significant digits below 0.1 (a 0.00x says nothing)."""
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def apply(project: Path, checkout: Path, run: str, algo: str, rows: int, steps: int) -> float:
    """One run's examples/s (``checkout``'s tfplan and recipes)."""
    result = apply_example(
        project,
        checkout,
        run,
        [
            "cluster.ps=2",
            f"algo={algo}",
            "model._target_=wide_deep.models.build",
            f"model.vocab={rows}",
            "model.partition_bytes=1000000",
            *click_run(BATCH, steps),
            *TOPOLOGY.get(algo, []),
        ],
    )
    return float(result["examples_per_sec"])


ANCHORS = {  # (row label, code label) -> the script that measures it
    ("Keras fit", "one process"): "_one_process_fit.py",
    ("TF ParameterServerStrategy", "tf_keras fit"): "_tf_pss_fit.py",
}


def anchor(script: str, project: Path, rows: int, steps: int) -> float:
    """An anchor's examples/s: the same model, records, batch and rate, trained by ``script``
    (Keras' ``fit`` in one process; TensorFlow's ParameterServerStrategy with tf_keras)."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), str(project), str(rows)]
        + [str(steps), str(BATCH), str(LR)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=True,
    )
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["examples_per_sec"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="50000,2000000")
    parser.add_argument("--algos", default="hogwild,downpour,pss")
    parser.add_argument("--baseline", default="", help="another checkout of tfplan to compare")
    parser.add_argument("--baseline-note", default="the whole table read every step")
    parser.add_argument("--baseline-rows", default="", help="sizes the baseline runs (all)")
    parser.add_argument("--baseline-algos", default="", help="algorithms it runs (all)")
    parser.add_argument("--anchor-max-rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps-scale", type=float, default=1.0, help="x the default steps")
    parser.add_argument(
        "--anchors", action="store_true", help="also one process's Keras fit at each size"
    )
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_embeddings.md"))
    args = parser.parse_args()
    sizes = [int(r) for r in args.rows.split(",")]
    algos = args.algos.split(",")
    variants = {"now": REPO, **({"before": Path(args.baseline)} if args.baseline else {})}
    baseline_rows = [int(r) for r in args.baseline_rows.split(",")] if args.baseline_rows else sizes
    baseline_algos = args.baseline_algos.split(",") if args.baseline_algos else algos
    got: dict[tuple[str, str, int], list[float]] = {}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-embeddings-") as tmp:
        project = wide_deep_with_data(Path(tmp))
        n = 0
        for _ in range(args.repeats):
            for algo in algos:
                steps = max(1, int(STEPS * args.steps_scale))
                for rows in sizes:
                    for name, checkout in variants.items():
                        if name == "before" and not (
                            rows in baseline_rows and algo in baseline_algos
                        ):
                            continue
                        n += 1
                        rate = apply(project, checkout, f"r{n}", algo, rows, steps)
                        got.setdefault((name, algo, rows), []).append(rate)
                        print(f"{name} {algo} {rows:,} rows: {rate:,.0f} examples/s", flush=True)
            if args.anchors:
                steps = max(1, int(ANCHOR_STEPS * args.steps_scale))
                for (label, code), script in ANCHORS.items():
                    for rows in [r for r in sizes if r <= args.anchor_max_rows]:
                        rate = anchor(script, project, rows, steps)
                        got.setdefault((code, label, rows), []).append(rate)
                        print(f"{label}, {code}, {rows:,} rows: {rate:,.0f} examples/s")
    load_end = os.getloadavg()
    lines = [
        "# Benchmark: a large embedding table on parameter servers",
        "",
        f"`.venv/bin/python bench/bench_embeddings.py --rows {args.rows} --algos {args.algos}"
        f"{' --baseline BEFORE' if args.baseline else ''}"
        f"{' --anchors' if args.anchors else ''}"
        f"{f' --anchor-max-rows {args.anchor_max_rows}' if args.anchors else ''}"
        f" --repeats {args.repeats}` on "
        f"{platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. "
        "examples/wide_deep over 2 ps (tables split by `model.partition_bytes=1000000`) and 2 "
        f"workers, batch {BATCH}, the same ids (below 50,000) in every run, only `model.vocab` "
        "changed; examples/s from the chief's result.json, median of the repeats. `now`: this "
        "checkout (a plain Keras Embedding reads only the batch's rows, recipes/sparse_lookup.py, "
        "in pss too, and the optimizers write only those rows)"
        + (f"; `before`: the baseline checkout ({args.baseline_note})" if args.baseline else "")
        + (
            f"; `one process`: Keras' own `fit` of the same model, records, batch and rate in one "
            f"process, and `tf_keras fit`: TensorFlow's ParameterServerStrategy with tf_keras "
            f"(its Embedding reads rows), 2 ps and 2 workers, at sizes up to "
            f"{args.anchor_max_rows:,} rows"
            if args.anchors
            else ""
        )
        + f". Load average {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end.",
        "",
        "| algorithm | code | "
        + " | ".join(f"{r:,} rows" for r in sizes)
        + " | largest / smallest |",
        "|---|---|" + "---|" * len(sizes) + "---|",
    ]
    rows_of = [(algo, name) for algo in algos for name in variants]
    if args.anchors:
        rows_of += list(ANCHORS)
    for algo, name in rows_of:
        rates = [
            statistics.median(got[(name, algo, r)]) if (name, algo, r) in got else None
            for r in sizes
        ]
        cells = " | ".join("-" if r is None else f"{r:,.0f}" for r in rates)
        measured = [r for r in rates if r is not None]
        ratio = _ratio(measured[-1] / measured[0]) if len(measured) > 1 else "-"
        lines.append(f"| {algo} | {name} | {cells} | {ratio} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
