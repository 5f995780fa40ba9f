"""A job that changes its number of parameter servers: trained on 2 ps, resumed on 3, then on 1,
against the same job on 2 ps throughout.

    .venv/bin/python bench/bench_reshard.py [--repeats 3] [--steps 300] [--vocab-scale 0.01]
        [--jobs reshard,same] [--checks-only] [--out docs/bench_reshard.md]

examples/ctr (26 tables at ``--vocab-scale`` x the real vocabularies, a DCN-v2; its own
make_data.py), HOGWILD! on the embedded local cluster (2 workers), every variable over 500 KB
split into one part per ps (``model.partition_bytes``): the checkpoint holds each as one tensor in
slices, which a Saver restores into any other number of parts. Each repeat runs, in one output
folder (one experiment):

1. 2 ps, ``--steps`` global steps;
2. 3 ps, one step at ``algo.lr=1e-30`` (the weights stay as restored): the restored step and the
   held-out loss against step 1's (the re-shard itself: the same step, the same score);
3. 3 ps, ``--steps`` more;
4. 1 ps, one step at ``algo.lr=1e-30``: the same check;
5. 1 ps, ``--steps`` more;

and, interleaved, a job on 2 ps throughout for as many steps (resumed at the same steps, so that
only the number of ps differs). Reported: each resume's restored step against the checkpoint's,
the held-out loss before and after each re-shard, and the final held-out loss and accuracy of
both jobs (medians and ranges over the repeats): the re-sharded job's should lie within the
unchanged job's run-to-run spread.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
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
FROZEN = "algo.lr=1e-30"  # a step that leaves the weights as restored
RESTORED = re.compile(r"restoring model\.ckpt-(\d+)")


def overrides(scale: float, steps: int, ps: int, *extra: str) -> list[str]:
    return [
        f"cluster.ps={ps}",
        "algo=hogwild",
        "model._target_=ctr.models.build",
        f"model.vocab_scale={scale}",
        "model.partition_bytes=500000",
        *click_run(BATCH, steps),
        *extra,
    ]


def restored_step(project: Path, run: str) -> int | None:
    """The checkpoint step the chief (worker 0) restored in the run's latest leg."""
    log = project / "runs" / run / "work" / "worker-0" / "task.log"
    found = RESTORED.findall(log.read_text()) if log.exists() else []
    return int(found[-1]) if found else None


def job(project: Path, run: str, legs: list[tuple[int, int, bool]], scale: float) -> list[dict]:
    """The legs of one job (each ``(ps, steps to add, frozen)``) in one output folder; per leg
    its ps, the step restored, the final step and the held-out scores."""
    done: list[dict[str, Any]] = []
    step = 0
    for ps, more, frozen in legs:
        target = step + more
        result = apply_example(
            project,
            REPO,
            run,
            overrides(scale, target, ps, *([FROZEN] if frozen else [])),
        )
        leg = {
            "ps": ps,
            "frozen": frozen,
            "restored": restored_step(project, run) if step else None,
            "from": step,
            "step": int(result["global_step"]),
            "eval_loss": float(result["eval_loss"]),
            "accuracy": float(result["accuracy"]),
        }
        done.append(leg)
        print(f"  {run}: {leg}", flush=True)
        step = leg["step"]
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="global steps per training leg")
    parser.add_argument("--vocab-scale", type=float, default=0.01)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_reshard.md"))
    parser.add_argument(
        "--jobs", default="reshard,same", help="reshard (2 -> 3 -> 1 ps), same (2 ps throughout)"
    )
    parser.add_argument(
        "--checks-only",
        action="store_true",
        help="each job's first leg and its two frozen steps only (the re-shards' checks)",
    )
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    n = args.steps
    resharded = [(2, n, False), (3, 1, True), (3, n, False), (1, 1, True), (1, n, False)]
    unchanged = [(2, n, False), (2, 1, True), (2, n, False), (2, 1, True), (2, n, False)]
    if args.checks_only:
        resharded, unchanged = (
            [leg for leg in legs if leg[2] or leg is legs[0]] for legs in (resharded, unchanged)
        )
    started = time.monotonic()
    chosen = args.jobs.split(",")
    kinds = {"reshard": ("2 -> 3 -> 1 ps", resharded), "same": ("2 ps throughout", unchanged)}
    if not chosen or any(k not in kinds for k in chosen):
        parser.error(f"--jobs {args.jobs}: name reshard, same or both")
    jobs: dict[str, list[list[dict[str, Any]]]] = {kinds[k][0]: [] for k in chosen}
    with tempfile.TemporaryDirectory(prefix="bench-reshard-") as tmp:
        project = Path(tmp) / "ctr"
        shutil.copytree(REPO / "examples" / "ctr", project)
        make_ctr_data(project, EXAMPLES, args.vocab_scale)
        for repeat in range(args.repeats):
            for kind in chosen:
                name, legs = kinds[kind]
                run = f"{kind}-{repeat}"
                print(f"{run} ...", flush=True)
                jobs[name].append(job(project, run, legs, args.vocab_scale))
    report = write_report(args, jobs, time.monotonic() - started)
    Path(args.out).write_text(report)
    print(report)


def write_report(args: Any, jobs: dict[str, list[list[dict[str, Any]]]], elapsed: float) -> str:
    boundary_rows = []
    for name, runs in jobs.items():
        for i, legs in enumerate(runs):
            for before, after in zip(legs, legs[1:], strict=False):
                if not after["frozen"]:
                    continue
                restored = after["restored"]
                change = abs(after["eval_loss"] - before["eval_loss"])
                boundary_rows.append(
                    f"| {name} | {i + 1} | {before['ps']} -> {after['ps']} | {before['step']:,} "
                    f"| {'none' if restored is None else f'{restored:,}'} | "
                    f"{before['eval_loss']:.6f} | {after['eval_loss']:.6f} | {change:.1e} |"
                )
    final_rows = []
    for name, runs in jobs.items():
        losses = [legs[-1]["eval_loss"] for legs in runs]
        accs = [legs[-1]["accuracy"] for legs in runs]
        steps = [legs[-1]["step"] for legs in runs]
        final_rows.append(
            f"| {name} | {statistics.median(steps):,.0f} | {statistics.median(losses):.4f} "
            f"({min(losses):.4f} .. {max(losses):.4f}) | {statistics.median(accs):.4f} "
            f"({min(accs):.4f} .. {max(accs):.4f}) |"
        )
    return "\n".join(
        [
            "# A job resumed on another number of parameter servers (bench/bench_reshard.py)",
            "",
            f"`.venv/bin/python bench/bench_reshard.py --repeats {args.repeats} --steps "
            f"{args.steps} --vocab-scale {args.vocab_scale:g} --jobs {args.jobs}"
            + (" --checks-only" if args.checks_only else "")
            + "` on "
            f"{platform.node() and 'this machine'} ({os.cpu_count()} cores), "
            f"{elapsed / 60:.1f} min; the two jobs interleaved.",
            "",
            f"examples/ctr: 26 tables at {args.vocab_scale:g} x the real vocabularies (the "
            f"largest {int(10_000_000 * args.vocab_scale):,} rows), a DCN-v2, "
            f"{EXAMPLES:,} click records; HOGWILD!, 2 workers, batch {BATCH}, every variable "
            "over 500 KB split into one part per ps. Legs of each job: "
            f"{args.steps} steps, 1 frozen step (`{FROZEN}`), {args.steps} steps, 1 frozen "
            f"step, {args.steps} steps; the re-sharded job on 2, 3, 3, 1 and 1 ps, the other "
            "on 2 throughout"
            + (
                " (`--checks-only`: the legs after each frozen step left out)."
                if args.checks_only
                else "."
            ),
            "",
            "## Each re-shard: the step and the held-out loss it restores",
            "",
            "The step of the checkpoint the last leg ended on, the step the chief restored, and "
            "the held-out loss of the last leg's final checkpoint against that of the frozen "
            "step after the resume (its weights as restored).",
            "",
            "| job | run | ps | checkpoint step | restored step | held-out loss before | "
            "after | difference |",
            "|---|---|---|---|---|---|---|---|",
            *boundary_rows,
            "",
            "## The final held-out scores",
            "",
            "Medians over the runs (range in brackets).",
            "",
            "| job | final step | held-out loss | accuracy |",
            "|---|---|---|---|",
            *final_rows,
            "",
        ]
    )


if __name__ == "__main__":
    main()
