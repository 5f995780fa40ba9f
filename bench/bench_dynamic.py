"""A dynamic table against a hashed table and a fixed vocabulary, side by side on a drifting
id stream: collisions, each ps's memory, held-out quality, examples/s.

    .venv/bin/python bench/bench_dynamic.py [--repeats 3] [--examples 120000] [--live 1000]
        [--turnover 20] [--capacity 1200] [--lr 0.5] [--out docs/bench_dynamic.md]
        [--algo hogwild] [--variants dynamic,hashed,hashed-mem,vocab]

(``--algo pss --variants dynamic,hashed --out docs/bench_dynamic_pss.md``: the same under
ParameterServerStrategy, its coordinator a chief task of its own.)

examples/drift writes the stream (``make_data.py``: 120,000 clicks in 6 parts, in time order;
at any time about ``--live`` ids are live, a window that moves ``--turnover`` times its size over
the stream, so that over ten times the capacity of distinct ids appear; held out: clicks drawn
as the stream's last half window is, its latest part) and the three models (the same wide and
deep click model, ids to rows three ways). Each run is ``tfplan apply`` on the embedded local
cluster, 2 ps and one worker (the stream read once, in time order: see ``WORKERS``), HOGWILD!
with Adagrad, a shuffle buffer of 256:

- ``dynamic``: raw ids, ``model.dynamic=[item_embedding]``, ``--capacity`` rows;
- ``hashed``: ``keras.layers.Hashing`` into as many rows;
- ``hashed-mem``: ``Hashing`` into as many rows as the dynamic table's memory holds (its rows and
  Adagrad slots, plus the ids, last-seen steps, free rows and index per row);
- ``vocab``: a fixed vocabulary, the ``--capacity`` most frequent ids of the first part (every
  other id one out-of-vocabulary row): a vocabulary built once, gone stale.

Measured: held-out log loss and AUC of each run's exported ``model.keras`` fed the raw held-out
ids; examples/s (the chief's ``result.json``); for ``dynamic``, the distinct ids that share a row
in its final checkpoint and each ps's RSS sampled every 0.2 s (from the first eviction on: its
range against its value then); for ``hashed``, the share of distinct ids that share a bucket.
Medians over ``--repeats`` runs, variants interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _example_runs import apply_example  # noqa: E402

CAPACITY = 1000  # rows of the dynamic table (--capacity)
WIDTH = 8  # drift.models' embed
BATCH = 64
# One worker reads the stream in time order, once: with two, each reads its half at its own
# pace, and HOGWILD! lets the faster one wrap around to the stream's start (measured: with two
# workers the final table held the ids of the start of the last part and none of its end, the
# chief being slower than the other worker), so the last steps would not be the latest clicks.
WORKERS = 1
# per row of the dynamic table beyond its row and slot: id (8), last seen (8), free stack (8),
# index entry (recipes/dynamic_table.py: INDEX_BYTES_PER_ROW)
AUX_BYTES = 8 + 8 + 8 + 64
ROW_BYTES = 4 * WIDTH * 2  # the row and its Adagrad accumulator


def variants(data: Path) -> dict[str, list[str]]:
    same_memory = CAPACITY * (ROW_BYTES + AUX_BYTES) // ROW_BYTES
    return {
        "dynamic": [
            "model._target_=drift.models.build",
            f"model.rows={CAPACITY}",
            "model.dynamic=[item_embedding]",
            "model.ttl_steps=200",
        ],
        "hashed": ["model._target_=drift.models.build_hashed", f"model.rows={CAPACITY}"],
        "hashed-mem": ["model._target_=drift.models.build_hashed", f"model.rows={same_memory}"],
        "vocab": ["model._target_=drift.models.build_vocab", f"model.vocab_file={data}/vocab.txt"],
    }


LR = 0.1  # --lr
ALGO = "hogwild"  # --algo
VARIANTS = "dynamic,hashed,hashed-mem,vocab"  # --variants


def common(examples: int) -> list[str]:
    steps = examples // BATCH  # one pass over the stream
    return [
        "data=tfrecord",
        "data.train=data/part-*.tfrecord",
        "data.eval=data/eval.tfrecord",
        "data.label=clicked",
        "data.shard=none",
        "data.shuffle_buffer=256",
        f"data.batch_size={BATCH}",
        "model.loss=binary_crossentropy",
        f"algo={ALGO}",
        *(["cluster.chief=separate"] if ALGO == "pss" else []),
        "algo.optimizer=adagrad",
        f"algo.lr={LR}",
        "cluster.ps=2",
        f"cluster.workers={WORKERS}",
        f"trainer.max_steps={steps}",
        f"trainer.checkpoint_steps={steps}",
        "trainer.log_steps=100000",
    ]


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class PsMemory:
    """Samples each ps's RSS (KiB) every 0.2 s while a run goes, by the pids its state records."""

    def __init__(self, project: Path, run: str) -> None:
        self.state = project / ".tfplan" / run / "state.json"
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                tasks = json.loads(self.state.read_text())["tasks"]
            except (OSError, ValueError, KeyError):
                continue
            now = {}
            for t in tasks:
                pid = (t.get("handle") or {}).get("pid")
                if t["name"].startswith("ps/") and pid:
                    rss = rss_kib(int(pid))
                    if rss:
                        now[t["name"]] = rss
            if now:
                self.samples.append((time.time(), now))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def apply(project: Path, run: str, overrides: list[str], memory: bool) -> dict[str, Any]:
    """One run (bench/_example_runs.py), each ps's RSS sampled meanwhile when ``memory``."""
    sampler = PsMemory(project, run) if memory else None
    try:
        result = apply_example(project, REPO, run, overrides)
    finally:
        if sampler:
            sampler.stop()
    out = project / "runs" / run / "out"
    found: dict[str, Any] = {"result": result}
    found["quality"] = quality(out / "model.keras", project / "data" / "eval.tfrecord")
    if sampler:
        found["memory"] = memory_after_first_eviction(sampler.samples, out)
        found["shared_rows"] = shared_rows(out)
    return found


def quality(model_file: Path, eval_file: Path) -> dict[str, float]:
    """Held-out log loss and AUC of an exported model, fed the raw held-out ids."""
    import keras
    import numpy as np
    import tensorflow as tf

    model = keras.saving.load_model(str(model_file))
    items, counts, labels = [], [], []
    for raw in tf.data.TFRecordDataset(str(eval_file)).as_numpy_iterator():
        f = tf.train.Example.FromString(raw).features.feature
        items.append(f["item"].int64_list.value[0])
        counts.append(f["count0"].float_list.value[0])
        labels.append(f["clicked"].int64_list.value[0])
    logits = model.predict(
        {"item": np.array(items, np.int64), "count0": np.array(counts, np.float32)},
        batch_size=1024,
        verbose=0,
    ).ravel()
    y = np.array(labels, np.float64)
    p = np.clip(1 / (1 + np.exp(-logits.astype(np.float64))), 1e-7, 1 - 1e-7)
    loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    auc = keras.metrics.AUC(num_thresholds=2000)
    auc.update_state(y, p)
    rate = float(np.clip(y.mean(), 1e-7, 1 - 1e-7))  # the held-out click rate's own log loss
    base = float(-(rate * np.log(rate) + (1 - rate) * np.log(1 - rate)))
    return {"log_loss": loss, "auc": float(auc.result()), "rate_log_loss": base}


def memory_after_first_eviction(
    samples: list[tuple[float, dict[str, int]]], out: Path
) -> dict[str, Any]:
    """Each ps's RSS at the first eviction and its range from then on (KiB)."""
    events = [json.loads(x) for x in (out / "dynamic_tables.jsonl").read_text().splitlines()]
    first = min(e["at"] for e in events)
    after = [(t, s) for t, s in samples if t >= first]
    report = {"evictions": len(events), "evicted": sum(e["evicted"] for e in events)}
    for ps in sorted({k for _, s in after for k in s}):
        series = [s[ps] for _, s in after if ps in s]
        if series:
            report[ps] = {"at_first": series[0], "min": min(series), "max": max(series)}
    return report


def shared_rows(out: Path) -> dict[str, int]:
    """Distinct ids sharing a row, and rows holding two ids, in the final checkpoint."""
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, str(REPO))
    from recipes.checkpoint_names import PlainNames  # either format: TF1's names or pss's

    reader = PlainNames(tf.train.load_checkpoint(tf.train.latest_checkpoint(str(out))))
    ids_seen: dict[int, int] = {}
    two_ids = 0
    resident = 0
    for i in range(2):
        aux = f"dynamic/item_embedding/embeddings/shard_{i}"
        seen = reader.get_tensor(f"{aux}/last_seen")
        ids = reader.get_tensor(f"{aux}/row_ids")
        live = np.flatnonzero(seen >= 0)
        resident += len(live)
        rows = [(i, int(r)) for r in live]
        two_ids += len(rows) - len(set(rows))
        for r in live:
            ids_seen[int(ids[r])] = ids_seen.get(int(ids[r]), 0) + 1
    return {
        "resident": resident,
        "ids_with_two_rows": sum(1 for c in ids_seen.values() if c > 1),
        "rows_with_two_ids": two_ids,
    }


def hashed_shares(project: Path, rows: int) -> dict[str, float]:
    sys.path.insert(0, str(project))
    from collisions import hashed_collisions, read_ids  # examples/drift/collisions.py

    parts = sorted((project / "data").glob("part-*.tfrecord"))
    whole = [read_ids(str(p)) for p in parts]
    import numpy as np

    return {
        "stream": hashed_collisions(np.unique(np.concatenate(whole)), rows),
        "last_part": hashed_collisions(np.unique(whole[-1]), rows),
    }


def main() -> None:
    global CAPACITY, LR, ALGO
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--examples", type=int, default=120_000)
    parser.add_argument("--live", type=int, default=1000, help="make_data.py --live")
    parser.add_argument("--turnover", type=int, default=20, help="make_data.py --turnover")
    parser.add_argument("--capacity", type=int, default=1200, help="the table's rows")
    parser.add_argument("--lr", type=float, default=0.5, help="algo.lr (Adagrad)")
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_dynamic.md"))
    parser.add_argument("--algo", default="hogwild", help="hogwild (or another TF1 one), pss")
    parser.add_argument("--variants", default=VARIANTS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    CAPACITY, LR, ALGO = args.capacity, args.lr, args.algo
    chosen = args.variants.split(",")
    for needed in ("dynamic", "hashed"):
        if needed not in chosen:
            parser.error(f"--variants: {needed} is needed (the report compares them)")
    with tempfile.TemporaryDirectory(prefix="bench-dynamic-") as tmp:
        project = Path(tmp) / "drift"
        shutil.copytree(REPO / "examples" / "drift", project, ignore=shutil.ignore_patterns("data"))
        made = subprocess.run(
            [
                sys.executable,
                "make_data.py",
                "data",
                "--examples",
                str(args.examples),
                "--vocab-out",
                "data/vocab.txt",
                "--vocab-parts",
                "1",
                "--vocab-size",
                str(CAPACITY),
                "--live",
                str(args.live),
                "--turnover",
                str(args.turnover),
                # held out: the latest clicks (as the stream's last half window of ids is)
                "--eval-span",
                str(0.5 / args.turnover),
            ],
            cwd=project,
            capture_output=True,
            text=True,
            check=True,
        )
        stream = json.loads((project / "data" / "stream.json").read_text())
        runs: dict[str, list[dict[str, Any]]] = {}
        started = time.monotonic()
        for repeat in range(args.repeats):
            for name, overrides in variants(project / "data").items():
                if name not in chosen:
                    continue
                run = f"{name}-{repeat}"
                print(f"{run} ...", flush=True)
                found = apply(project, run, [*common(args.examples), *overrides], name == "dynamic")
                runs.setdefault(name, []).append(found)
                print(
                    f"  {found['quality']}, {found['result'].get('examples_per_sec')} examples/s",
                    flush=True,
                )
        shares = hashed_shares(project, CAPACITY)
        same_memory = CAPACITY * (ROW_BYTES + AUX_BYTES) // ROW_BYTES
        shares_mem = hashed_shares(project, same_memory)
        report = write_report(
            args, runs, stream, shares, shares_mem, same_memory, made.stdout.strip(), started
        )
    Path(args.out).write_text(report)
    print(report)


def med(values: list[float]) -> float:
    return statistics.median(values)


def write_report(
    args: Any,
    runs: dict[str, list[dict[str, Any]]],
    stream: dict[str, Any],
    shares: dict[str, float],
    shares_mem: dict[str, float],
    same_memory: int,
    made: str,
    started: float,
) -> str:
    base = runs["dynamic"][0]["quality"]["rate_log_loss"]
    rows = []
    speeds = {n: med([r["result"]["examples_per_sec"] for r in rs]) for n, rs in runs.items()}
    for name, rs in runs.items():
        loss = med([r["quality"]["log_loss"] for r in rs])
        auc = med([r["quality"]["auc"] for r in rs])
        rows.append(
            f"| {name} | {loss:.4f} | {auc:.4f} | {speeds[name]:,.0f} | "
            f"{speeds[name] / speeds['hashed']:.2f}x |"
        )
    dyn = runs["dynamic"]
    shared = [r["shared_rows"] for r in dyn]
    memory_lines = []
    for i, r in enumerate(dyn):
        m = r["memory"]
        for ps in sorted(k for k in m if k.startswith("ps/")):
            v = m[ps]
            lo = (v["min"] - v["at_first"]) / v["at_first"] * 100
            hi = (v["max"] - v["at_first"]) / v["at_first"] * 100
            memory_lines.append(
                f"| {i + 1} | {ps} | {v['at_first'] / 1024:,.1f} | {v['min'] / 1024:,.1f} | "
                f"{v['max'] / 1024:,.1f} | {lo:+.1f} % .. {hi:+.1f} % | {m['evictions']} | "
                f"{m['evicted']:,} |"
            )
    elapsed = time.monotonic() - started
    return "\n".join(
        [
            "# Dynamic tables on a drifting id stream (bench/bench_dynamic.py)",
            "",
            f"`.venv/bin/python bench/bench_dynamic.py --repeats {args.repeats} --examples "
            f"{args.examples} --live {args.live} --turnover {args.turnover} --capacity "
            f"{CAPACITY}"
            + ("" if ALGO == "hogwild" else f" --algo {ALGO}")
            + ("" if args.variants == VARIANTS else f" --variants {args.variants}")
            + f"` on {platform.node() and 'this machine'} ({os.cpu_count()} cores), "
            f"{elapsed / 60:.1f} min; medians of {args.repeats} runs per variant, variants "
            "interleaved.",
            "",
            f"The stream (examples/drift): {made}. Capacity {CAPACITY:,} rows of {WIDTH}; "
            f"{stream['distinct_ids']:,} distinct ids over the stream "
            f"({stream['distinct_ids'] / CAPACITY:.1f}x the capacity). Each run: 2 ps, "
            f"{WORKERS} worker(s)"
            + (", a chief of its own, the coordinator" if ALGO == "pss" else "")
            + f", algo={ALGO}, Adagrad (lr {LR:g}), batch {BATCH}, one pass in "
            "time order.",
            "",
            "## Quality and speed",
            "",
            "Held-out log loss and AUC of each run's exported `model.keras` fed the raw ids "
            f"(the held-out click rate's own log loss: {base:.4f}); examples/s from the chief's "
            "result.json, and its ratio to the hashed table of the same rows.",
            "",
            "| variant | log loss | AUC | examples/s | vs hashed |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"`hashed-mem`: {same_memory:,} rows, the dynamic table's bytes per row "
            f"({ROW_BYTES} B of row and slot + {AUX_BYTES} B of id, last seen, free stack and "
            f"index) spent on rows instead.",
            "",
            "## Collisions",
            "",
            "- dynamic: distinct ids sharing a row in the final checkpoint, per run: "
            + ", ".join(str(s["rows_with_two_ids"]) for s in shared)
            + "; ids holding two rows: "
            + ", ".join(str(s["ids_with_two_rows"]) for s in shared)
            + "; resident ids: "
            + ", ".join(f"{s['resident']:,}" for s in shared)
            + ".",
            f"- hashed into {CAPACITY:,} rows: {shares['stream'] * 100:.1f} % of the stream's "
            f"distinct ids share a bucket with another, {shares['last_part'] * 100:.1f} % of the "
            f"last part's; into {same_memory:,} rows: {shares_mem['stream'] * 100:.1f} % and "
            f"{shares_mem['last_part'] * 100:.1f} %.",
            "",
            "## Each ps's memory once the table is full",
            "",
            "RSS (MiB) of each ps process, sampled every 0.2 s, from the chief's first eviction "
            "(dynamic_tables.jsonl) to the end: the stream keeps bringing new ids, the table "
            "frees rows and reuses them.",
            "",
            "| run | ps | at the first eviction | min | max | range | maintenance runs that freed "
            "rows (both ps) | rows freed (both ps) |",
            "|---|---|---|---|---|---|---|---|",
            *memory_lines,
            "",
        ]
    )


if __name__ == "__main__":
    main()
