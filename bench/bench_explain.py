"""Time from a failing task's exit to its explanation on apply's screen.

    .venv/bin/python bench/bench_explain.py [--repeats 5] [--out docs/bench_explain.md]

Each round applies a one-task cluster whose program (argparse, no TensorFlow) exits 2 at once
for a missing flag, reads apply's output as it comes, and takes the time the line `worker/0
failed: ...` arrives minus the time the task's wrapper wrote its exit code (the file's mtime):
what a user waits between the failure and being told why. Goal (issue 22): under 1 s. Writes
a Markdown report with the median and every round.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import free_port_base  # noqa: E402

PROGRAM = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--job_name", required=True)
parser.parse_args()
"""


def one_round(tmp: Path) -> float:
    script = tmp / "flags.py"
    script.write_text(PROGRAM)
    args = [
        "experiment.id=explain",
        f"cluster.port_base={free_port_base(4)}",
        "cluster.port_range=4",
        f"cluster.workdir={tmp}/work",
        f"cluster.output_dir={tmp}/out",
        "cluster.ps=0",
        "cluster.workers=1",
        "recipe=command",
        f"recipe.command='{sys.executable} {script}'",
    ]
    env = {**os.environ, "TFPLAN_CONF": str(REPO / "conf")}
    env.pop("TFPLAN_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfplan", "apply", "--auto-approve", *args],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    seen = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if "worker/0 failed: " in line and seen is None:
            seen = time.time()
    proc.wait(timeout=120)
    if seen is None:
        raise RuntimeError("no explanation line in apply's output")
    exited = (tmp / "work" / "worker-0" / "exit_code").stat().st_mtime
    return seen - exited


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench_explain.md")
    args = ap.parse_args()
    load = os.getloadavg()
    rounds = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(one_round(Path(tmp)))
        print(f"round {i + 1}: {rounds[-1]:.3f} s", flush=True)
    median = statistics.median(rounds)
    verdict = "goal met" if median < 1.0 else "goal MISSED"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# From a task's failure to its explanation (bench/bench_explain.py)\n\n"
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, load average {load[0]:.2f}; "
        f"`.venv/bin/python bench/bench_explain.py --repeats {args.repeats}`.\n\n"
        "A one-task cluster whose program exits at once for a missing flag; the time from the "
        "wrapper writing the task's exit code to the line `worker/0 failed: the program needs "
        "--job_name ...` arriving on apply's output (the host's watcher reports the exit as an "
        "event, the supervisor reads the log's end on a helper thread and says the line).\n\n"
        "| measure | median | rounds | goal |\n|---|---|---|---|\n"
        f"| exit -> explanation on screen | {median:.3f} s | "
        f"{', '.join(f'{r:.3f}' for r in rounds)} | < 1 s: {verdict} |\n"
    )
    print(f"median {median:.3f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
