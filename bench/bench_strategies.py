"""The TF2 strategies against their TF1 counterparts, side by side through the recipe harness.

Usage: ``.venv/bin/python bench/bench_strategies.py [--repeats 3] [--steps 1000]
[--out docs/bench_strategies.md]``

Pairs: ``allreduce`` (MultiWorkerMirroredStrategy, 2 workers, no ps) vs ``sync``
(SyncReplicasOptimizer, 1 ps + 2 workers): both synchronous, one global step = 2 minibatches;
``pss`` (ParameterServerStrategy: 1 ps + 2 worker servers + the chief as coordinator; with its
default of 8 minibatches per scheduled function, and with 1) vs ``hogwild`` (1 ps + 2 workers):
all asynchronous, one global step = 1 minibatch. Every run trains
the shipped defaults (``conf/algo/<name>.yaml``, MLP 64-128-10 on digits, batch 64) for the same
number of global steps with no evaluator; all are run in turn, the order rotating each round,
so that all of them share the same minutes of a shared machine. Figures per run: the chief's
``result.json`` (``examples_per_sec``: every replica's examples per second between the chief's
first and last step, start-up excluded; ``accuracy`` on the held-out split), the chief's
launch-to-first-step and the launch-to-last-exit wall time. The report gives medians.
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from recipe_cluster import RecipeCluster, run_config  # noqa: E402

CONFIGS: dict[str, dict[str, Any]] = {
    "allreduce": dict(n_ps=0, n_workers=2, chief=False),
    "sync": dict(n_ps=1, n_workers=2, chief=False),
    "pss": dict(n_ps=1, n_workers=2, chief=True),
    "pss K=1": dict(n_ps=1, n_workers=2, chief=True),
    "hogwild": dict(n_ps=1, n_workers=2, chief=False),
}
PAIRS = [("allreduce", "sync"), ("pss", "hogwild"), ("pss K=1", "hogwild")]
MODEL = {"name": "mlp", "hidden": [128], "conv_channels": [], "dense": 64}
DATA = {"name": "digits", "image_size": 8, "batch_size": 64}


def shipped_algo(label: str) -> dict[str, Any]:
    """The shipped conf/algo defaults; "pss K=1" is pss with one minibatch per dispatch."""
    name = label.split()[0]
    raw = yaml.safe_load((REPO / "conf" / "algo" / f"{name}.yaml").read_text())
    raw.pop("defaults", None)
    if label == "pss K=1":
        raw["steps_per_closure"] = 1
    return {"name": name, "sync": name in ("allreduce", "sync"), **raw}


def one_run(name: str, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench_{name}_") as tmp:
        cfg = run_config(
            Path(tmp) / "out",
            shipped_algo(name),
            max_steps=steps,
            model=MODEL,
            data=DATA,
            trainer={"checkpoint_steps": 200, "summary_steps": 50, "log_steps": 100},
        )
        started = time.monotonic()
        with RecipeCluster(Path(tmp), cfg, **CONFIGS[name]) as c:
            c.start_all()
            codes = c.wait_all(timeout=600)
            wall = time.monotonic() - started
            if any(codes.values()):
                raise SystemExit(f"{name} failed: {codes}\n{c.dump()}")
            chief = c.tasks["chief/0" if CONFIGS[name]["chief"] else "worker/0"]
            first = float(re.search(r"first step ([\d.]+)s after launch", chief.text)[1])
            result = c.result()
    return {
        "examples_per_sec": result["examples_per_sec"],
        "accuracy": result["accuracy"],
        "loss": result["loss"],
        "global_step": result["global_step"],
        "first_step_secs": first,
        "wall_secs": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_strategies.md"))
    args = parser.parse_args()
    names = list(CONFIGS)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            run = one_run(name, args.steps)
            runs[name].append(run)
            print(
                f"round {r + 1} {name}: {run['examples_per_sec']:.0f} ex/s, "
                f"accuracy {run['accuracy']:.4f}, first step {run['first_step_secs']:.1f}s, "
                f"wall {run['wall_secs']:.1f}s",
                flush=True,
            )
    Path(args.out).write_text(report(runs, args))
    print(f"wrote {args.out}")


def _med(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    lines = [
        "# TF2 strategies vs their TF1 counterparts",
        "",
        f"`bench/bench_strategies.py --repeats {args.repeats} --steps {args.steps}` on "
        f"{platform.machine()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}: MLP 64-128-10 on digits, batch 64, each algorithm's "
        "shipped `conf/algo` defaults, no evaluator, all tasks on one host (loopback). The "
        f"{len(runs)} configurations ran in turn, rotating the order each round; the figures are medians of "
        f"{args.repeats} runs. The machine has 2 cores shared with other test runs: compare "
        "inside this table only.",
        "",
        "| algo | tasks | global steps | examples/s | ratio | accuracy | first step (s) | wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    seen = set()
    for a, b in PAIRS:
        for name in (a, b):
            if name in seen:
                continue
            seen.add(name)
            t = CONFIGS[name]
            tasks = f"{t['n_ps']} ps + {t['n_workers']} workers" + (
                " + chief" if t["chief"] else ""
            )
            ratio = _med(runs[name], "examples_per_sec") / _med(runs[b], "examples_per_sec")
            lines.append(
                f"| `{name}` | {tasks} | {int(_med(runs[name], 'global_step'))} | "
                f"{_med(runs[name], 'examples_per_sec'):,.0f} | {ratio:.2f}x | "
                f"{_med(runs[name], 'accuracy'):.4f} | {_med(runs[name], 'first_step_secs'):.1f} | "
                f"{_med(runs[name], 'wall_secs'):.1f} |"
            )
    lines += ["", "Every run, round by round (examples/s, accuracy):", ""]
    for name, rs in runs.items():
        each = "; ".join(f"{r['examples_per_sec']:,.0f} ({r['accuracy']:.4f})" for r in rs)
        lines.append(f"- `{name}`: {each}")
    lines += [
        "",
        "Ratios divide by the pair's TF1 algorithm (`sync` for `allreduce`, `hogwild` for "
        "`pss`). `pss K=1` schedules one minibatch per function (`algo.steps_per_closure=1`): "
        "the coordinator's cost per dispatch. `allreduce` and `sync` train 2 minibatches per global step, `pss` and "
        "`hogwild` one; accuracy is the chief's final weights on the held-out 20%.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
