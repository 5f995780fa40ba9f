"""Training lost when a parameter server's whole host is lost: with a copy of each ps's
in-memory snapshot on the next ps's host (``lifecycle.snapshot_copies``, the default), and
without one (the ps's snapshots die with its host: the re-planned cluster resumes from the
last checkpoint).

    .venv/bin/python bench/bench_host_loss.py [--repeats 3] [--sides copies,own] [--out FILE]

Three network-namespace hosts over SSH (tests/testbed.py; root), each with memory of its own
for the snapshots (the bed's private tmpfs, as /dev/shm is on real hosts): ps/0 alone on h1,
ps/1 alone on h2, the chief and a worker on h3; the default experiment (an MLP on the digits),
HOGWILD!, checkpoints every ``--checkpoint-steps`` (5,000: about half a minute here, a long
job's few minutes in miniature), snapshots every second.
Each round trains to a step past the first snapshots (a different one each round: the loss to
a checkpoint depends on where the fault falls), then cuts h2 off (its link down, its tasks
killed). The supervisor finds the host unreachable, re-plans on h1 and h3 and every task
restarts; the new chief restores every ps. Measured per round: the last global step logged
before the cut (every 10 steps; training stops with the ps: every step reads both), the step
the ps came back to and from where (the copy on ps/0's host, or the checkpoint), the steps
lost, and the same in seconds of training at the round's own steps/s before the cut (goal, issue
36: at most 5 s); and how long from the cut to training again (the host's detection,
``lifecycle.host_timeout_secs`` and SSH's timeouts, dominates it).
"""

from __future__ import annotations

import argparse
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
from apply_helpers import kill_groups, recorded_groups, state_of  # noqa: E402
from apply_helpers import tfplan as run_cli  # noqa: E402
from chaos_helpers import ApplyRun  # noqa: E402
from scale_helpers import conf_with  # noqa: E402
from test_apply_ssh import _host  # noqa: E402
from testbed import NetnsTestbed  # noqa: E402

GOAL_SECS = 5.0
LOG_STEPS = 10
SIDES = {
    "copies": ("a copy on the next ps's host (default)", []),
    "own": ("own host only (lifecycle.snapshot_copies=false)", ["lifecycle.snapshot_copies=false"]),
}
STEP_LINE = re.compile(r"^worker/0\s+\| step=(\d+) ")
RESTORED = re.compile(
    r"^worker/0\s+\| (?:ps/1 restored from its snapshot of step ([\d,]+)"
    r"|parameter servers uninitialised: restoring model\.ckpt-(\d+)"
    r"|ps/1 restored from its checkpoint of step ([\d,]+))"
)


def overrides(bed: NetnsTestbed, tmp: Path, run: str, checkpoint_steps: int) -> list[str]:
    return [
        "cluster=scale",
        f"experiment.id={run}",
        f"cluster.workdir={tmp / 'work' / run}",
        f"cluster.output_dir={bed.shared_dir / run}",
        "algo=hogwild",
        "trainer.max_steps=1000000",  # stopped by destroy once the cluster trains again
        f"trainer.log_steps={LOG_STEPS}",
        f"trainer.checkpoint_steps={checkpoint_steps}",
        "lifecycle.ps_grace_secs=2",
        "lifecycle.host_timeout_secs=6",
        f"lifecycle.snapshot_dir={bed.private_dir / 'shm'}",
    ]


def one_round(
    bed: NetnsTestbed,
    env: dict[str, str],
    tmp: Path,
    run: str,
    extra: list[str],
    fault_at: int,
    checkpoint_steps: int,
) -> dict[str, Any]:
    args = [*overrides(bed, tmp, run, checkpoint_steps), *extra]
    apply = ApplyRun(tmp, args, env=env)
    try:
        reached = apply.wait_step(fault_at, timeout=600, task="worker/0")
        steps = [
            (t, int(m[1])) for t, line in apply.lines[: reached + 1] if (m := STEP_LINE.match(line))
        ]
        (t0, s0), (t1, s1) = steps[len(steps) // 3], steps[-1]
        rate = (s1 - s0) / (t1 - t0) if t1 > t0 else float("nan")
        tasks = state_of(tmp, run)["tasks"]
        ps1_host = next(t["host"] for t in tasks if t["name"] == "ps/1")
        ns = bed.namespaces[int(ps1_host[1:]) - 1]
        cut = time.monotonic()
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
        for task in tasks:
            if task["host"] == ps1_host:
                os.killpg(task["handle"]["pgid"], 9)
        marker = len(apply.lines)
        restored_at = apply.wait_for(RESTORED.pattern, timeout=600, after=marker)
        again = apply.wait_for(r"^worker/0\s+\| step=\d+ ", timeout=300, after=restored_at)
        before = [
            s
            for t, line in apply.lines[:marker]
            if (m := STEP_LINE.match(line))
            for s in [int(m[1])]
        ]
        last = max(before)
        found = RESTORED.match(apply.lines[restored_at][1])
        assert found
        text = apply.lines[restored_at][1]
        step = int(next(g for g in found.groups() if g).replace(",", ""))
        source = "copy" if "the copy on" in text else ("snapshot" if found[1] else "checkpoint")
        return {
            "rate": rate,
            "last": last,
            "restored": step,
            "source": source,
            "lost_steps": last - step,
            "lost_secs": (last - step) / rate,
            "back_secs": apply.lines[again][0] - cut,
            "line": text.split("| ", 1)[1],
        }
    finally:
        for ns in bed.namespaces:
            subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=False)
        ApplyRun.kill_all(tmp)  # the supervisor first: it would restart what destroy stops
        run_cli(tmp, "destroy", "--auto-approve", "-e", run, env=env, timeout=300, check=True)
        kill_groups(recorded_groups(tmp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sides", default="copies,own", help="copies, own")
    parser.add_argument("--fault-at", type=int, default=900, help="the first round's fault step")
    # a long job's: a checkpoint every few minutes (this model trains ~150 steps/s here)
    parser.add_argument("--checkpoint-steps", type=int, default=5000)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_host_loss.md"))
    args = parser.parse_args()
    chosen = args.sides.split(",")
    if not chosen or any(k not in SIDES for k in chosen):
        parser.error(f"--sides {args.sides}: name copies, own")
    started = time.monotonic()
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in chosen}
    with tempfile.TemporaryDirectory(prefix="bench-host-loss-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "bed").mkdir()
        bed = NetnsTestbed(tmp / "bed", count=3, tag="h")
        try:
            bed.setup()
            hosts = [_host(t, cpu_slots=n) for t, n in zip(bed.targets(), (1, 1, 4), strict=True)]
            env = conf_with(
                tmp,
                {
                    "hosts": hosts,
                    "ps": 2,
                    "workers": 2,
                    "ssh_known_hosts": str(bed.known_hosts),
                },
            )
            env["TFPLAN_MAX_STEPS_CAP"] = ""
            for repeat in range(args.repeats):
                # a different step each round (another distance to the last checkpoint)
                fault_at = args.fault_at + repeat * 400
                for key in chosen:
                    run = f"{key}-{repeat}"
                    got = one_round(
                        bed, env, tmp, run, SIDES[key][1], fault_at, args.checkpoint_steps
                    )
                    rounds[key].append(got)
                    print(f"{run}: {got}", flush=True)
        finally:
            bed.teardown()
    report = write_report(args, rounds, time.monotonic() - started)
    Path(args.out).write_text(report)
    print(report)


def write_report(args: Any, rounds: dict[str, list[dict[str, Any]]], elapsed: float) -> str:
    rows, lines = [], []
    for key, got in rounds.items():
        lost = [r["lost_secs"] for r in got]
        rows.append(
            f"| {SIDES[key][0]} | {len(got)} | "
            f"{', '.join(sorted({r['source'] for r in got}))} | "
            f"{statistics.median(r['lost_steps'] for r in got):.0f} "
            f"({min(r['lost_steps'] for r in got)}-{max(r['lost_steps'] for r in got)}) | "
            f"{statistics.median(lost):.2f} ({min(lost):.2f}-{max(lost):.2f}) | "
            f"{sum(1 for x in lost if x <= GOAL_SECS)} of {len(lost)} | "
            f"{statistics.median(r['back_secs'] for r in got):.1f} |"
        )
        for i, r in enumerate(got, 1):
            lines.append(
                f"- {SIDES[key][0]}, round {i}: {r['rate']:.0f} steps/s before the cut, last "
                f"step {r['last']:,}, back to {r['restored']:,} ({r['source']}): "
                f"`{r['line']}`"
            )
    return "\n".join(
        [
            "# Training lost when a ps's whole host is lost (bench/bench_host_loss.py)",
            "",
            f"`sudo .venv/bin/python bench/bench_host_loss.py --repeats {args.repeats} --sides "
            f"{args.sides} --fault-at {args.fault_at} --checkpoint-steps "
            f"{args.checkpoint_steps}` on {platform.node() and 'this machine'} "
            f"({os.cpu_count()} cores), {elapsed / 60:.1f} min; the sides alternating.",
            "",
            "Three network-namespace hosts over SSH, each with its own memory folder for the "
            "snapshots: ps/0 alone on h1, ps/1 alone on h2, the chief and a worker on h3; the "
            "default experiment (an MLP on the digits), HOGWILD!, checkpoints every "
            f"{args.checkpoint_steps} steps, snapshots every second. h2 is cut off (link down, "
            "its tasks killed) at a different step each round; the supervisor re-plans on h1 "
            "and h3 and the new chief restores every ps.",
            "",
            "| side | rounds | ps/1 came back from | steps lost: median (range) | seconds of "
            f"training lost: median (range) | within {GOAL_SECS:g} s | cut -> training again "
            "(s), median |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Steps lost: the last step the chief logged before the cut (every "
            f"{LOG_STEPS} steps) minus the step ps/1 came back to; seconds: the same at the "
            "round's own steps/s before the cut. Cut -> training again: mostly the detection "
            "(SSH's connect timeouts, then `lifecycle.host_timeout_secs=6`), then every task's "
            "restart.",
            "",
            *lines,
            "",
        ]
    )


if __name__ == "__main__":
    main()
