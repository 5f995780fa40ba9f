"""Benchmark recovery: per fault, the time until training progresses again and the steps lost.

    .venv/bin/python bench/bench_reliability.py [--repeats 2]

Each round runs `tfplan apply` on cluster=local (1 ps + 2 workers, MLP on digits, checkpoints
every 100 steps), waits for global step 300, injects one fault, and reads the apply log:
- fault -> progress: from the fault to the first training line after the victim's restart;
- restart -> progress: from the restart to that line (target for a ps: <= 5 s);
- steps lost: the highest global step before the fault minus the lowest one after the restart
  (target for the chief: 0).
Writes docs/reliability.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import base_overrides, free_port_base, kill_groups, recorded_groups  # noqa: E402
from chaos_helpers import ApplyRun, kill_task  # noqa: E402

FAULTS = {
    "SIGKILL ps/0": ("ps/0", signal.SIGKILL),
    "SIGKILL chief (worker/0)": ("worker/0", signal.SIGKILL),
    "SIGKILL worker/1": ("worker/1", signal.SIGKILL),
    "SIGSTOP worker/1 (hang)": ("worker/1", signal.SIGSTOP),
}
STEP = re.compile(r"^(\S+)\s+\| .*\bstep=(\d+)")


def one_round(victim: str, sig: int) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        args = [
            *base_overrides(ws, free_port_base()),
            "trainer.max_steps=1500",
            "trainer.log_steps=25",
            "trainer.checkpoint_steps=100",
            "lifecycle.restart.backoff_secs=0.2",
            "lifecycle.progress_timeout_secs=5",
        ]
        run = ApplyRun(ws, args)
        try:
            fault_line = run.wait_step(300, timeout=180, task="worker/0")
            before = max(step for _, step in run.steps(0, fault_line + 1))
            fault_at = time.monotonic()
            kill_task(ws, victim, sig)
            restart = run.wait_for(rf"{victim}: restarted on", timeout=60, after=fault_line)
            restart_at = run.lines[restart][0]
            progress = None
            for i in range(restart + 1, 10**9):
                i = run.wait_for(r"\| .*\bstep=\d+", timeout=120, after=i)
                match = STEP.match(run.lines[i][1])
                if match and (match.group(1) != victim or victim.startswith("worker")):
                    progress = i
                    break
            assert progress is not None
            after = [step for _, step in run.steps(restart + 1)]
            run.finish(timeout=300)
            lost = max(0, before - min(after)) if after else before
            return (run.lines[progress][0] - fault_at, run.lines[progress][0] - restart_at, lost)
        finally:
            if run.proc.poll() is None:
                run.proc.kill()
            kill_groups(recorded_groups(ws))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    repeats = parser.parse_args().repeats
    rows = []
    for label, (victim, sig) in FAULTS.items():
        rounds = [one_round(victim, sig) for _ in range(repeats)]
        print(label, rounds, flush=True)
        rows.append(
            (
                label,
                statistics.median(r[0] for r in rounds),
                statistics.median(r[1] for r in rounds),
                max(r[2] for r in rounds),
                rounds,
            )
        )
    lines = [
        "# Reliability: recovery time and steps lost per fault",
        "",
        f"`.venv/bin/python bench/bench_reliability.py --repeats {repeats}` on {platform.node()} "
        f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. cluster=local (1 ps + 2 workers),"
        " MLP on digits, checkpoints every 100 steps, fault injected at global step 300, "
        "restart backoff 0.2 s, progress timeout 5 s. Medians over the rounds; steps lost is the "
        "worst round.",
        "",
        "| fault | fault -> progress (s) | restart -> progress (s) | global steps lost |",
        "|---|---|---|---|",
        *[f"| {label} | {a:.1f} | {b:.1f} | {lost} |" for label, a, b, lost, _ in rows],
        "",
        "Targets: a restarted parameter server back in training within 5 s of its start; zero "
        "steps lost on a chief restart. 'restart -> progress' is dominated by the new process "
        "importing TensorFlow (about 2-4 s idle, much more while the other tasks train on the "
        "same 2 cores).",
        "",
        "Raw rounds (fault->progress s, restart->progress s, steps lost): "
        + "; ".join(f"{label}: {rounds}" for label, _, _, _, rounds in rows),
        "",
    ]
    (REPO / "docs" / "reliability.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
