"""The windowed algorithms' rule for embedding tables, against the dense rule, on the CTR example.

    .venv/bin/python bench/bench_table_rules.py --baseline PATH [--algos downpour,easgd]
        [--steps 1500] [--repeats 2] [--vocab-scale 0.01] [--out docs/bench_table_rules.md]

The windowed algorithms (DOWNPOUR, EASGD, ...) keep their tables out of the workers' copies: the
dense layers train through the window, the tables' rows are read and written on the ps at every
step (hogwild's rule; recipes/algorithms/local.py). The dense rule (``--baseline``: a checkout
from before, whose workers copy every table and exchange it whole per window) is what the
published algorithms do, possible only while every table fits every worker. This runs
examples/ctr (26 tables, a DCN-v2; its own make_data.py, ``--vocab-scale`` of the real
vocabularies) over 2 ps and 2 workers with each rule, interleaved, plus hogwild as the reference
that reads rows everywhere, and reports the held-out accuracy and log loss of the chief's
result.json (the click rate's own log loss is the bar to beat), and examples/s. Medians of
``--repeats`` runs.
"""

from __future__ import annotations

import argparse
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
from _example_runs import apply_example, click_run  # noqa: E402

BATCH = 64
EXAMPLES = 40_000


def overrides(algo: str, scale: float, steps: int) -> list[str]:
    return [
        "cluster.ps=2",
        f"algo={algo}",
        "model._target_=ctr.models.build",
        f"model.vocab_scale={scale}",
        "model.partition_bytes=500000",
        *click_run(BATCH, steps),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, help="a checkout with the dense rule")
    parser.add_argument("--algos", default="downpour,easgd")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vocab-scale", type=float, default=0.01)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_table_rules.md"))
    args = parser.parse_args()
    algos = args.algos.split(",")
    runs = [(a, "rows (now)", REPO) for a in algos]
    runs += [(a, "dense (before)", Path(args.baseline)) for a in algos]
    runs.append(("hogwild", "rows (now)", REPO))
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-table-rules-") as tmp:
        project = Path(tmp) / "ctr"
        shutil.copytree(REPO / "examples" / "ctr", project)
        made = subprocess.run(
            [sys.executable, "make_data.py", "data", str(EXAMPLES)]
            + ["--vocab-scale", str(args.vocab_scale)],
            cwd=project,
            env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"},
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        rate = float(re.findall(r"click rate ([\d.]+)", made.stdout)[-1])
        n = 0
        for _ in range(args.repeats):
            for algo, rule, checkout in runs:
                n += 1
                result = apply_example(
                    project, checkout, f"r{n}", overrides(algo, args.vocab_scale, args.steps)
                )
                got.setdefault((algo, rule), []).append(
                    {k: float(result[k]) for k in ("accuracy", "eval_loss", "examples_per_sec")}
                )
                print(f"{algo} {rule}: {got[(algo, rule)][-1]}", flush=True)
    load_end = os.getloadavg()
    base_loss = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    lines = [
        "# Benchmark: the windowed algorithms' rule for embedding tables (CTR example)",
        "",
        f"`.venv/bin/python bench/bench_table_rules.py --baseline BEFORE --algos {args.algos} "
        f"--steps {args.steps} --repeats {args.repeats} --vocab-scale {args.vocab_scale}` on "
        f"{platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. examples/ctr "
        f"(26 tables at {args.vocab_scale:g} x the real vocabularies, a DCN-v2; {EXAMPLES:,} "
        f"training examples, click rate {rate:.3f}) over 2 ps and 2 workers, batch {BATCH}, "
        f"{args.steps:,} steps, `algo.optimizer=sgd` at each algorithm's default rate. `rows`: "
        "this checkout (the tables out of the window: their rows read and written on the ps at "
        "every step); `dense`: the baseline checkout (every worker copies every table and "
        "exchanges it whole per window, the published rule). Held-out accuracy and log loss "
        "from the chief's result.json, medians of the repeats (runs interleaved). The click "
        f"rate alone scores accuracy {max(rate, 1 - rate):.3f} and log loss {base_loss:.3f}. "
        f"Load average {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end.",
        "",
        "| algorithm | tables | accuracy | log loss | examples/s |",
        "|---|---|---|---|---|",
    ]
    for (algo, rule), values in got.items():

        def med(key: str, values: list[dict[str, float]] = values) -> float:
            return statistics.median(v[key] for v in values)

        lines.append(
            f"| {algo} | {rule} | {med('accuracy'):.4f} | {med('eval_loss'):.4f} | "
            f"{med('examples_per_sec'):,.0f} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
