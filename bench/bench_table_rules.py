"""Every algorithm's accuracy on the CTR example, and the windowed algorithms' rule for embedding
tables against the dense rule.

    .venv/bin/python bench/bench_table_rules.py [--algos downpour,easgd] [--baseline PATH]
        [--baseline-algos downpour,easgd] [--anchor] [--steps 1500] [--repeats 2]
        [--vocab-scale 0.01] [--out docs/bench_table_rules.md]

The windowed algorithms (DOWNPOUR, EASGD, ...) keep their tables out of the workers' copies: the
dense layers train through the window, the tables' rows are read and written on the ps at every
step (hogwild's rule; recipes/algorithms/local.py). The dense rule (``--baseline``: a checkout
from before, whose workers copy every table and exchange it whole per window) is what the
published algorithms do, possible only while every table fits every worker. This runs
examples/ctr (26 tables, a DCN-v2; its own make_data.py, ``--vocab-scale`` of the real
vocabularies) over 2 ps and 2 workers with each of ``--algos`` (this checkout) and of
``--baseline-algos`` (the baseline), interleaved, plus hogwild as the reference that reads rows
everywhere, and reports the held-out accuracy and log loss of the chief's result.json (the click
rate's own log loss is the bar to beat), and examples/s. ``--anchor`` adds the same model trained
by Keras' own ``fit`` in one process (bench/_ctr_one_process_fit.py: the same records, batch,
steps, SGD at hogwild's rate): every algorithm's accuracy is reported against it (issue 34's
goal: within 1 point). Medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _example_runs import apply_example, click_run, make_ctr_data  # noqa: E402

BATCH = 64
EXAMPLES = 40_000
ANCHOR = ("Keras fit", "one process")
ANCHOR_LR = 0.05  # hogwild's default rate (conf/algo/hogwild.yaml), SGD as every run here
# What a failed run's row says: tfplan's own one-line explanation of the failure.
WHY = re.compile(r"tfplan\s+\| \S+ failed: (.*)")


def _why(output: str) -> str:
    found = WHY.findall(output)
    return found[-1].strip() if found else output.strip().splitlines()[-1][:200]


def one_process_fit(project: Path, scale: float, steps: int, lr: float) -> dict[str, float]:
    """bench/_ctr_one_process_fit.py's scores (accuracy, eval_loss, examples_per_sec)."""
    script = REPO / "bench" / "_ctr_one_process_fit.py"
    args = [str(project), str(scale), str(steps), str(BATCH), str(lr)]
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the one-process fit failed:\n{done.stderr[-3000:]}")
    scores: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return scores


# The cluster each algorithm runs on: 2 ps and 2 workers, but pss's coordinator is a chief of its
# own and allreduce has no ps (its 2 workers hold every table).
TOPOLOGY = {"pss": ["cluster.chief=separate"], "allreduce": ["cluster=local_allreduce"]}


def overrides(algo: str, scale: float, steps: int, lr: float | None) -> list[str]:
    return [
        *(TOPOLOGY.get(algo) or ["cluster.ps=2"]),
        f"algo={algo}",
        *([f"algo.lr={lr}"] if lr is not None else []),
        "model._target_=ctr.models.build",
        f"model.vocab_scale={scale}",
        "model.partition_bytes=500000",
        *click_run(BATCH, steps),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algos", default="downpour,easgd", help="run with this checkout")
    parser.add_argument("--baseline", help="a checkout with the dense rule")
    parser.add_argument("--baseline-algos", default="downpour,easgd", help="run with --baseline")
    parser.add_argument("--anchor", action="store_true", help="also one process's Keras fit")
    parser.add_argument(
        "--lr", type=float, help="algo.lr of every run (default: each algorithm's own)"
    )
    parser.add_argument(
        "--lr-of",
        action="append",
        default=[],
        metavar="ALGO=LR",
        help="algo.lr of one algorithm's runs, over --lr (e.g. eamsgd=0.01)",
    )
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vocab-scale", type=float, default=0.01)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_table_rules.md"))
    args = parser.parse_args()
    algos = args.algos.split(",")
    runs = [(a, "rows (now)", REPO) for a in algos]
    if args.baseline:
        dense = args.baseline_algos.split(",")
        runs += [(a, "dense (before)", Path(args.baseline)) for a in dense]
    if "hogwild" not in algos:
        runs.append(("hogwild", "rows (now)", REPO))
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    failed: dict[tuple[str, str], str] = {}
    lrs = {algo: float(lr) for algo, lr in (item.split("=", 1) for item in args.lr_of)}
    anchor_lr = args.lr or ANCHOR_LR
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-table-rules-") as tmp:
        project = Path(tmp) / "ctr"
        shutil.copytree(REPO / "examples" / "ctr", project)
        made = make_ctr_data(project, EXAMPLES, args.vocab_scale)
        rate = float(re.findall(r"click rate ([\d.]+)", made)[-1])
        n = 0
        for _ in range(args.repeats):
            for algo, rule, checkout in runs:
                n += 1
                if algo == "allreduce":
                    rule = "replicated (now)"
                try:
                    result = apply_example(
                        project,
                        checkout,
                        f"r{n}",
                        overrides(algo, args.vocab_scale, args.steps, lrs.get(algo, args.lr)),
                    )
                except RuntimeError as error:  # a run that failed is a row that says so
                    failed[(algo, rule)] = _why(str(error))
                    print(f"{algo} {rule}: failed: {failed[(algo, rule)]}", flush=True)
                    continue
                got.setdefault((algo, rule), []).append(
                    {k: float(result[k]) for k in ("accuracy", "eval_loss", "examples_per_sec")}
                )
                print(f"{algo} {rule}: {got[(algo, rule)][-1]}", flush=True)
            if args.anchor:
                got.setdefault(ANCHOR, []).append(
                    one_process_fit(project, args.vocab_scale, args.steps, anchor_lr)
                )
                print(f"{ANCHOR}: {got[ANCHOR][-1]}", flush=True)
    load_end = os.getloadavg()
    base_loss = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    command = (
        f"`.venv/bin/python bench/bench_table_rules.py --algos {args.algos}"
        + (f" --baseline BEFORE --baseline-algos {args.baseline_algos}" if args.baseline else "")
        + (" --anchor" if args.anchor else "")
        + (f" --lr {args.lr}" if args.lr is not None else "")
        + "".join(f" --lr-of {item}" for item in args.lr_of)
        + f" --steps {args.steps} --repeats {args.repeats} --vocab-scale {args.vocab_scale}`"
    )
    lines = [
        "# Benchmark: every algorithm on the CTR example, and the tables' rule of the windowed ones",
        "",
        f"{command} on {platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. "
        f"examples/ctr (26 tables at {args.vocab_scale:g} x the real vocabularies, a DCN-v2; "
        f"{EXAMPLES:,} training examples, click rate {rate:.3f}) over 2 ps and 2 workers (pss: and "
        "its coordinator; allreduce: no ps), batch "
        f"{BATCH}, {args.steps:,} steps, `algo.optimizer=sgd` at "
        + (f"`algo.lr={args.lr}`" if args.lr is not None else "each algorithm's rate")
        + "".join(f" ({algo}: {lr:g})" for algo, lr in lrs.items())
        + ". "
        + "`rows`: this checkout (the windowed algorithms keep the tables out of the window: their "
        "rows read and written on the ps at every step; allreduce replicates them)"
        + (
            "; `dense`: the baseline checkout (every worker copies every table and exchanges it "
            "whole per window, the published rule)"
            if args.baseline
            else ""
        )
        + (
            f"; `one process`: Keras' own `fit` of the same model on the same records, batch and "
            f"steps, SGD at {anchor_lr}, in one process"
            if args.anchor
            else ""
        )
        + ". Held-out accuracy and log loss from the chief's result.json, medians of the repeats "
        "(runs interleaved). The click rate alone scores accuracy "
        f"{max(rate, 1 - rate):.3f} and log loss {base_loss:.3f}. Load average "
        f"{load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end.",
        "",
        "| algorithm | tables | accuracy | log loss | examples/s |"
        + (" accuracy - one process (points) |" if args.anchor else ""),
        "|---|---|---|---|---|" + ("---|" if args.anchor else ""),
    ]

    def med(key: str, values: list[dict[str, float]]) -> float:
        return statistics.median(v[key] for v in values)

    anchor = med("accuracy", got[ANCHOR]) if args.anchor else None
    for (algo, rule), values in got.items():
        accuracy = med("accuracy", values)
        line = (
            f"| {algo} | {rule} | {accuracy:.4f} | {med('eval_loss', values):.4f} | "
            f"{med('examples_per_sec', values):,.0f} |"
        )
        if anchor is not None:
            line += f" {100 * (accuracy - anchor):+.1f} |"
        lines.append(line)
    for (algo, rule), why in failed.items():
        if (algo, rule) not in got:  # failed in every repeat
            lines.append(
                f"| {algo} | {rule} | failed: {why} | - | - |" + (" - |" if anchor else "")
            )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
