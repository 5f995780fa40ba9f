"""Benchmark `tfplan apply` against starting the same processes from a shell script.

    .venv/bin/python bench/bench_apply.py [--repeats 3]

Measured side by side, alternating, on cluster=local (1 ps + 2 workers, MLP on digits):
- launch -> first training step of every worker: tfplan apply vs a shell script with the
  same commands and environment (ratio of medians; target <= 1.2x);
- training done (result.json written) -> every task exited and apply returned (target <= 1 s);
- `tfplan destroy` of a running cluster (target <= 2 s, zero processes left).
Writes docs/bench_apply.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import alive, free_port_base  # noqa: E402

TFPLAN = [sys.executable, "-m", "tfplan"]
ENV = {**os.environ, "TFPLAN_CONF": str(REPO / "conf")}


def overrides(tmp: Path, steps: int) -> list[str]:
    return [
        "experiment.id=bench",
        f"cluster.port_base={free_port_base()}",
        "cluster.port_range=10",
        f"cluster.workdir={tmp}/work",
        f"cluster.output_dir={tmp}/out",
        f"trainer.max_steps={steps}",
        "trainer.log_steps=1000",
        "trainer.checkpoint_steps=1000",
    ]


def wait_first_steps(tmp: Path, started: float, timeout: float = 180) -> float:
    logs = [tmp / "work" / f"worker-{i}" / "task.log" for i in (0, 1)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() and "step=" in p.read_text(errors="replace") for p in logs):
            return time.monotonic() - started
        time.sleep(0.02)
    raise RuntimeError(f"no first step within {timeout}s in {tmp}")


def run_tfplan_launch(tmp: Path) -> float:
    args = overrides(tmp, 100000)
    started = time.monotonic()
    subprocess.run(
        [*TFPLAN, "apply", "--auto-approve", "--detach", *args],
        cwd=tmp,
        env=ENV,
        check=True,
        capture_output=True,
    )
    elapsed = wait_first_steps(tmp, started)
    subprocess.run(
        [*TFPLAN, "destroy", "--auto-approve"], cwd=tmp, env=ENV, check=True, capture_output=True
    )
    return elapsed


def run_shell_launch(tmp: Path) -> float:
    """The same tasks (commands, env, run.yaml, code) started by a plain shell script."""
    args = overrides(tmp, 100000)
    subprocess.run(
        [*TFPLAN, "plan", "--no-save", "--json", *args],
        cwd=tmp,
        env=ENV,
        check=True,
        capture_output=True,
    )
    plan = json.loads(
        subprocess.run(
            [*TFPLAN, "plan", "--json", "--no-save", *args],
            cwd=tmp,
            env=ENV,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    import yaml

    code = Path(plan["code_dir"])
    code.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-r", str(REPO / "recipes"), str(code)], check=True)
    lines = ["#!/bin/sh"]
    for task in plan["tasks"]:
        workdir = Path(task["workdir"])
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "run.yaml").write_text(yaml.safe_dump(plan["run_config"]))
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in task["env"].items())
        cmd = " ".join(shlex.quote(c) for c in task["command"])
        lines.append(
            f"cd {shlex.quote(str(workdir))}; env {env} setsid {cmd} > "
            f"{shlex.quote(task['log_path'])} 2>&1 < /dev/null & echo $!"
        )
    script = tmp / "start.sh"
    script.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    out = subprocess.run(["sh", str(script)], check=True, capture_output=True, text=True).stdout
    elapsed = wait_first_steps(tmp, started)
    for pid in (int(p) for p in out.split()):
        try:
            os.killpg(pid, 9)
        except ProcessLookupError:
            pass
    return elapsed


def run_teardown(tmp: Path) -> float:
    """Seconds from result.json appearing to `tfplan apply` (attached) returning."""
    args = overrides(tmp, 60)
    proc = subprocess.Popen(
        [*TFPLAN, "apply", "--auto-approve", *args],
        cwd=tmp,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    result = tmp / "out" / "result.json"
    while not result.exists():
        if proc.poll() is not None:
            raise RuntimeError("apply ended before result.json appeared")
        time.sleep(0.01)
    seen = time.monotonic()
    proc.wait(timeout=120)
    return time.monotonic() - seen


def run_destroy(tmp: Path) -> tuple[float, int]:
    args = overrides(tmp, 100000)
    subprocess.run(
        [*TFPLAN, "apply", "--auto-approve", "--detach", *args],
        cwd=tmp,
        env=ENV,
        check=True,
        capture_output=True,
    )
    wait_first_steps(tmp, time.monotonic())
    state = json.loads((tmp / ".tfplan" / "bench" / "state.json").read_text())
    pids = [t["pid"] for t in state["tasks"]]
    started = time.monotonic()
    subprocess.run(
        [*TFPLAN, "destroy", "--auto-approve"], cwd=tmp, env=ENV, check=True, capture_output=True
    )
    return time.monotonic() - started, sum(1 for p in pids if alive(p))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    tfplan_launch, shell_launch, teardown, destroy, left = [], [], [], [], []
    for i in range(repeats):
        for kind in ("tfplan", "shell") if i % 2 == 0 else ("shell", "tfplan"):
            with tempfile.TemporaryDirectory() as tmp:
                if kind == "tfplan":
                    tfplan_launch.append(run_tfplan_launch(Path(tmp)))
                else:
                    shell_launch.append(run_shell_launch(Path(tmp)))
        with tempfile.TemporaryDirectory() as tmp:
            teardown.append(run_teardown(Path(tmp)))
        with tempfile.TemporaryDirectory() as tmp:
            secs, remaining = run_destroy(Path(tmp))
            destroy.append(secs)
            left.append(remaining)
        print(
            f"round {i + 1}: tfplan {tfplan_launch[-1]:.2f}s shell {shell_launch[-1]:.2f}s "
            f"teardown {teardown[-1]:.2f}s destroy {destroy[-1]:.2f}s left {left[-1]}",
            flush=True,
        )
    med = statistics.median
    ratio = med(tfplan_launch) / med(shell_launch)
    rows = [
        ("launch -> first step of every worker, tfplan apply", f"{med(tfplan_launch):.2f} s", ""),
        ("launch -> first step of every worker, shell script", f"{med(shell_launch):.2f} s", ""),
        (
            "ratio tfplan / shell (target <= 1.2)",
            f"{ratio:.2f}x",
            "pass" if ratio <= 1.2 else "MISS",
        ),
        (
            "training done -> all tasks exited, apply returned (target <= 1 s)",
            f"{med(teardown):.2f} s",
            "pass" if med(teardown) <= 1 else "MISS",
        ),
        (
            "tfplan destroy of a running cluster (target <= 2 s)",
            f"{med(destroy):.2f} s",
            "pass" if med(destroy) <= 2 else "MISS",
        ),
        (
            "processes left after destroy (all rounds)",
            str(sum(left)),
            "pass" if not sum(left) else "MISS",
        ),
    ]
    text = [
        "# Benchmark: apply, teardown, destroy",
        "",
        f"`.venv/bin/python bench/bench_apply.py --repeats {repeats}` on {platform.node()} "
        f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. cluster=local (1 ps + 2 "
        "workers), MLP on digits. Medians of the rounds; tfplan and the shell script alternate.",
        "",
        "| measure | median | target |",
        "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
        "",
        "Raw (s): tfplan "
        + ", ".join(f"{x:.2f}" for x in tfplan_launch)
        + "; shell "
        + ", ".join(f"{x:.2f}" for x in shell_launch)
        + "; teardown "
        + ", ".join(f"{x:.2f}" for x in teardown)
        + "; destroy "
        + ", ".join(f"{x:.2f}" for x in destroy),
        "",
        "The shell script starts the very same commands with the same environment, run.yaml and "
        "code (taken from `tfplan plan --json`), so the ratio is tfplan's own overhead: composing "
        "the config, preflight, shipping files, and recording PIDs.",
        "",
    ]
    out = REPO / "docs" / "bench_apply.md"
    out.write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
