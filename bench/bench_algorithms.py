"""Every algorithm with its documented defaults, on the same real data, through ``tfplan apply``.

Usage: ``.venv/bin/python bench/bench_algorithms.py [--minibatches 800] [--rounds 2]
[--target 0.9] [--only agn,allreduce] [--out docs/algorithms.md] [--json runs.json]``
(the defaults: 28 applies, about 25 minutes on 2 shared cores; ``--reuse runs.json`` only
rewrites the report from the raw runs of an earlier ``--json``).

One run trains all fourteen built-in algorithms side by side, each as a real cluster on loopback
with its ``conf/algo/<name>.yaml`` untouched, the default model (MLP 64-128-10) and
scikit-learn's digits (1,437 training and 360 held-out 8x8 images), with an evaluator:

- the twelve TF1 algorithms on 1 ps + 2 workers (``cluster=local``);
- ``allreduce`` (TF2 MultiWorkerMirroredStrategy) on 2 workers, no ps (``cluster=local_allreduce``);
- ``pss`` (TF2 ParameterServerStrategy) on 1 ps + 2 workers + the chief that coordinates them
  (``cluster=local_chief``).

Every run trains on the same number of minibatches of 64 (``--minibatches``, all workers
together): ``trainer.max_steps`` is that number divided by the minibatches per global step (R
for sync, sync_lr and allreduce, R*T for sagn, 1 for the others). The held-out accuracy over time
comes from the evaluator's ``eval/metrics.jsonl`` (each checkpoint, time measured from the
chief's first step), and from it the time to ``--target`` accuracy; the final figures from the
chief's ``result.json``. With ``--rounds N`` every algorithm runs N times, the order rotating
each round, and the report gives medians and the range. Writes the Markdown table and the plot
(``docs/algorithms.png``, needs matplotlib).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import free_port_base  # noqa: E402  (one free-port search for tests and benches)

ORDER = [
    "hogwild",
    "downpour",
    "downpour_easy",
    "agn",
    "adag",
    "dynsgd",
    "easgd",
    "eamsgd",
    "sync",
    "sync_lr",
    "sagn",
    "multi_gpu",
    "allreduce",
    "pss",
]
REPLICAS = 2
BATCH = 64
SYNC_ROUND = {"sync": 1, "sync_lr": 1, "sagn": None, "allreduce": 1}  # per replica per step
# Where each algorithm runs (the shipped cluster configs) and what that cluster is.
CLUSTER = {"allreduce": "local_allreduce", "pss": "local_chief"}
TASKS = {
    "local": "1 ps + 2 workers",
    "local_allreduce": "2 workers, no ps",
    "local_chief": "1 ps + 2 workers + chief",
}
TF2 = ("allreduce", "pss")


def algo_defaults(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CONF / "algo" / f"{name}.yaml").read_text())
    return {k: v for k, v in data.items() if k != "defaults"}


def minibatches_per_step(name: str) -> int:
    if name not in SYNC_ROUND:
        return 1
    per_replica = SYNC_ROUND[name] or int(algo_defaults(name)["window"])
    return REPLICAS * per_replica


def cluster_of(name: str) -> str:
    return CLUSTER.get(name, "local")


def run_one(name: str, minibatches: int, root: Path, round_: int = 0) -> dict[str, Any]:
    """``tfplan apply`` one algorithm to its last step; returns its figures and curve."""
    ws = root / f"{name}-{round_}"
    ws.mkdir(parents=True)
    steps = math.ceil(minibatches / minibatches_per_step(name))
    overrides = [
        f"cluster={cluster_of(name)}",
        f"experiment.id=bench-{name}",
        f"cluster.port_base={free_port_base()}",
        "cluster.port_range=20",
        f"cluster.workdir={ws}/work",
        f"cluster.output_dir={ws}/out",
        "cluster.evaluator=true",
        f"algo={name}",
        f"trainer.max_steps={steps}",
        f"trainer.checkpoint_steps={max(1, steps // 15)}",
        f"trainer.log_steps={max(1, steps // 5)}",
        "trainer.eval_secs=0.3",
        "lifecycle.ps_grace_secs=2",
        "lifecycle.stop_grace_secs=2",
    ]
    env = {**os.environ, "TFPLAN_CONF": str(CONF)}
    env.pop("TFPLAN_DEBUG", None)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tfplan", "apply", "--auto-approve", *overrides],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    apply_secs = time.monotonic() - started
    result_path = ws / "out" / "result.json"
    if proc.returncode != 0 or not result_path.exists():
        tail = (proc.stdout + proc.stderr)[-2500:]
        return {
            "name": name,
            "round": round_,
            "cluster": cluster_of(name),
            "budget": minibatches,
            "error": f"exit {proc.returncode}",
            "log": tail,
            "apply_secs": apply_secs,
        }
    result = json.loads(result_path.read_text())
    reached = step_times(ws / "out", result)
    curve = []
    metrics = ws / "out" / "eval" / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            point = json.loads(line)
            step = int(point["global_step"])
            curve.append((time_at(reached, step), point["accuracy"], step))
    return {
        "name": name,
        "round": round_,
        "cluster": cluster_of(name),
        "load": os.getloadavg()[0],  # how busy the shared machine was as the run ended
        "steps": steps,
        "budget": minibatches,
        "minibatches": steps * minibatches_per_step(name),
        "result": result,
        "curve": curve,  # (when the chief reached the step, its checkpoint's accuracy, step)
        "reached": reached,  # (step, seconds since the chief's first step), from its summaries
        "apply_secs": apply_secs,
        "defaults": algo_defaults(name),
    }


def step_times(out: Path, result: dict[str, Any]) -> list[tuple[int, float]]:
    """(global step, seconds since the chief's first step) of every summary the chief wrote
    (its TensorBoard events in ``out``: the first at its first step, then every
    summary_steps), ending with the last step at result.json's wall time.

    Why not the evaluator's clock: the evaluator scores a checkpoint when it gets to it; one
    that started later than the chief (a TF2 chief starts faster than a TF1 one) scores the
    first checkpoints seconds after they were written."""
    import tensorflow as tf

    points = []
    for path in sorted(out.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            if event.HasField("summary"):
                points.append((int(event.step), float(event.wall_time)))
    if not points:
        return [(int(result["global_step"]), float(result["wall_time_secs"]))]
    points.sort(key=lambda p: p[1])
    first_step, t0 = points[0]
    out_points = [(first_step, 0.0)]
    for step, when in points[1:]:
        if step > out_points[-1][0]:
            out_points.append((step, when - t0))
    last = int(result["global_step"])
    if last > out_points[-1][0]:
        out_points.append((last, max(float(result["wall_time_secs"]), out_points[-1][1])))
    return out_points


def time_at(reached: list[tuple[int, float]], step: int) -> float:
    """When the chief reached ``step`` (linear between its summaries)."""
    if step <= reached[0][0]:
        return 0.0
    for (s0, t0), (s1, t1) in itertools.pairwise(reached):
        if step <= s1:
            return t0 + (t1 - t0) * (step - s0) / max(s1 - s0, 1)
    return reached[-1][1]


def time_to(run: dict[str, Any], target: float) -> float | None:
    """Seconds from the chief's first step until it reached the step of the first checkpoint
    the evaluator scored at ``target`` accuracy or more (the final result counts as a last
    point), or None when never reached."""
    if "error" in run:
        return None
    for t, acc, _ in sorted(run["curve"]):
        if acc >= target:
            return float(t)
    r = run["result"]
    return float(r["wall_time_secs"]) if r["accuracy"] >= target else None


def by_name(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault(run["name"], []).append(run)
    return {n: grouped[n] for n in ORDER if n in grouped}


def median_of(values: list[float | None]) -> float | None:
    """The median, a run that never reached the target counting as the slowest; None when that
    median is such a run."""
    padded = [math.inf if v is None else v for v in values]
    value = statistics.median(padded) if padded else math.inf
    return None if math.isinf(value) else float(value)


def summarise(name: str, runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {"name": name, "runs": len(runs), "failed": len(runs) - len(ok)}
    if not ok:
        out["error"] = runs[0].get("error", "failed")
        return out
    rates = [float(r["result"]["examples_per_sec"]) for r in ok]
    out.update(
        cluster=ok[0]["cluster"],
        defaults=ok[0]["defaults"],
        accuracy=statistics.median(float(r["result"]["accuracy"]) for r in ok),
        accuracy_range=(
            min(float(r["result"]["accuracy"]) for r in ok),
            max(float(r["result"]["accuracy"]) for r in ok),
        ),
        rate=statistics.median(rates),
        rate_range=(min(rates), max(rates)),
        wall=statistics.median(float(r["result"]["wall_time_secs"]) for r in ok),
        steps=int(statistics.median(int(r["result"]["global_step"]) for r in ok)),
        minibatches=ok[0]["minibatches"],
        to_target=median_of([time_to(r, target) for r in runs]),
        to_target_all=[time_to(r, target) for r in runs],
        # the run whose examples/s is the median: its curve is the one plotted
        typical=sorted(ok, key=lambda r: float(r["result"]["examples_per_sec"]))[
            (len(ok) - 1) // 2
        ],
    )
    return out


def plot(stats: list[dict[str, Any]], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 6))
    styles = ["-", "--", "-.", ":"]
    for i, st in enumerate(s for s in stats if "error" not in s):
        run = st["typical"]
        pts = sorted(run["curve"]) + [
            (
                run["result"]["wall_time_secs"],
                run["result"]["accuracy"],
                run["result"]["global_step"],
            )
        ]
        tf2 = st["name"] in TF2
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            "-" if tf2 else styles[i % 4],
            marker="o" if tf2 else ".",
            label=st["name"] + (" (TF2)" if tf2 else ""),
            linewidth=2.4 if tf2 else 1.2,
        )
    ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("when the chief reached the checkpoint's step, since its first step (s)")
    ax.set_ylabel("held-out accuracy (digits, 360 images)")
    ax.set_title(
        "Same data, model and minibatches; TF1 algorithms on 1 ps + 2 workers,\n"
        "allreduce on 2 workers, pss on 1 ps + 2 workers + chief (the run of median examples/s)"
    )
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(ncol=3, fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def settings(defaults: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={v}"
        for k, v in defaults.items()
        if k
        not in (
            "run_timeout_secs",
            "stop_grace_secs",
            "backup_workers",
            "replicas_to_aggregate",
            "collective_timeout_secs",
            "startup_timeout_secs",
        )
        and v not in (None, [])
    )


SYNC_PS = ("sync", "sync_lr", "sagn")
WINDOWED = ("downpour", "downpour_easy", "agn", "adag", "dynsgd", "easgd", "eamsgd")


def notes(stats: dict[str, dict[str, Any]], runs: list[dict[str, Any]]) -> list[str]:
    """How to read the table, with the figures of this run."""
    ok = {n: s for n, s in stats.items() if "error" not in s}
    if not ok:
        return []
    accs = {n: s["accuracy"] for n, s in ok.items()}
    low = min(accs, key=lambda n: accs[n])
    syncs = [s["rate"] for n, s in ok.items() if n in SYNC_PS]

    def rounds_of(name: str) -> list[float]:
        return [
            float(r["result"]["accuracy"]) for r in runs if r["name"] == name and "error" not in r
        ]

    async_names = [n for n in ok if n not in (*TF2, *SYNC_PS, "multi_gpu")]
    moves = [max(rounds_of(n)) - min(rounds_of(n)) for n in async_names if rounds_of(n)]
    per_round = ", ".join(
        f"`{n}` " + " / ".join(f"{a:.3f}" for a in rounds_of(n))
        for n in (*SYNC_PS, "allreduce")
        if rounds_of(n)
    )
    lines = [
        "## Reading the results",
        "",
        f"- **Every default reaches a sensible accuracy** on this budget ({min(accs.values()):.3f}"
        f"-{max(accs.values()):.3f}; a one-process MLP on digits reaches about 0.96-0.97). "
        + (
            f"An asynchronous algorithm's rounds differ by up to {max(moves):.3f} (its workers "
            "interleave differently every run), so smaller differences between them are noise. "
            if moves
            else ""
        )
        + (f"The synchronous ones, round by round: {per_round}." if per_round else ""),
    ]
    if "easgd" in accs:
        lines.append(
            f"- **`easgd` ({accs['easgd']:.3f}{', the lowest here' if low == 'easgd' else ''}) "
            "evaluates the center**, an elastic average that trails the workers' copies: it "
            "only moves at exchanges (every T=4 steps, by alpha=0.45 of each gap), and the "
            "workers are never pulled onto it. EAMSGD's momentum moves the copies faster and its "
            "center follows. Larger T (the sources use 32-100) trains the copies more and the "
            "center less on a budget this small."
        )
    lines += [
        "- **Defaults that differ from the sources, and why.** The sources ran 10-40 workers; the "
        "default cluster has 2. AGN/ADAG commit a window's delta divided by T, so the center "
        "moves about n/T as fast as one copy: dist-keras' T=12 (with lr 0.05) leaves 2 workers "
        "at about 0.89 on a budget of 1,200 minibatches, hence T=4 and lr 0.2. SAGN uses T=2 and "
        "lr 0.2 for the same reason (a round applies the mean over R*T minibatches; the guide's "
        "T=5, Adam 1e-4 is far slower). DynSGD's commit is divided by about tau+1 = 2 with 2 "
        "workers, hence lr 0.1. EASGD/EAMSGD use T=4 (sources: 32-100) and alpha = 0.9/n (the "
        "paper's beta = 0.9); EAMSGD's lr 0.01 with momentum 0.9 is [Z]'s rate.",
    ]
    windowed = [s["rate"] for n, s in ok.items() if n in WINDOWED]
    if syncs and windowed and "hogwild" in ok:
        lines.append(
            "- **Throughput.** The synchronous parameter-server algorithms pay a barrier per "
            f"round: {statistics.median(syncs):,.0f} examples/s (the median of their medians). "
            f"`hogwild` makes a ps round trip per minibatch: {ok['hogwild']['rate']:,.0f}. The "
            "windowed ones (DOWNPOUR, AGN, ADAG, DynSGD, EASGD, EAMSGD) train T minibatches on "
            "the worker's own copy between exchanges: "
            f"{statistics.median(windowed):,.0f}. `multi_gpu` here runs two logical CPU towers "
            "on 2 cores: it shows correctness, not a speed-up."
        )
    lines.append(
        "- **Times.** Each curve point is a checkpoint (one every 1/15 of the run), placed at "
        "the time the chief reached its step (the chief's summaries, every 50 steps, give step "
        "and time; linear in between), not when the evaluator got to it: an evaluator that "
        "starts later than its chief scores the first checkpoints seconds after they were "
        "written. So a time to the target is late by at most one checkpoint interval, for every "
        "algorithm alike."
    )
    return lines


def _fmt(value: float | None, digits: int = 1) -> str:
    return "not reached" if value is None else f"{value:.{digits}f}"


def _secs(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f} s"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def what_this_says(stats: dict[str, dict[str, Any]], target: float) -> list[str]:
    """The comparison the table is for, with its figures: TF2's strategies against the async
    parameter-server algorithms, and all-reduce against synchronous parameter servers."""
    need = ("allreduce", "sync", "pss", "hogwild")
    if any(n not in stats or "error" in stats[n] for n in need):
        return []
    ar, sy, ps, hw = (stats[n] for n in need)
    asyncs = [
        s
        for n, s in stats.items()
        if n not in TF2 and n not in ("sync", "sync_lr", "sagn", "multi_gpu") and "error" not in s
    ]
    fastest = max(asyncs, key=lambda s: s["rate"])
    soonest = min(
        (s for s in asyncs if s["to_target"] is not None),
        key=lambda s: s["to_target"],
        default=None,
    )
    t = f"{target:.2f}"
    lines = [
        "## What this says",
        "",
        f"- **All-reduce over synchronous parameter servers.** `allreduce` trains the same "
        f"minibatches synchronously as `sync` does, without a ps: {ar['rate']:,.0f} vs "
        f"{sy['rate']:,.0f} examples/s ({_ratio(ar['rate'], sy['rate'])}), {t} accuracy after "
        f"{_secs(ar['to_target'])} vs {_secs(sy['to_target'])}, final accuracy "
        f"{ar['accuracy']:.3f} vs {sy['accuracy']:.3f}. Each step is one all-reduce between "
        "the workers instead of a push to the ps, a barrier there and a pull from it.",
        f"- **tfplan's async parameter-server algorithms against TF2's strategies.** The fastest "
        f"async one here, `{fastest['name']}`, ran {fastest['rate']:,.0f} examples/s: "
        f"{_ratio(fastest['rate'], ar['rate'])} `allreduce`'s and "
        f"{_ratio(fastest['rate'], ps['rate'])} `pss`'s; `hogwild` (the same update rule as "
        f"`pss`: asynchronous SGD on a ps) {hw['rate']:,.0f} vs `pss` {ps['rate']:,.0f} "
        f"({_ratio(hw['rate'], ps['rate'])}). To {t}: "
        + (
            f"`{soonest['name']}` {_secs(soonest['to_target'])} (the soonest async one), "
            if soonest is not None
            else ""
        )
        + f"`hogwild` {_secs(hw['to_target'])}, `allreduce` {_secs(ar['to_target'])}, "
        f"`pss` {_secs(ps['to_target'])}.",
    ]
    return lines


def report(
    runs: list[dict[str, Any]],
    minibatches: int,
    png: str,
    total: float,
    rounds: int,
    target: float,
    remark: str = "",
) -> str:
    grouped = by_name(runs)
    stats = {n: summarise(n, rs, target) for n, rs in grouped.items()}
    t = f"{target:.2f}"
    lines = [
        f"| algorithm | tasks | defaults | held-out accuracy | time to {t} (s) | examples/s | "
        "examples/s, min-max | global steps | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, st in stats.items():
        if "error" in st:
            lines.append(f"| `{name}` | | failed: {st['error']} | | | | | | |")
            continue
        low, high = st["rate_range"]
        failed = f" ({st['failed']} of {st['runs']} runs failed)" if st["failed"] else ""
        lines.append(
            f"| `{name}` | {TASKS[st['cluster']]} | {settings(st['defaults'])}{failed} | "
            f"{st['accuracy']:.3f} | {_fmt(st['to_target'])} | {st['rate']:,.0f} | "
            f"{low:,.0f}-{high:,.0f} | {st['steps']} | {st['wall']:.1f} |"
        )
    raw = []
    for name, rs in grouped.items():
        cells = []
        for r in sorted(rs, key=lambda r: r["round"]):
            if "error" in r:
                cells.append(f"failed ({r['error']})")
                continue
            reached = time_to(r, target)
            cells.append(
                f"{r['result']['examples_per_sec']:,.0f} ex/s, {r['result']['accuracy']:.3f}, "
                f"{_secs(reached)}"
            )
        raw.append(f"- `{name}`: " + "; ".join(cells))
    medians = (
        f"medians of {rounds} rounds, the order rotating each round" if rounds > 1 else "one round"
    )
    loads = [float(r["load"]) for r in runs if "load" in r]
    busy = (
        f" The machine's 1-minute load average as each apply ended: {min(loads):.1f}-"
        f"{max(loads):.1f} (median {statistics.median(loads):.1f}) on {os.cpu_count()} cores."
        if loads
        else ""
    )
    head = [
        "# The algorithms side by side",
        "",
        "Rules, config keys and defaults: [runtime.md](runtime.md). TF2's strategies:",
        "[runtime.md](runtime.md#tf2-strategies-allreduce-and-pss) and [bench_strategies.md](bench_strategies.md).",
        "",
        f"Measured by `bench/bench_algorithms.py --minibatches {minibatches} --rounds {rounds} "
        f"--target {target}` on {platform.node() or 'this machine'} ({os.cpu_count()} cores, "
        f"Python {platform.python_version()}), {time.strftime('%Y-%m-%d')}; the {len(runs)} "
        f"applies took {total / 60:.1f} min in all (start-up, training, evaluation, teardown).",
        "",
        "All fourteen in one run, on loopback, each through `tfplan apply` with an evaluator: "
        "the twelve TF1 algorithms on 1 ps + 2 workers (`cluster=local`), `allreduce` on 2 "
        "workers without a ps (`cluster=local_allreduce`), `pss` on 1 ps + 2 workers + the chief "
        "that coordinates them (`cluster=local_chief`). The same MLP 64-128-10 on digits, batch "
        f"{BATCH}, {minibatches} minibatches in all (= {minibatches * BATCH:,} examples, about "
        f"{minibatches * BATCH / 1437:.0f} epochs). Accuracy = the chief's final held-out "
        f"accuracy; time to {t} = from the chief's first step until it reached the step of the "
        f"first checkpoint the evaluator scored at {t} or more (eval/metrics.jsonl); examples/s "
        f"and wall = from the chief's first to its last step (start-up excluded). Figures are "
        f"{medians}.{busy}{' ' + remark if remark else ''}",
        "",
        *lines,
        "",
        f"![held-out accuracy against wall time]({png})",
        "",
        *what_this_says(stats, target),
        "",
        "How noisy: the machine has 2 cores shared with other engineers' test suites, and each "
        "cluster runs 3-5 TensorFlow processes on them. Every run, round by round (examples/s, "
        f"final accuracy, time to {t}):",
        "",
        *raw,
        "",
        *notes(stats, runs),
    ]
    return "\n".join(head) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minibatches", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each, order rotating")
    parser.add_argument("--target", type=float, default=0.9, help="accuracy for time-to")
    parser.add_argument("--only", default="", help="comma-separated algorithms (default: all)")
    parser.add_argument("--out", default=str(REPO / "docs" / "algorithms.md"))
    parser.add_argument("--png", default=str(REPO / "docs" / "algorithms.png"))
    parser.add_argument("--json", default="", help="also write the raw runs here")
    parser.add_argument(
        "--remark", default="", help="a sentence for the report (what else ran on the machine)"
    )
    parser.add_argument(
        "--reuse",
        default="",
        help="raw runs of an earlier bench (--json): only report them (no run)",
    )
    args = parser.parse_args()
    names = [n for n in ORDER if not args.only or n in args.only.split(",")]
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    if args.reuse:
        runs = json.loads(Path(args.reuse).read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="bench_algos_") as tmp:
            for round_ in range(args.rounds):
                shift = round_ * len(names) // max(args.rounds, 1)
                for name in names[shift:] + names[:shift]:
                    run = run_one(name, args.minibatches, Path(tmp), round_)
                    runs.append(run)
                    r = run.get("result", {})
                    print(
                        f"round {round_} {name:14s} acc={r.get('accuracy')} "
                        f"steps={r.get('global_step')} wall={r.get('wall_time_secs')} "
                        f"ex/s={r.get('examples_per_sec')} to{args.target}="
                        f"{time_to(run, args.target)} apply={run.get('apply_secs', 0):.0f}s "
                        f"{run.get('error', '')}",
                        flush=True,
                    )
                    if "error" in run:
                        print(run["log"], flush=True)
                    if args.json:  # after every run: a long bench that dies keeps what it has
                        Path(args.json).write_text(json.dumps(runs, indent=1))
    rounds = max(int(r.get("round", 0)) for r in runs) + 1
    minibatches = int(runs[0].get("budget", args.minibatches))
    total = sum(r.get("apply_secs", 0.0) for r in runs) or time.monotonic() - started
    stats = [summarise(n, rs, args.target) for n, rs in by_name(runs).items()]
    plot(stats, Path(args.png), args.target)
    text = report(runs, minibatches, Path(args.png).name, total, rounds, args.target, args.remark)
    Path(args.out).write_text(text)
    print(f"wrote {args.out} and {args.png} ({total / 60:.1f} min)")


if __name__ == "__main__":
    main()
