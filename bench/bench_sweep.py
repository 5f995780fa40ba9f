"""Sweeps: wall time against the points' training, cold tasks against tasks forked from a seed.

    .venv/bin/python bench/bench_sweep.py [--points 8] [--repeats 1] [--steps 1000]
        [--prune-steps 6000] [--concurrency 1,2] [--out docs/bench_sweep.md]

One run holds both ways side by side, alternating, on the default experiment (`cluster=local
algo=downpour`, digits, 1,000 steps), sweeping `algo.lr` over N values:

- cold: `sweep.warm=false`, every task a new process that imports TensorFlow (what every sweep
  did before warm seeds);
- warm: `sweep.warm=true` (the default), every task forked from the host's seed;
- warm with `--concurrency 2` (two clusters at once on the same 2 cores: each point's training
  is slower, the sweep shorter).

Per sweep: wall time of `tfplan apply -m` (the command, start to end), the sum of the points'
training time (`wall_time_secs` of each result.json, the chief's own clock from its first to
its last step), their ratio; and for every point after the first, apply -> first step: from
the point's start in sweep.json to the chief's first step (its task's `started_at` in the
point's state plus the `first step X s after launch` of its log). Also the processes left
after each sweep (tfplan's recorded groups and seeds still alive: must be 0). Cold with
`--concurrency 2` stands for processes prepared ahead that import TensorFlow themselves: the
next point's imports overlap the previous point's training.

Pruning: a warm sweep over learning rates that crawl or train well (PRUNE_LRS, in a fixed
order), with an evaluator, `sweep.prune=none` against `sweep.prune=median`: wall time, the best
point each found, how many were pruned, processes left.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import free_port_base, recorded_groups  # noqa: E402

FIRST_STEP = re.compile(r"first step ([0-9.]+)s after launch")
# Learning rates some of which crawl (1e-4 .. 1e-3) or are too large, in an order a search
# might try them; 6,000 steps with an evaluator scoring checkpoints every half second.
PRUNE_LRS = ["0.1", "0.0005", "0.3", "0.0002", "0.05", "0.001", "0.2", "0.0001"]
PRUNE_STEPS = 6000
PRUNE_SWEEP = (
    "cluster.evaluator=true",
    "trainer.eval_secs=0.5",
    "sweep.prune_startup_points=2",
)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def one_sweep(
    ws: Path,
    name: str,
    warm: bool,
    lrs: list[str],
    concurrency: int = 1,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    port = free_port_base(20 * len(lrs))
    out = ws / name
    args = [
        sys.executable,
        "-m",
        "tfplan",
        "apply",
        "-m",
        "--auto-approve",
        "--concurrency",
        str(concurrency),
        "cluster=local",
        "algo=downpour",
        f"algo.lr={','.join(lrs)}",
        f"experiment.id={name}",
        f"cluster.output_dir={out}",
        f"cluster.workdir={ws / 'work' / name}",
        f"cluster.port_base={port}",
        "cluster.port_range=10",
        f"sweep.warm={'true' if warm else 'false'}",
        *extra,
    ]
    env = {**os.environ, "TFPLAN_CONF": str(REPO / "conf")}
    began = time.monotonic()
    done = subprocess.run(args, cwd=ws, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - began
    if "Sweep complete!" not in done.stdout:
        raise SystemExit(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    points = json.loads((out / "sweep.json").read_text())["points"]
    training = 0.0
    first_steps = []
    best: tuple[float, str] = (-1.0, "")
    statuses: dict[str, int] = {}
    pruned_points = []
    for point in sorted(points, key=lambda p: p["num"]):
        statuses[point["status"]] = statuses.get(point["status"], 0) + 1
        if point["status"] == "pruned":
            pruned_points.append(" ".join(point["overrides"]))
        if point["status"] != "succeeded":
            continue
        result = json.loads((out / str(point["num"]) / "result.json").read_text())
        training += float(result["wall_time_secs"])
        best = max(best, (float(result["accuracy"]), " ".join(point["overrides"])))
        state = json.loads((ws / ".tfplan" / point["experiment_id"] / "state.json").read_text())
        chief = next(t for t in state["tasks"] if t["name"] == "worker/0")
        log = Path(chief["log_path"]).read_text()
        match = FIRST_STEP.search(log)
        if match and point["num"] > 0:
            first = float(chief["started_at"]) + float(match.group(1))
            first_steps.append(first - float(point["started_at"]))
    seeds = (out / "seeds.json").exists()
    left = [g for g in recorded_groups(ws) if _alive(g)]
    return {
        "name": name,
        "warm": warm,
        "concurrency": concurrency,
        "wall_secs": round(wall, 2),
        "training_secs": round(training, 2),
        "ratio": round(wall / training, 2),
        "first_step_secs": [round(s, 2) for s in first_steps],
        "first_step_median": round(statistics.median(first_steps), 2) if first_steps else 0.0,
        "left": len(left) + int(seeds),
        "statuses": statuses,
        "best_accuracy": round(best[0], 4),
        "best_point": best[1],
        "pruned": statuses.get("pruned", 0),
        "pruned_points": pruned_points,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--prune-points", type=int, default=len(PRUNE_LRS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1000, help="trainer.max_steps of a point")
    parser.add_argument("--prune-steps", type=int, default=PRUNE_STEPS, help="of a pruning point")
    parser.add_argument(
        "--concurrency", default="1,2", help="the --concurrency values swept, comma-separated"
    )
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_sweep.md"))
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    steps = (f"trainer.max_steps={args.steps}",)
    prune_sweep = (*PRUNE_SWEEP, f"trainer.max_steps={args.prune_steps}")
    lrs = [f"{0.01 * (i + 1):.2f}" for i in range(args.points)]
    prune_lrs = PRUNE_LRS[: args.prune_points]
    runs: list[dict[str, Any]] = []
    prunes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tfplan-sweep-bench-") as tmp:
        for i in range(args.repeats):
            for concurrency in concurrencies:
                for warm in (False, True):
                    name = f"{'warm' if warm else 'cold'}{concurrency}-{i}"
                    runs.append(one_sweep(Path(tmp), name, warm, lrs, concurrency, steps))
                    print(json.dumps(runs[-1]), flush=True)
            for prune in ("none", "median"):
                extra = (*prune_sweep, f"sweep.prune={prune}")
                name = f"prune-{prune}-{i}"
                run = one_sweep(Path(tmp), name, True, prune_lrs, 1, extra)
                prunes.append({**run, "prune": prune})
                print(json.dumps(prunes[-1]), flush=True)

    def med(warm: bool, key: str, concurrency: int = 1) -> float | None:
        chosen = [r[key] for r in runs if r["warm"] == warm and r["concurrency"] == concurrency]
        return statistics.median(chosen) if chosen else None

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:g}"

    lines = [
        "# Sweeps: cold tasks against tasks forked from a warm seed (bench/bench_sweep.py)",
        "",
        f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.points}-point sweeps of `cluster=local algo=downpour` (3 tasks, {args.steps:,} "
        "steps) "
        f"over `algo.lr`, cold and warm alternating, {args.repeats} of each, medians.",
        "",
        "| measure | cold (`sweep.warm=false`) | warm (default) | warm / cold | cold, "
        "`--concurrency 2` | warm, `--concurrency 2` |",
        "|---|---|---|---|---|---|",
    ]
    for label, key in (
        ("sweep wall time (s)", "wall_secs"),
        ("sum of the points' training (s)", "training_secs"),
        ("wall / training", "ratio"),
        ("apply -> first step, points after the first (s, median)", "first_step_median"),
        ("processes left after the sweep", "left"),
    ):
        cold, warm = med(False, key), med(True, key)
        cold2, warm2 = med(False, key, 2), med(True, key, 2)
        share = f"{warm / cold:.2f}x" if cold and warm is not None else "-"
        lines.append(
            f"| {label} | {cell(cold)} | {cell(warm)} | {share} | {cell(cold2)} | {cell(warm2)} |"
        )

    def pmed(prune: str, key: str) -> float:
        return statistics.median(r[key] for r in prunes if r["prune"] == prune)

    def best(prune: str) -> str:
        return ", ".join(
            sorted(
                {f"{r['best_point']} ({r['best_accuracy']})" for r in prunes if r["prune"] == prune}
            )
        )

    none_wall, median_wall = pmed("none", "wall_secs"), pmed("median", "wall_secs")
    lines += [
        "",
        f"Pruning: {len(prune_lrs)} points, `algo.lr` in that order "
        f"({', '.join(prune_lrs)}), `{' '.join(prune_sweep)}`, warm; medians.",
        "",
        "| measure | `sweep.prune=none` | `sweep.prune=median` | median / none |",
        "|---|---|---|---|",
        f"| sweep wall time (s) | {none_wall:g} | {median_wall:g} | "
        f"{median_wall / none_wall:.2f}x |",
        f"| best point (accuracy) | {best('none')} | {best('median')} | |",
        f"| points pruned | {pmed('none', 'pruned'):g} | {pmed('median', 'pruned'):g} | |",
        f"| processes left after the sweep | {pmed('none', 'left'):g} | "
        f"{pmed('median', 'left'):g} | |",
    ]
    lines += ["", "Every sweep:", ""]
    lines += [f"- {json.dumps(r)}" for r in [*runs, *prunes]]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
