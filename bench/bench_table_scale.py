"""A table larger than any one process: every task but the parameter servers under a memory limit.

    .venv/bin/python bench/bench_table_scale.py [--rows 16777216] [--small-rows 1000000]
        [--dim 64] [--ps 4] [--limit 1GiB] [--steps 600] [--out docs/bench_table_scale.md]

examples/wide_deep (an Embedding of item ids x ``--dim`` and a one-column Embedding of the same
ids, an MLP over 8 dense features; Zipf-distributed click logs from its own make_data.py, ids
below 50,000) is copied to a temporary folder and trained by ``tfplan apply`` on the embedded
local cluster: ``--ps`` parameter servers (every table split over all of them), 2 workers and an
evaluator, HOGWILD! with SGD (no optimizer slots), at two table sizes (``model.vocab``): the large
one (16,777,216 x 64 float32 = 4 GiB by default) and the small one beside it. Every task has a
memory limit of its own (``cluster.memory``, a cgroup per task): the chief, the workers and the
evaluator ``--limit`` each, every ps its share of the tables twice over (its part is initialised
from a random tensor of the part's size) plus 768 MiB; none of them could hold the large table.
Snapshots are off (``lifecycle.snapshot_secs=0``: in-memory snapshots of 4 GiB would need 8 GiB
of /dev/shm per copy); one checkpoint at step 0, one at the end, one kept.

Measured per run, by sampling every task's cgroup every 0.5 s: the peak of its memory (what its
limit counts: anonymous memory and the page cache it filled, e.g. the checkpoint it wrote or
read), the peak of its anonymous memory alone (``rss``), and the kernel's OOM kills in it;
examples/s (the chief's result.json), the held-out scores, the checkpoint's bytes and where the
trained model went (joined, or as parts). Nothing but loopback is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
from _example_runs import click_run, wide_deep_with_data  # noqa: E402
from apply_helpers import free_port_base, kill_groups, recorded_groups  # noqa: E402

BATCH = 256
GIB = 1 << 30
MIB = 1 << 20


def size_of(text: str) -> int:
    """``1GiB``, ``512MiB`` (or plain bytes) as bytes."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise SystemExit(f"--limit {text}: give a size such as 1GiB")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


def _groups(experiment: str) -> dict[str, Path]:
    """The experiment's task cgroups on this host, by task (``worker-1``)."""
    prefix = f"tfplan-{experiment}-"
    roots = [Path("/sys/fs/cgroup/tfplan"), Path("/sys/fs/cgroup/memory")]
    found = {}
    for root in roots:
        if not root.is_dir():
            continue
        for folder in root.rglob(prefix + "*"):
            if folder.is_dir() and "-standby-" not in folder.name:
                found[folder.name.removeprefix(prefix)] = folder
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _sample(folder: Path) -> tuple[int, int, int]:
    """(memory now or its peak, anonymous memory now, OOM kills) of one cgroup (v1 or v2)."""
    if (folder / "memory.max_usage_in_bytes").exists():  # v1
        peak = int(_read(folder / "memory.max_usage_in_bytes") or 0)
        stat = dict(line.split() for line in _read(folder / "memory.stat").splitlines() if line)
        anon = int(stat.get("rss", 0)) + int(stat.get("mapped_file", 0)) * 0
        oom = re.search(r"^oom_kill (\d+)", _read(folder / "memory.oom_control"), re.M)
        return peak, anon, int(oom.group(1)) if oom else 0
    peak = int(_read(folder / "memory.peak") or _read(folder / "memory.current") or 0)
    stat = dict(line.split() for line in _read(folder / "memory.stat").splitlines() if line)
    oom = re.search(r"^oom_kill (\d+)", _read(folder / "memory.events"), re.M)
    return peak, int(stat.get("anon", 0)), int(oom.group(1)) if oom else 0


class Sampler(threading.Thread):
    """Every 0.5 s, each task cgroup's peaks and OOM kills, kept at their highest."""

    def __init__(self, experiment: str) -> None:
        super().__init__(daemon=True)
        self.experiment = experiment
        self.peaks: dict[str, list[int]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for task, folder in _groups(self.experiment).items():
                got = _sample(folder)
                seen = self.peaks.setdefault(task, [0, 0, 0])
                for i, value in enumerate(got):
                    seen[i] = max(seen[i], value)


def run_one(project: Path, run: str, rows: int, args: argparse.Namespace) -> dict[str, Any]:
    limit = size_of(args.limit)
    table_bytes = rows * (args.dim + 1) * 4  # the deep table and the one-column wide one
    ps_limit = 2 * table_bytes // args.ps + 768 * MIB
    ws = project / "runs" / run
    ws.mkdir(parents=True)
    overrides = [
        f"experiment.id={run}",
        f"cluster.port_base={free_port_base()}",
        f"cluster.workdir={ws}/work",
        f"cluster.output_dir={ws}/out",
        f"cluster.ps={args.ps}",
        "cluster.evaluator=true",
        "algo=hogwild",
        "algo.optimizer=sgd",
        "model._target_=wide_deep.models.build",
        f"model.vocab={rows}",
        f"model.embed={args.dim}",
        "model.partition_bytes=1000000",
        *click_run(BATCH, args.steps),
        "trainer.export_model=true",
        "trainer.keep_checkpoints=1",
        "trainer.eval_secs=5",
        "lifecycle.snapshot_secs=0",
        f"+cluster.memory.ps={ps_limit}",
        f"+cluster.memory.chief={limit}",
        f"+cluster.memory.worker={limit}",
        f"+cluster.memory.evaluator={limit}",
    ]
    sampler = Sampler(run)
    sampler.start()
    began = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tfplan", "apply", "--auto-approve", *overrides],
            cwd=project,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            capture_output=True,
            text=True,
            timeout=3600,
        )
    finally:
        wall = time.monotonic() - began
        sampler.stop.set()
        sampler.join()
        kill_groups(recorded_groups(project))
    out = ws / "out"
    if proc.returncode != 0:
        raise RuntimeError(
            f"{run}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
        )
    result = json.loads((out / "result.json").read_text())
    ckpt = max(out.glob("model.ckpt-*.index"), key=lambda p: p.stat().st_mtime)
    prefix = str(ckpt)[: -len(".index")]
    checkpoint_bytes = sum(p.stat().st_size for p in out.glob(Path(prefix).name + ".*"))
    export = (
        "joined (model.keras)"
        if (out / "model.keras").exists()
        else ("as parts (model.parts/)" if (out / "model.parts").is_dir() else "none")
    )
    scoring = "by rows" if "read from each checkpoint row by row" in proc.stdout else "loaded"
    return {
        "rows": rows,
        "table_bytes": table_bytes,
        "limit": limit,
        "ps_limit": ps_limit,
        "examples_per_sec": float(result["examples_per_sec"]),
        "accuracy": result.get("accuracy"),
        "eval_loss": result.get("eval_loss"),
        "global_step": result.get("global_step"),
        "checkpoint_bytes": checkpoint_bytes,
        "export": export,
        "scoring": scoring,
        "wall": wall,
        "peaks": sampler.peaks,
    }


def _mib(n: int) -> str:
    return f"{n / MIB:,.0f}"


def report(runs: list[dict[str, Any]], args: argparse.Namespace, load: tuple[float, float]) -> str:
    small, large = runs
    lines = [
        "# Benchmark: a table larger than any one process",
        "",
        f"`.venv/bin/python bench/bench_table_scale.py --rows {args.rows} --small-rows "
        f"{args.small_rows} --dim {args.dim} --ps {args.ps} --limit {args.limit} --steps "
        f"{args.steps}` on {platform.node()} ({os.cpu_count()} cores), "
        f"{time.strftime('%Y-%m-%d')}. examples/wide_deep, HOGWILD! with SGD, {args.ps} ps "
        f"(every table split over all of them), 2 workers (worker/0 the chief) and an evaluator, "
        f"batch {BATCH}, {args.steps} steps, the same ids (below 50,000) in both runs; every task "
        f"in a memory cgroup of its own (`cluster.memory`): the chief, the workers and the "
        f"evaluator {args.limit} each, each ps twice its share of the tables plus 768 MiB. "
        "Snapshots off, a checkpoint at step 0 and one at the end. Load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end.",
        "",
        "| | " + f"{small['rows']:,} rows | {large['rows']:,} rows |",
        "|---|---|---|",
        f"| tables (MiB) | {_mib(small['table_bytes'])} | {_mib(large['table_bytes'])} |",
        f"| examples/s | {small['examples_per_sec']:,.0f} | {large['examples_per_sec']:,.0f} |",
        f"| held-out accuracy | {small['accuracy']:.4f} | {large['accuracy']:.4f} |",
        f"| held-out loss | {small['eval_loss']:.4f} | {large['eval_loss']:.4f} |",
        f"| checkpoint (MiB) | {_mib(small['checkpoint_bytes'])} | "
        f"{_mib(large['checkpoint_bytes'])} |",
        f"| scoring (evaluator, final scores) | {small['scoring']} | {large['scoring']} |",
        f"| trained model exported | {small['export']} | {large['export']} |",
        f"| apply, start to end (s) | {small['wall']:.0f} | {large['wall']:.0f} |",
        "",
        "Each task's peak memory (MiB) as its cgroup counts it (what its limit holds: anonymous "
        "memory and the page cache it filled), its peak anonymous memory, its limit, and the "
        "kernel's OOM kills in it:",
        "",
        "| task | limit | peak, " + f"{small['rows']:,} rows | peak, {large['rows']:,} rows | "
        "anonymous peak, "
        + f"{small['rows']:,} rows | anonymous peak, {large['rows']:,} rows | OOM kills |",
        "|---|---|---|---|---|---|---|",
    ]
    tasks = sorted(set(small["peaks"]) | set(large["peaks"]))
    for task in tasks:
        a = small["peaks"].get(task, [0, 0, 0])
        b = large["peaks"].get(task, [0, 0, 0])
        limit = large["ps_limit"] if task.startswith("ps-") else large["limit"]
        lines.append(
            f"| {task.replace('-', '/', 1)} | {_mib(limit)} | {_mib(a[0])} | {_mib(b[0])} | "
            f"{_mib(a[1])} | {_mib(b[1])} | {a[2] + b[2]} |"
        )
    kills = sum(p[2] for run in runs for p in run["peaks"].values())
    lines += ["", f"OOM kills in all runs: {kills}.", ""]
    part = large["table_bytes"] / args.ps
    ps_anon = max((p[1] for t, p in large["peaks"].items() if t.startswith("ps-")), default=0)
    others = max((p[1] for t, p in large["peaks"].items() if not t.startswith("ps-")), default=0)
    ratio = large["examples_per_sec"] / small["examples_per_sec"]
    lines += [
        f"Reading it: the {_mib(large['table_bytes'])} MiB tables train at {ratio:.2f}x the "
        f"examples/s of the {_mib(small['table_bytes'])} MiB ones (one run each, side by side); "
        f"no task but a ps holds them: the largest anonymous peak of the others is "
        f"{_mib(others)} MiB, against {_mib(part)} MiB of rows per ps; a ps's own peak "
        f"({_mib(ps_anon)} MiB, {ps_anon / part:.2f}x its part) is its variables and the "
        "random tensor of its part's size that initialises them, once. The chief (worker/0) "
        "writes the trained model as its parts where joining it would not fit a quarter of "
        "what its limit leaves (`trainer.export_join_bytes`: a joined export peaks at 2.5-3x "
        "the model; at half, then a third, the 248 MiB model's join OOM-killed the 1 GiB chief).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16_777_216)
    parser.add_argument("--small-rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--ps", type=int, default=4)
    parser.add_argument("--limit", default="1GiB")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_table_scale.md"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_table_scale needs root: each task's memory cgroup (cluster.memory)")
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-table-scale-") as tmp:
        project = wide_deep_with_data(Path(tmp))
        runs = []
        for n, rows in enumerate((args.small_rows, args.rows)):
            got = run_one(project, f"scale{n}", rows, args)
            print(
                f"{rows:,} rows: {got['examples_per_sec']:,.0f} examples/s, peaks (MiB) "
                + ", ".join(f"{t} {_mib(p[0])}" for t, p in sorted(got["peaks"].items())),
                flush=True,
            )
            runs.append(got)
    text = report(runs, args, (load_start[0], os.getloadavg()[0]))
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
