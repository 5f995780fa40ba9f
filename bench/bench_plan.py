"""Benchmark of `tfplan plan` at scale: every figure of issue 14, side by side, in one run.

Run from the repository root:

    .venv/bin/python bench/bench_plan.py [--runs N] [--baseline DIR] [--no-write | --out FILE]

1. `tfplan plan` as a user runs it (a subprocess, its own config tree) for 300 and 1,000 hosts x
   8 GPUs (ps=per_host, workers=per_gpu: 2,701 and 9,001 tasks): wall time, peak memory (the
   child's maxrss), plan file and printed plan per task; `tfplan show --task`, and the state's
   bytes per task once every task runs.
2. In-process planning (`planner.plan` alone) at 3 and 1,000 hosts, alternated: time per task.
3. `tfplan plan cluster=3node algo=downpour` against a bare Hydra compose of the same config tree
   with the same overrides (compose, resolve, typed object), alternated.
4. That the plan path imports no TensorFlow, and where the time of a 1,000-host plan goes.

``--baseline DIR`` runs the CLI figures of 1 (and 3) again with an older checkout in DIR (e.g.
``git archive <commit> | tar -x -C DIR``), alternated with this one, so before and after are
measured on the same machine at the same time; its 1,000-host runs take minutes each, so they
are repeated ``--baseline-runs`` times (default 1). Writes docs/bench_plan.md (or ``--out``;
nothing with --no-write) and prints the same text. ``--hosts 3,4 --runs 1 --small-runs 1``
runs every part at a tiny size, in seconds (a check that it works, not a measure).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tfplan.backends.process import ProcessBackend  # noqa: E402
from tfplan.cli.render import plan_lines  # noqa: E402
from tfplan.config.compose import compose_config, to_config  # noqa: E402
from tfplan.config.schema import Config  # noqa: E402
from tfplan.planning.context import PlanContext  # noqa: E402
from tfplan.planning.plan import Plan  # noqa: E402
from tfplan.planning.planner import plan  # noqa: E402
from tfplan.planning.state import State, TaskRecord  # noqa: E402
from tfplan.planning.topology import Target  # noqa: E402

CTX = PlanContext(cwd="/tmp/bench", local_python=sys.executable, tf_version="2.21.0")
SMALL_ARGS = ["plan", "cluster=3node", "algo=downpour"]
SIZES = (300, 1000)  # hosts x 8 GPUs; the largest is the one the targets are for (--hosts)
BARE_COMPOSE = """
import sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tfplan.config.compose import register_configs
register_configs()
with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    cfg = compose(config_name="config", overrides=sys.argv[2:])
OmegaConf.resolve(cfg)
OmegaConf.to_object(cfg)
"""


# --- running the CLI --------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float  # user + system: what contention for the cores does not inflate (much)
    peak_mib: float
    stdout_bytes: int
    plan_bytes: int


def _env(checkout: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFPLAN_")}
    if checkout is not None:  # ahead of the editable install of this checkout
        env["PYTHONPATH"] = str(checkout)
    return env


def run_cli(args: list[str], cwd: Path, checkout: Path | None = None) -> Run:
    """Run ``python -m tfplan ARGS`` in ``cwd``: wall time, the child's peak RSS, output bytes,
    and the plan file it saved (0 when none)."""
    shutil.rmtree(cwd / ".tfplan", ignore_errors=True)
    with tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfplan", *args],
            cwd=cwd,
            env=_env(checkout),
            stdout=subprocess.PIPE,
            stderr=err,
        )
        assert proc.stdout is not None
        size = 0
        while chunk := proc.stdout.read(1 << 20):
            size += len(chunk)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"tfplan {' '.join(args)} failed: {err.read().decode()[-600:]}")
    saved = cwd / ".tfplan" / "plan.json"
    cpu = usage.ru_utime + usage.ru_stime
    plan_bytes = saved.stat().st_size if saved.exists() else 0
    return Run(wall, cpu, usage.ru_maxrss / 1024, size, plan_bytes)


def wall_of(
    cmd: list[str], cwd: Path, checkout: Path | None = None, extra: dict[str, str] | None = None
) -> float:
    began = time.perf_counter()
    env = {**_env(checkout), **(extra or {})}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed: {done.stderr[-600:]}")
    return elapsed


def tasks_of(hosts: int) -> int:
    """Tasks of cluster=bench<hosts>: a ps per host, a worker per GPU, one evaluator."""
    return hosts * 9 + 1


def make_conf(folder: Path, sizes: tuple[int, ...]) -> Path:
    """The project's config tree plus cluster=bench<N>: N hosts x 8 GPUs, 10 slots each."""
    conf = folder / "conf"
    shutil.copytree(ROOT / "conf", conf)
    for hosts in sorted({3, *sizes}):
        lines = ["defaults:", "  - schema_cluster", "  - _self_", f"name: bench{hosts}", "hosts:"]
        for i in range(hosts):
            lines += [
                f"  - address: 10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                f"    name: gpu{i}",
                "    cpu_slots: 10",
                "    gpus: 8",
            ]
        lines += ["ps: per_host", "workers: per_gpu", "evaluator: true"]
        lines += ["output_dir: /shared/tfplan/${experiment.id}"]
        (conf / "cluster" / f"bench{hosts}.yaml").write_text("\n".join(lines) + "\n")
    return conf


def bench_cli_scale(
    runs: int, baseline: Path | None, baseline_runs: int, sizes: tuple[int, ...]
) -> dict[str, dict[int, list[Run]]]:
    """`tfplan plan cluster=bench<N>` per size, this checkout and the baseline alternated."""
    out: dict[str, dict[int, list[Run]]] = {"now": {}, "before": {}}
    with tempfile.TemporaryDirectory() as tmp:
        conf = make_conf(Path(tmp), sizes)
        cwd = Path(tmp) / "work"
        cwd.mkdir()
        for hosts in sizes:
            args = ["plan", f"cluster=bench{hosts}", "algo=downpour", "--config-dir", str(conf)]
            run_cli(args, cwd)  # warm the file cache
            now, before = [], []
            for i in range(runs):
                print(f"  {hosts} hosts, run {i + 1}/{runs}", flush=True)
                now.append(run_cli(args, cwd))
                if baseline is not None and i < baseline_runs:
                    before.append(run_cli(args, cwd, baseline))
            out["now"][hosts] = now
            if before:
                out["before"][hosts] = before
    return out


def bench_show_and_state(runs: int, big: int) -> dict[str, float]:
    """`tfplan show --task worker/17` at ``big`` hosts, and the state's size once all run."""
    with tempfile.TemporaryDirectory() as tmp:
        conf = make_conf(Path(tmp), (big,))
        cwd = Path(tmp) / "work"
        cwd.mkdir()
        run_cli(["plan", f"cluster=bench{big}", "algo=downpour", "--config-dir", str(conf)], cwd)
        saved = Plan.from_json((cwd / ".tfplan" / "plan.json").read_text())
        show = [
            wall_of([sys.executable, "-m", "tfplan", "show", "--task", "worker/17"], cwd)
            for _ in range(runs)
        ]
        shown = subprocess.run(
            [sys.executable, "-m", "tfplan", "show", "--task", "worker/17"],
            cwd=cwd,
            capture_output=True,
            env=_env(None),
            check=True,
        ).stdout
        moved = cluster_config(conf, big)
    state = State(
        lineage="bench",
        serial=1,
        experiment_id=saved.experiment_id,
        cluster_name=saved.cluster_name,
        output_dir=saved.output_dir,
        tasks=tuple(
            TaskRecord.from_task(
                t, saved, {"pid": 100000 + i, "pgid": 100000 + i}, 0.0, t.host, saved.address_of(t)
            )
            for i, t in enumerate(saved.tasks)
        ),
        backend=saved.backend,
        policy=saved.policy,
        config=saved.source_config,
    )
    state_bytes = len(json.dumps(state.to_dict(), indent=1, sort_keys=True))  # as StateStore
    # The worst case for the printed plan: every running task replaced, each listed on its own
    # with its reasons (a port offset moves every address, so every TF_CONFIG changes).
    moved.cluster.port_offset = 1
    replaced = plan(moved, state, CTX, ProcessBackend.target(moved.cluster, CTX))
    printed = sum(len(text) + 1 for _, text in plan_lines(replaced))
    return {
        "show_s": statistics.median(show),
        "show_bytes": len(shown),
        "state_bytes_per_task": state_bytes / len(saved.tasks),
        "tasks": len(saved.tasks),
        "replace_all_bytes_per_task": printed / len(replaced.tasks),
        "replaced": sum(1 for c in replaced.changes if c.action.value == "replace"),
    }


def bench_cli_small(runs: int) -> dict[str, float]:
    """`tfplan plan cluster=3node algo=downpour` against a bare Hydra compose, alternated: as a
    repeated plan runs it (its composition kept from the first: tfplan/config/compose_cache.py,
    in a cache folder of its own) and composed anew (``TFPLAN_COMPOSE_CACHE=0``)."""
    tfplan_cmd = [sys.executable, "-m", "tfplan", *SMALL_ARGS, "--config-dir", str(ROOT / "conf")]
    bare_cmd = [sys.executable, "-c", BARE_COMPOSE, str(ROOT / "conf"), *SMALL_ARGS[1:]]
    times: dict[str, list[float]] = {"tfplan": [], "anew": [], "bare": []}
    with tempfile.TemporaryDirectory() as cwd:
        kept = {"TFPLAN_CACHE_DIR": str(Path(cwd) / "cache")}
        anew = {**kept, "TFPLAN_COMPOSE_CACHE": "0"}
        wall_of(tfplan_cmd, Path(cwd), extra=kept)  # warm the file cache for all; keeps it
        wall_of(bare_cmd, Path(cwd))
        for _ in range(runs):
            times["tfplan"].append(wall_of(tfplan_cmd, Path(cwd), extra=kept))
            times["anew"].append(wall_of(tfplan_cmd, Path(cwd), extra=anew))
            times["bare"].append(wall_of(bare_cmd, Path(cwd)))
            shutil.rmtree(Path(cwd) / ".tfplan", ignore_errors=True)
    tfplan_s, bare_s = statistics.median(times["tfplan"]), statistics.median(times["bare"])
    anew_s = statistics.median(times["anew"])
    return {
        "tfplan": tfplan_s,
        "anew": anew_s,
        "bare": bare_s,
        "ratio": tfplan_s / bare_s,
        "anew_ratio": anew_s / bare_s,
    }


def tensorflow_imports() -> list[str]:
    """Modules of TensorFlow (or Keras) that `tfplan plan` imports: should be none."""
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "tfplan", *SMALL_ARGS],
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


# --- in process -------------------------------------------------------------------------------


def cluster_config(conf: Path, hosts: int) -> Config:
    return to_config(compose_config([f"cluster=bench{hosts}", "algo=downpour"], conf))


def _timed(fn: Callable[[], object]) -> float:
    """CPU seconds ``fn`` takes in this process: waiting for a core shared with other work
    does not count, so a run alternating two sizes compares their cost, not the load."""
    gc.collect()
    start = time.process_time()
    result = fn()
    elapsed = time.process_time() - start
    del result
    return elapsed


def bench_planner(runs: int, big: int) -> dict[str, float]:
    """`planner.plan` alone (the backend's target computed once), 3 vs ``big`` hosts,
    alternated."""
    with tempfile.TemporaryDirectory() as tmp:
        conf = make_conf(Path(tmp), (big,))
        cfgs = {n: cluster_config(conf, n) for n in (3, big)}
    targets = {n: ProcessBackend.target(cfg.cluster, CTX) for n, cfg in cfgs.items()}
    tasks = {n: len(plan(cfgs[n], None, CTX, targets[n]).tasks) for n in cfgs}
    times: dict[int, list[float]] = {3: [], big: []}
    for _ in range(runs):
        for n in (3, big):
            reps = 200 if n == 3 else 1  # the small plan takes ~1 ms: time many
            cfg, target = cfgs[n], targets[n]

            def many(cfg: Config = cfg, target: Target = target, reps: int = reps) -> object:
                return [plan(cfg, None, CTX, target) for _ in range(reps)]

            times[n].append(_timed(many) / reps)
    per = {n: statistics.median(times[n]) / tasks[n] * 1e6 for n in times}
    return {
        "tasks_3": tasks[3],
        "tasks_big": tasks[big],
        "plan_3_ms": statistics.median(times[3]) * 1e3,
        "plan_big_s": statistics.median(times[big]),
        "us_per_task_3": per[3],
        "us_per_task_big": per[big],
        "ratio": per[big] / per[3],
    }


def bench_stages(runs: int, big: int) -> dict[str, float]:
    """Where the time of a ``big``-host `tfplan plan` goes, stage by stage, in process."""
    stages: dict[str, list[float]] = {}

    def note(name: str, began: float) -> float:
        now = time.process_time()  # CPU time, as _timed
        stages.setdefault(name, []).append(now - began)
        return now

    with tempfile.TemporaryDirectory() as tmp:
        conf = make_conf(Path(tmp), (big,))
        for _ in range(runs):
            gc.collect()
            t = time.process_time()
            composed = compose_config([f"cluster=bench{big}", "algo=downpour"], conf)
            t = note(f"Hydra compose ({big:,} hosts in YAML)", t)
            cfg = to_config(composed)
            t = note("typed config (OmegaConf.to_object)", t)
            target = ProcessBackend.target(cfg.cluster, CTX)
            t = note("backend target (hosts resolved)", t)
            made = plan(cfg, None, CTX, target)
            t = note("planner (placement, ports, tasks, diff)", t)
            made = replace(made, request=ProcessBackend.dryrun(made))
            t = note("backend dry run", t)
            lines = plan_lines(made)
            t = note("render (summary)", t)
            with open(os.devnull, "w") as sink:
                sink.write("".join(text + "\n" for _, text in lines))
            t = note("print", t)
            (Path(tmp) / "plan.json").write_text(made.to_json(indent=None))
            note("plan file (JSON, written)", t)
    return {name: statistics.median(values) for name, values in stages.items()}


# --- the report -------------------------------------------------------------------------------


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
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


def _median(runs: list[Run], field: str) -> float:
    return float(statistics.median(float(getattr(r, field)) for r in runs))


def _size(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**NOT met**"


def report(
    results: dict[str, Any], runs: int, started: str, where: str, load: str, sizes: tuple[int, ...]
) -> str:
    scale, small, planner = results["scale"], results["small"], results["planner"]
    tasks = {hosts: tasks_of(hosts) for hosts in sizes}
    big = sizes[-1]
    rows = []
    for hosts in sizes:
        for label, key in (("before", "before"), ("now", "now")):
            got = scale[key].get(hosts)
            if not got:
                continue
            n = tasks[hosts]
            rows.append(
                f"| {hosts:,} x 8 ({n:,} tasks) | {label} ({len(got)} run{'s' * (len(got) > 1)}) "
                f"| {_median(got, 'wall_s'):.2f} s | {_median(got, 'cpu_s'):.2f} s "
                f"| {_median(got, 'peak_mib'):.0f} MiB "
                f"| {_size(_median(got, 'plan_bytes'))} ({_median(got, 'plan_bytes') / n:.0f} B) "
                f"| {_size(_median(got, 'stdout_bytes'))} ({_median(got, 'stdout_bytes') / n:.1f} B) |"
            )
    n = tasks[big]
    big_runs = scale["now"][big]
    checks = [
        (
            f"`tfplan plan` wall time at {big:,} hosts",
            "<= 5 s",
            f"{_median(big_runs, 'wall_s'):.2f} s (runs {min(r.wall_s for r in big_runs):.2f}-"
            f"{max(r.wall_s for r in big_runs):.2f} s; CPU time {_median(big_runs, 'cpu_s'):.2f} s)",
            _median(big_runs, "wall_s") <= 5,
        ),
        (
            "peak memory",
            "<= 500 MB",
            f"{_median(big_runs, 'peak_mib') * 1.048576:.0f} MB",
            _median(big_runs, "peak_mib") * 1.048576 <= 500,
        ),
        (
            "plan file per task",
            "<= 2 KB",
            f"{_median(big_runs, 'plan_bytes') / n:.0f} B",
            _median(big_runs, "plan_bytes") / n <= 2000,
        ),
        (
            "printed plan per task",
            "<= 1 KB",
            f"{_median(big_runs, 'stdout_bytes') / n:.2f} B",
            _median(big_runs, "stdout_bytes") / n <= 1000,
        ),
        (
            f"planning time per task, {big:,} vs 3 hosts",
            "<= 1.5x",
            f"{planner['ratio']:.2f}x",
            planner["ratio"] <= 1.5,
        ),
        (
            "`plan cluster=3node algo=downpour` vs a bare Hydra compose",
            "<= 1.3x",
            f"{small['ratio']:.2f}x",
            small["ratio"] <= 1.3,
        ),
    ]
    check_rows = "\n".join(f"| {a} | {b} | {c} | {_verdict(d)} |" for a, b, c, d in checks)
    stage_total = sum(results["stages"].values())
    stage_rows = "\n".join(
        f"| {name} | {secs:.3f} s | {secs / stage_total:.0%} |"
        for name, secs in results["stages"].items()
    )
    other = results["show"]
    tf = results["tf_modules"]
    return f"""# Benchmark: `tfplan plan` at scale

Made by `.venv/bin/python bench/bench_plan.py --runs {runs}{results["flags"]}` in one run;
every figure is a median. "before" is {results["baseline_name"]}, run alternately with this
checkout on the same machine (`git archive COMMIT | tar -x -C DIR` makes such a DIR).

- Date: {started}
- Machine: {where}; load average {load} at the start, {results["load_end"]} at the end (other
  work shares these cores: compare the ratios, measured side by side, more than the seconds)

## The targets of issue 14

For {big:,} hosts x 8 GPUs (`ps=per_host`, `workers=per_gpu`: {n:,} tasks), `tfplan plan` as a user
runs it (a subprocess composing its own config tree, saving the plan file, printing the plan):

| measure | target | measured | |
|---|---|---|---|
{check_rows}

Wall time on this shared machine swings with what else runs on its two cores (the range of the
runs is shown); the child's CPU time is the cost of the work itself, about what the wall time
is on an idle machine. The in-process figures below are CPU time for the same reason.

## `tfplan plan` for large clusters, before and after

CPU time is the child's user + system time: the cost of the work itself, which waiting for a
shared core does not add to (wall time does). Peak memory is the child's maxrss; bytes per task
in brackets.

| cluster | checkout | wall time | CPU time | peak memory | plan file | printed plan |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

The printed plan of a large cluster is a summary of the tasks to create, by role and by host
(docs/planning.md); every change other than a create is still listed on its own. The worst case
for the printed plan, every one of the {n:,} running tasks replaced ({other["replaced"]:.0f}
`-/+` entries, each with its reasons: `cluster.port_offset` changed), prints
{other["replace_all_bytes_per_task"]:.0f} B per task.
`tfplan show --task worker/17` prints one task in full, TF_CONFIG included, at {big:,} hosts in
{other["show_s"]:.2f} s ({_size(other["show_bytes"])}). The state of those {n:,} tasks once
started (as `StateStore` writes it) holds {other["state_bytes_per_task"]:.0f} B per task: the
cluster spec is not stored per task there either.

## Planning time per task (in process, `planner.plan` alone, CPU time)

| hosts | tasks | plan | per task |
|---|---|---|---|
| 3 | {planner["tasks_3"]:.0f} | {planner["plan_3_ms"]:.2f} ms | {planner["us_per_task_3"]:.0f} µs |
| {big:,} | {planner["tasks_big"]:.0f} | {planner["plan_big_s"]:.3f} s \
| {planner["us_per_task_big"]:.0f} µs |
| ratio | | | **{planner["ratio"]:.2f}x** |

The 3-host figure per task carries the fixed costs of a plan (validation, sharding preview,
policies) over 28 tasks only, so the ratio can fall below 1.

## A small plan against Hydra itself

| command | median wall time |
|---|---|
| `tfplan plan cluster=3node algo=downpour` (saves the plan, prints it), repeated: its \
composition kept from the first run (docs/planning.md, "Composed once") | {small["tfplan"]:.3f} s |
| the same, composed anew (`TFPLAN_COMPOSE_CACHE=0`) | {small["anew"]:.3f} s |
| bare Hydra compose of the same tree and overrides (compose, resolve, typed object) \
| {small["bare"]:.3f} s |
| ratio, repeated / bare | **{small["ratio"]:.2f}x** |
| ratio, composed anew / bare | {small["anew_ratio"]:.2f}x |

TensorFlow modules imported by `tfplan plan` (`python -X importtime`): \
{", ".join(tf) if tf else "none"}.

## Where the time of a {big:,}-host plan goes (in process, stage by stage, CPU time)

| stage | median | share |
|---|---|---|
{stage_rows}

Hydra's composition of a config that lists {big:,} hosts (PyYAML's pure-Python loader, then
OmegaConf merging and validating every host against the schema) is most of it; the rest is
linear in the tasks. Process start-up and imports (about 0.3 s) come on top in the CLI figures.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="an older checkout to compare with")
    parser.add_argument("--baseline-runs", type=int, default=1)
    parser.add_argument(
        "--baseline-name", default="", help="what the baseline is, for the report (a commit)"
    )
    parser.add_argument(
        "--hosts",
        default=",".join(map(str, SIZES)),
        help="cluster sizes (hosts x 8 GPUs), comma-separated; the largest is the one the "
        "targets, `show --task`, the planner's ratio and the stages are measured at (at least 3)",
    )
    parser.add_argument(
        "--small-runs",
        type=int,
        default=9,
        help="runs of the 3node plan and of the bare compose (at least --runs)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench_plan.md")
    parser.add_argument("--no-write", action="store_true", help="do not write the report")
    args = parser.parse_args()
    runs = max(1, args.runs)
    sizes = tuple(sorted({int(h) for h in args.hosts.split(",")}))
    if sizes[0] < 3:
        parser.error("--hosts: at least 3 hosts (`show --task worker/17` needs 18 workers)")
    big = sizes[-1]
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load = _load()
    results: dict[str, Any] = {
        "flags": (f" --hosts {args.hosts}" if sizes != SIZES else "")
        + (f" --small-runs {args.small_runs}" if args.small_runs != 9 else "")
        + (f" --baseline DIR --baseline-runs {args.baseline_runs}" if args.baseline else ""),
        "baseline_name": args.baseline_name or "the checkout named by `--baseline`",
    }
    print(f"tfplan plan at {' and '.join(f'{h:,}' for h in sizes)} hosts ...", flush=True)
    results["scale"] = bench_cli_scale(runs, args.baseline, args.baseline_runs, sizes)
    print("show --task and the state ...", flush=True)
    results["show"] = bench_show_and_state(runs, big)
    print(f"planner per task, 3 vs {big:,} hosts ...", flush=True)
    results["planner"] = bench_planner(runs, big)
    print("tfplan plan cluster=3node vs a bare Hydra compose ...", flush=True)
    results["small"] = bench_cli_small(max(runs, args.small_runs, 1))
    print("TensorFlow imports, stages ...", flush=True)
    results["tf_modules"] = tensorflow_imports()
    results["stages"] = bench_stages(runs, big)
    results["load_end"] = _load()
    text = report(results, runs, started, machine(), load, sizes)
    print(text)
    if not args.no_write:
        args.out.write_text(text)
    if results["tf_modules"]:
        raise SystemExit("tfplan plan imported TensorFlow")


if __name__ == "__main__":
    main()
