"""What the in-memory snapshots cost a training job: none, each ps's on its own host, and each
also copied onto the next ps's host (``lifecycle.snapshot_copies``, the default with 2+ ps).

    .venv/bin/python bench/bench_snapshots.py [--repeats 3] [--steps 1500] [--vocab-scale 0.01]
        [--sides none,own,copies] [--algo hogwild] [--out docs/bench_snapshots.md]

examples/ctr (26 tables at ``--vocab-scale`` x the real vocabularies, a DCN-v2, every variable
over 500 KB split into one part per ps), ``--algo`` (HOGWILD!: the snapshots on a thread beside
training; ``sync``: each taken between two rounds, which wait for it; its figures go to
docs/bench_snapshots_sync.md) on the embedded local cluster: 2 ps, 2 workers, batch 64. The sides
run alternating, ``--repeats`` times each, each a fresh job of ``--steps`` global steps. Reported
per side: the job's training examples/s (result.json, its steady state) and its ratio to the side
without snapshots (medians), the snapshots taken, and how long the first and the others took
(the chief's three runs: the ``.meta`` files emptied, every ps's files and copies written, the
``.meta`` files written); and what the plan says they take in memory on the host. One machine,
so every ps's "host" is this one: the copy's bytes go over loopback.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _example_runs import apply_example, click_run, make_ctr_data  # noqa: E402

BATCH = 64
EXAMPLES = 40_000
SIDES = {
    "no snapshots": ["lifecycle.snapshot_secs=0"],
    "own host only": ["lifecycle.snapshot_copies=false"],
    "own host + copy on the next ps's (default)": [],
    "own host + copy, every snapshot full": ["lifecycle.snapshot_deltas=false"],
}
SYNCHRONOUS = ("sync", "sync_lr", "sagn")  # rounds: recipes/sync_rounds.py
SIDE_KEYS = dict(zip(("none", "own", "copies", "full"), SIDES, strict=True))


def overrides(scale: float, steps: int, shm: Path, algo: str, *extra: str) -> list[str]:
    return [
        "cluster.ps=2",
        f"algo={algo}",
        # at their defaults the CTR example went NaN: sync (0.1) in its first rounds once (with
        # no snapshots), downpour (0.05) at step 140, HOGWILD! (0.05) at step 83 once
        "algo.lr=0.02",
        "model._target_=ctr.models.build",
        f"model.vocab_scale={scale}",
        "model.partition_bytes=500000",
        f"lifecycle.snapshot_dir={shm}",
        *click_run(BATCH, steps),
        *extra,
    ]


def planned_memory(project: Path, args: list[str]) -> str:
    """The plan's ``Snapshots:`` line for these overrides."""
    env = {**os.environ, "TFPLAN_CONF": str(REPO / "conf"), "PYTHONPATH": str(REPO)}
    plan = subprocess.run(
        [sys.executable, "-m", "tfplan", "plan", "experiment.id=plan", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((ln for ln in plan.stdout.splitlines() if ln.startswith("Snapshots: ")), "")
    return line or "(none)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--vocab-scale", type=float, default=0.01)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_snapshots.md"))
    parser.add_argument(
        "--sides",
        default="none,own,copies",
        help="none, own, copies (the default: deltas of a table's changed rows), full (copies, "
        "every snapshot whole: lifecycle.snapshot_deltas=false)",
    )
    parser.add_argument(
        "--algo",
        default="hogwild",
        help="hogwild (the snapshots on a thread beside training), or a synchronous one (sync: "
        "each taken between two rounds, which wait for it)",
    )
    args = parser.parse_args()
    chosen = args.sides.split(",")
    if not chosen or any(k not in SIDE_KEYS for k in chosen):
        parser.error(f"--sides {args.sides}: name none, own, copies, full")
    sides = {SIDE_KEYS[k]: SIDES[SIDE_KEYS[k]] for k in chosen}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    memory: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-snapshots-") as tmp:
        project = Path(tmp) / "ctr"
        shutil.copytree(REPO / "examples" / "ctr", project)
        make_ctr_data(project, EXAMPLES, args.vocab_scale)
        shm = Path(tmp) / "shm"  # the snapshots' memory folder: this run's own, removed with it
        for side, extra in sides.items():
            memory[side] = planned_memory(
                project, overrides(args.vocab_scale, args.steps, shm, args.algo, *extra)
            )
        for repeat in range(args.repeats):
            for i, (side, extra) in enumerate(sides.items()):
                run = f"s{i}-{repeat}"
                result = apply_example(
                    project,
                    REPO,
                    run,
                    overrides(args.vocab_scale, args.steps, shm, args.algo, *extra),
                )
                runs[side].append(result)
                taken = result.get("snapshots") or {}
                print(
                    f"{side} #{repeat + 1}: {result['examples_per_sec']:.0f} examples/s, "
                    f"snapshots {taken}",
                    flush=True,
                )
    report = write_report(args, runs, memory, time.monotonic() - started)
    Path(args.out).write_text(report)
    print(report)


def write_report(
    args: Any, runs: dict[str, list[dict[str, Any]]], memory: dict[str, str], elapsed: float
) -> str:
    none = runs.get("no snapshots")
    base = statistics.median(r["examples_per_sec"] for r in none) if none else None
    rows = []
    for side, results in runs.items():
        speeds = [float(r["examples_per_sec"]) for r in results]
        med = statistics.median(speeds)
        taken = [r.get("snapshots") or {} for r in results]
        counts = [int(t.get("taken") or 0) for t in taken]
        deltas = [int(t.get("deltas") or 0) for t in taken]
        # the job's training seconds over its snapshots: about what a ps lost loses
        every = [
            args.steps * BATCH / float(r["examples_per_sec"]) / n
            for r, n in zip(results, counts, strict=True)
            if n
        ]
        gap = f"{statistics.median(every):.1f}" if every else "-"
        firsts = [float(t["first_secs"]) for t in taken if t.get("first_secs") is not None]
        medians = [float(t["median_secs"]) for t in taken if t.get("median_secs") is not None]
        maxima = [float(t["max_secs"]) for t in taken if t.get("max_secs") is not None]
        ratio = f"{med / base:.2f}" if base else "-"
        timings = (
            f"{statistics.median(firsts):.2f} | {statistics.median(medians):.3f} | "
            f"{max(maxima):.3f}"
            if medians and firsts
            else "- | - | -"
        )
        rows.append(
            f"| {side} | {med:,.0f} ({min(speeds):,.0f}-{max(speeds):,.0f}) | {ratio} | "
            f"{statistics.median(counts):.0f} | {gap} | {statistics.median(deltas):.0f} | "
            f"{timings} |"
        )
    return "\n".join(
        [
            "# What the in-memory snapshots cost (bench/bench_snapshots.py)",
            "",
            f"`.venv/bin/python bench/bench_snapshots.py --repeats {args.repeats} --steps "
            f"{args.steps} --vocab-scale {args.vocab_scale:g} --sides {args.sides} --algo "
            f"{args.algo}` on "
            f"{platform.node() and 'this machine'} ({os.cpu_count()} cores), "
            f"{elapsed / 60:.1f} min; the sides alternating.",
            "",
            f"examples/ctr: 26 tables at {args.vocab_scale:g} x the real vocabularies, a DCN-v2, "
            f"{EXAMPLES:,} click records; `algo={args.algo}`"
            + " (`algo.lr=0.02`)"
            + f", 2 ps, 2 workers, batch {BATCH}, every "
            f"variable over 500 KB split into one part per ps; {args.steps} global steps per "
            "job, snapshots every second (`lifecycle.snapshot_secs=1`). One machine: every ps's "
            "host is this one, so a copy crosses loopback, not a network.",
            "",
            "| snapshots | examples/s: median (range) | / none | taken per job | one every (s) | "
            "ps deltas per job | the first took (s) | the others: median (s) | longest (s) |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "What the plan says they take in memory (`tfplan plan`'s line):",
            "",
            *[f"- {side}: `{line}`" for side, line in memory.items()],
            "",
            (
                "A synchronous algorithm's snapshot is taken between two rounds: the next round "
                "waits for it (its duration is the pause), the workers compute meanwhile. "
                if args.algo in SYNCHRONOUS
                else "A snapshot runs on a thread of the chief's: no training step waits for it; "
                "what it costs training is the ps' CPU (and, across hosts, the network) spent "
                "writing it. "
            )
            + "The first of a job pays the setup of its runs' graphs in the distributed session; "
            "the others are what a snapshot costs. The interval widens until the steps the "
            "snapshots cost (the job's step rate while one runs against between them) are at "
            "most 5 % of training (recipes/ps_snapshots.py `OVERHEAD_BUDGET`): `taken per job` "
            "says how often that left them, `one every` the job's training seconds over its "
            "snapshots (about what a ps killed loses). `ps deltas per job`: snapshots of one ps "
            "that wrote only the rows of its tables changed since its last one (two ps: two a "
            "snapshot; recipes/snapshot_deltas.py, `lifecycle.snapshot_deltas`, the default); "
            "`every snapshot full` turns them off.",
            "",
        ]
    )


if __name__ == "__main__":
    main()
