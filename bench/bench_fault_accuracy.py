"""Does a parameter server killed mid-training cost accuracy? Final held-out scores with and without it.

    .venv/bin/python bench/bench_fault_accuracy.py [--runs 5] [--steps 3000] [--out FILE]

The default experiment (cluster=local: 1 ps + 2 workers, the MLP on digits, HOGWILD!, in-memory
snapshots every second, checkpoints every ``--checkpoint-steps``) trained by ``tfplan apply`` to
``--steps``, ``--runs`` times a side, the sides alternating and paired by ``trainer.seed`` (run i
of both sides has seed i): **fault**: the ps's program SIGKILLed once the chief has printed the
global step ``--steps`` / 2; tfplan forks it again and the chief restores it from its snapshot
(or the checkpoint: ``--snapshot-secs 0``); **none**: the same run without the fault. Reported per
run: the held-out accuracy and loss of ``result.json`` (the chief's final scores of the last
checkpoint), the global step, and for the fault side the step the ps came back from, its source
and the steps lost (``ps_recoveries.jsonl``); per side: median and range. Asynchronous training
differs from run to run even with one seed (the order the workers' updates land in): the spread
of the side without faults is the yardstick. Nothing but loopback is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import (  # noqa: E402
    base_overrides,
    free_port_base,
    kill_groups,
    paced,
    recorded_groups,
)
from chaos_helpers import ApplyRun, kill_task  # noqa: E402

# the chief's line for its first snapshot (recipes/ps_snapshots.py)
FIRST_SNAPSHOT = r"^worker/0\s+\| snapshots: every .* the first at step ([\d,]+)"


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass(frozen=True)
class Run:
    side: str
    seed: int
    accuracy: float
    eval_loss: float
    global_step: int
    killed_at: int | None  # the global step the chief had printed when the ps was killed
    recoveries: tuple[dict[str, Any], ...]
    wall: float


def one_run(side: str, seed: int, args: argparse.Namespace) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-fault-accuracy-") as tmp:
        ws = Path(tmp)
        began = time.monotonic()
        run = ApplyRun(
            ws,
            [
                *base_overrides(ws, free_port_base()),
                f"trainer.max_steps={args.steps}",
                f"trainer.seed={seed}",
                "trainer.log_steps=50",
                f"trainer.checkpoint_steps={args.checkpoint_steps}",
                f"lifecycle.snapshot_secs={args.snapshot_secs}",
                "lifecycle.restart.backoff_secs=0.2",
                *paced(args.pace),
            ],
        )
        try:
            killed_at = None
            if side == "fault":
                kill_at = args.steps // 2
                if args.snapshot_secs > 0:  # a snapshot to come back from, however fast it trains
                    first = run.wait_for(FIRST_SNAPSHOT, 300)
                    kill_at = max(
                        kill_at, _number(re.search(FIRST_SNAPSHOT, run.lines[first][1])[1]) + 1
                    )
                run.wait_step(kill_at, 300, task="worker/0")
                killed_at = max(s for name, s in run.steps() if name == "worker/0")
                kill_task(ws, "ps/0")
            code = run.finish(timeout=600)
            if code != 0:
                raise SystemExit(f"{side} run {seed} failed ({code}):\n{run.text()[-3000:]}")
            result = json.loads((ws / "out" / "result.json").read_text())
            path = ws / "out" / "ps_recoveries.jsonl"
            recoveries = tuple(
                json.loads(line)
                for line in (path.read_text().splitlines() if path.exists() else [])
            )
            if side == "fault" and not recoveries and args.snapshot_secs > 0:
                raise SystemExit(
                    f"fault run {seed}: no ps recovery recorded:\n{run.text()[-3000:]}"
                )
            return Run(
                side,
                seed,
                float(result["accuracy"]),
                float(result["eval_loss"]),
                int(result["global_step"]),
                killed_at,
                recoveries,
                time.monotonic() - began,
            )
        finally:
            if run.proc.poll() is None:
                run.proc.kill()
            kill_groups(recorded_groups(ws))


def _range(values: list[float], digits: int = 4) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def report(runs: list[Run], args: argparse.Namespace, load: tuple[float, float]) -> str:
    sides = {s: [r for r in runs if r.side == s] for s in ("none", "fault")}
    acc = {s: [r.accuracy for r in rs] for s, rs in sides.items()}
    loss = {s: [r.eval_loss for r in rs] for s, rs in sides.items()}
    lost = [
        int(rec["lost_steps"])
        for r in sides["fault"]
        for rec in r.recoveries
        if rec.get("lost_steps") is not None
    ]
    sources = sorted({str(rec["source"]) for r in sides["fault"] for rec in r.recoveries})
    within = min(acc["none"]) <= statistics.median(acc["fault"]) <= max(acc["none"])
    lines = [
        "# Benchmark: held-out accuracy after a parameter server killed mid-training",
        "",
        f"`.venv/bin/python bench/bench_fault_accuracy.py --runs {args.runs} --steps {args.steps} "
        f"--checkpoint-steps {args.checkpoint_steps} --snapshot-secs {args.snapshot_secs:g}` on "
        f"{platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. The default "
        f"experiment (cluster=local: 1 ps + 2 workers, the MLP on digits, HOGWILD!), "
        f"{args.steps} steps, checkpoints every {args.checkpoint_steps}, in-memory snapshots "
        f"every {args.snapshot_secs:g} s; {args.runs} runs a side, alternating, run i of both "
        f"sides with `trainer.seed=i`. Fault: SIGKILL of the ps's program once the chief printed "
        f"step {args.steps // 2:,} (or the step after the first snapshot, if later). Load average {load[0]:.1f} at the start, {load[1]:.1f} at "
        "the end.",
        "",
        "| side | held-out accuracy, median (range) | held-out loss, median (range) |",
        "|---|---|---|",
        f"| no fault | {_range(acc['none'])} | {_range(loss['none'])} |",
        f"| ps/0 killed | {_range(acc['fault'])} | {_range(loss['fault'])} |",
        "",
        f"The fault side's median accuracy is {'within' if within else 'outside'} the range of "
        f"the runs without a fault. The killed ps came back from: {', '.join(sources)}; steps "
        f"lost per recovery: {', '.join(str(n) for n in lost)} (median "
        f"{statistics.median(lost) if lost else 0:g}).",
        "",
        "| run | seed | accuracy | loss | global step | killed at step | came back from | steps lost | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rec = r.recoveries[0] if r.recoveries else {}
        back = f"{rec['source']} of step {rec['step']:,}" if rec else ""
        lines.append(
            f"| {'ps/0 killed' if r.side == 'fault' else 'no fault'} | {r.seed} | "
            f"{r.accuracy:.4f} | {r.eval_loss:.4f} | {r.global_step:,} | "
            f"{'' if r.killed_at is None else f'{r.killed_at:,}'} | {back} | "
            f"{'' if not rec else rec.get('lost_steps')} | {r.wall:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per side")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--checkpoint-steps", type=int, default=1000)
    parser.add_argument("--snapshot-secs", type=float, default=1.0)
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="seconds each replica sleeps after a step (the smoke test's: a short training that "
        "a fast machine cannot finish before the kill)",
    )
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_fault_accuracy.md"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    runs = []
    for seed in range(args.runs):
        for side in ("none", "fault") if seed % 2 == 0 else ("fault", "none"):
            runs.append(one_run(side, seed, args))
            r = runs[-1]
            print(
                f"{side} seed {seed}: accuracy {r.accuracy:.4f}, step {r.global_step}", flush=True
            )
    text = report(runs, args, (load, os.getloadavg()[0]))
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
