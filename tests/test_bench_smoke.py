"""Every benchmark in bench/ still runs to its end and still measures something.

A benchmark is run rarely, by hand, and rots silently meanwhile (bench_apply's shell baseline
started its tasks without TF_CONFIG or the plan-wide environment for a whole plan format before
anyone noticed: issue 24). Each test here runs one script as a user would, as a subprocess, at
its tiniest settings (one round, few steps, few hosts), writing its report into the test's own
folder, and checks that the report carries real figures. The figures themselves are not judged:
at these sizes, on a shared machine, they measure nothing; what they prove is that the whole
path of the benchmark works. No test writes into docs/ (checked).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_testbed import SlurmTestbed
from spark_testbed import spark_missing

pytestmark = [pytest.mark.full, pytest.mark.cluster]

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
DOCS = REPO / "docs"
NUMBER = r"([\d,]+(?:\.\d+)?)"


# What the benchmarks write by default: a smoke test points each elsewhere.
REPORTS = [
    DOCS / name
    for name in (
        "algorithms.md",
        "algorithms.png",
        "bench_apply.md",
        "bench_dynamic.md",
        "bench_embeddings.md",
        "bench_explain.md",
        "bench_fault_accuracy.md",
        "bench_inputs.md",
        "bench_plan.md",
        "bench_reshard.md",
        "bench_resize.md",
        "bench_scale.md",
        "bench_scale.png",
        "bench_slurm.md",
        "bench_spark.md",
        "bench_streaming.md",
        "bench_strategies.md",
        "bench_sweep.md",
        "bench_table_init.md",
        "bench_table_scale.md",
        "bench_table_rules.md",
        "bench_training.md",
        "bench_user_model.md",
        "reliability.md",
    )
]


@pytest.fixture(autouse=True)
def docs_untouched() -> Iterator[None]:
    """A benchmark pointed at the test's folder leaves the reports in docs/ alone."""
    before = {p: p.stat().st_mtime_ns for p in REPORTS}
    yield
    after = {p: p.stat().st_mtime_ns for p in REPORTS}
    assert after == before, "a benchmark wrote into docs/"


def run_bench(
    script: str, *args: str, cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> str:
    """Run ``bench/<script> ARGS`` to its exit; its output (stdout and stderr). On a timeout
    it gets SIGINT first, so that its own cleanup (destroy, scancel) runs, then SIGKILL."""
    full_env = {k: v for k, v in (env or os.environ).items() if not k.startswith("TFPLAN_")}
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), *args],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        raise AssertionError(
            f"{script} did not end within {timeout:.0f}s:\n{out[-6000:]}"
        ) from None
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def figure(text: str, label: str, column: int = 1) -> float:
    """The number in the ``column``-th cell after the one where ``label`` is, in the first
    Markdown table row holding ``label`` (from the row's start when ``label`` starts with |)."""
    anchor = "^" if label.startswith("|") else ""
    skip = r"[^|]*\|" * column
    match = re.search(anchor + re.escape(label) + skip + r"[^|\d]*" + NUMBER, text, re.M)
    assert match, f"no figure in column {column} after {label!r} in:\n{text}"
    return float(match.group(1).replace(",", ""))


def test_every_benchmark_has_a_smoke_test() -> None:
    scripts = {p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    tests = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert scripts <= tests, f"benchmarks without a smoke test: {sorted(scripts - tests)}"


@pytest.mark.timeout(600)
def test_bench_apply(tmp_path: Path) -> None:
    out = tmp_path / "bench_apply.md"
    run_bench("bench_apply.py", "--repeats", "1", "--out", str(out), cwd=tmp_path, timeout=480)
    text = out.read_text()
    assert figure(text, "first step of every worker, tfplan apply") > 0
    assert figure(text, "first step of every worker, shell script") > 0
    assert figure(text, "tfplan apply cluster.warm=false") > 0
    assert figure(text, "ratio tfplan (warm) / shell") > 0
    assert figure(text, "ratio tfplan cold / shell") > 0
    assert figure(text, "tfplan apply with a seed kept from an earlier apply") > 0
    assert figure(text, "PSS of the running cluster with a kept seed") > 0
    assert figure(text, "PSS of the running cluster (tasks + seed), warm / cold") > 0
    assert figure(text, "training done -> all tasks exited") > 0
    assert figure(text, "tfplan destroy of a running cluster") > 0
    assert "| processes left after destroy (all rounds) | 0 | pass |" in text
    assert "| snapshot folders left in /dev/shm (all rounds and runs) | 0 | pass |" in text


@pytest.mark.timeout(600)
def test_bench_dynamic(tmp_path: Path) -> None:
    out = tmp_path / "bench_dynamic.md"
    # hashed-mem is the hashed model with more rows: the smoke leaves it out (the budget)
    args = ["--repeats", "1", "--examples", "6000", "--variants", "dynamic,hashed,vocab"]
    run_bench("bench_dynamic.py", *args, "--out", str(out), cwd=tmp_path, timeout=480)
    text = out.read_text()
    for variant in ("dynamic", "hashed", "vocab"):
        assert figure(text, f"| {variant} |", column=0) > 0  # held-out log loss
        assert figure(text, f"| {variant} |", column=2) > 0  # examples/s
    assert "distinct ids sharing a row in the final checkpoint, per run: 0;" in text
    assert figure(text, "| 1 | ps/0 |", column=0) > 0  # its RSS at the first eviction


@pytest.mark.timeout(600)
def test_bench_reshard(tmp_path: Path) -> None:
    """The re-sharded job alone (2 -> 3 -> 1 ps on the CTR example, 26 split tables): each
    resume restores the step its checkpoint holds and scores the held-out file as the
    checkpoint did (the same assertion as test_user_model_apply's split model, on 2 ps -> 1)."""
    out = tmp_path / "bench_reshard.md"
    args = ["--repeats", "1", "--steps", "10", "--vocab-scale", "0.001", "--jobs", "reshard"]
    args += ["--checks-only"]  # 10 steps on 2 ps, a frozen step on 3 ps, one on 1 ps
    run_bench("bench_reshard.py", *args, "--out", str(out), cwd=tmp_path, timeout=480)
    text = out.read_text()
    for change in ("2 -> 3", "3 -> 1"):
        row = f"| 2 -> 3 -> 1 ps | 1 | {change} |"
        checkpoint, restored = figure(text, row, column=0), figure(text, row, column=1)
        assert checkpoint >= 10 and restored == checkpoint, (change, text)
        before, after = figure(text, row, column=2), figure(text, row, column=3)
        assert 0 < before and abs(after - before) <= 1e-6, (change, text)
    final = re.search(r"^\| 2 -> 3 -> 1 ps \| ([\d,]+) \| [\d.]+ \(", text, re.M)  # scores
    assert final and int(final.group(1).replace(",", "")) >= 12, text


@pytest.mark.timeout(600)
def test_bench_embeddings(tmp_path: Path) -> None:
    out = tmp_path / "bench_embeddings.md"
    args = ["--rows", "50000,100000", "--algos", "hogwild", "--steps-scale", "0.02", "--anchors"]
    args += ["--anchor-max-rows", "50000"]  # the anchors at the smaller size only (the budget)
    run_bench("bench_embeddings.py", *args, "--out", str(out), cwd=tmp_path, timeout=480)
    text = out.read_text()
    assert figure(text, "| hogwild | now |", column=0) > 0  # examples/s, smallest table
    assert figure(text, "| hogwild | now |", column=1) > 0  # the largest
    for row in ("| Keras fit | one process |", "| TF ParameterServerStrategy | tf_keras fit |"):
        assert figure(text, row, column=0) > 0  # the smallest


@pytest.mark.timeout(600)
def test_bench_table_scale(tmp_path: Path) -> None:
    """Tiny tables (the limits then hold them easily: the path, not the figures; a table larger
    than the limits is tests/test_table_memory.py's), 2 ps, few steps."""
    if os.geteuid() != 0:
        pytest.skip("a memory cgroup per task needs root (CI runs as root)")
    out = tmp_path / "bench_table_scale.md"
    args = ["--rows", "100000", "--small-rows", "50000", "--dim", "8", "--ps", "2"]  # ids < 50,000
    args += ["--limit", "900MiB", "--steps", "20"]
    run_bench("bench_table_scale.py", *args, "--out", str(out), cwd=tmp_path, timeout=480)
    text = out.read_text()
    assert figure(text, "| examples/s |", column=0) > 0 and figure(text, "| examples/s |") > 0
    assert "| scoring (evaluator, final scores) | loaded | loaded |" in text, text
    for task in ("| ps/0 |", "| ps/1 |", "| worker/0 |", "| worker/1 |", "| evaluator/0 |"):
        assert figure(text, task, column=0) > 0, text  # its limit
        assert figure(text, task, column=2) > 0, text  # its peak, the larger table
    assert "OOM kills in all runs: 0." in text, text


@pytest.mark.timeout(300)
def test_bench_table_init(tmp_path: Path) -> None:
    out = tmp_path / "bench_table_init.md"
    args = ["--rows", "20000", "--dim", "8", "--repeats", "1"]
    run_bench("bench_table_init.py", *args, "--out", str(out), cwd=tmp_path, timeout=240)
    text = out.read_text()
    for process in ("| ps/0 |", "| ps/1 |", "| chief |"):
        assert figure(text, process, column=0) > 0  # row-wise: RSS before the initialiser
        assert figure(text, process, column=1) > 0  # whole
    assert figure(text, "| initialiser wall time (s) |", column=0) > 0
    for column in (0, 1, 2):  # gathered by the chief, on each ps, streamed through the chief
        assert figure(text, "| save wall time (s) |", column=column) > 0
        assert figure(text, "| checkpoint (MiB) |", column=column) >= 0


@pytest.mark.timeout(600)
def test_bench_table_rules(tmp_path: Path) -> None:
    """hogwild, the reference every run has, and the one-process anchor: two runs of the CTR
    model. The ``--baseline`` leg (a checkout with the dense rule) is left out (the suite's
    budget): it runs the same ``apply_example`` with another checkout, whose path
    test_bench_scale's ``--baseline`` tries."""
    out = tmp_path / "bench_table_rules.md"
    args = ["--algos", "hogwild", "--anchor", "--steps", "10", "--repeats", "1"]
    run_bench("bench_table_rules.py", *args, "--out", str(out), cwd=tmp_path, timeout=480)
    text = out.read_text()
    for row in ("| hogwild | rows (now) |", "| Keras fit | one process |"):
        assert 0 < figure(text, row, column=0) <= 1  # accuracy
        assert figure(text, row, column=2) > 0  # examples/s
        assert re.search(re.escape(row) + r"(?:[^|]*\|){3} [+-]\d+\.\d \|$", text, re.M), text
    assert "The click rate alone scores accuracy" in text


@pytest.mark.timeout(300)
def test_bench_explain(tmp_path: Path) -> None:
    out = tmp_path / "bench_explain.md"
    run_bench("bench_explain.py", "--repeats", "1", "--out", str(out), cwd=tmp_path, timeout=240)
    assert figure(out.read_text(), "| exit -> explanation on screen") > 0


@pytest.mark.timeout(1000)
def test_bench_resize(tmp_path: Path) -> None:
    out = tmp_path / "bench_resize.md"
    args = ["--repeats", "1", "--window", "1", "--step-pause", "0.05", "--out", str(out)]
    run_bench("bench_resize.py", *args, cwd=tmp_path, timeout=900)
    text = out.read_text()
    assert figure(text, "| apply -> both new workers' first step (s)") > 0
    assert figure(text, "| global steps rolled back") == 0
    assert figure(text, "| parameter-server restarts") == 0
    assert figure(text, "| processes left after the job ended by itself") == 0


@pytest.mark.timeout(600)
def test_bench_sweep(tmp_path: Path) -> None:
    out = tmp_path / "bench_sweep.md"
    args = ["--points", "2", "--prune-points", "2", "--steps", "100", "--prune-steps", "300"]
    run_bench(
        "bench_sweep.py", *args, "--concurrency", "1", "--out", str(out), cwd=tmp_path, timeout=540
    )
    text = out.read_text()
    assert figure(text, "| wall / training") > 1
    assert figure(text, "| apply -> first step, points after the first (s, median)") > 0
    assert figure(text, "| processes left after the sweep") == 0
    assert figure(text, "| sweep wall time (s) | ") > 0  # the pruning table's
    assert "| best point (accuracy) | algo.lr=" in text


@pytest.mark.timeout(600)
def test_bench_inputs(tmp_path: Path) -> None:
    out = tmp_path / "bench_inputs.md"
    run_bench(
        "bench_inputs.py",
        "--rounds",
        "1",
        "--secs",
        "0.5",
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=480,
    )
    text = out.read_text()
    for variant in ("feed", "tf.data", "tf.data + keras", "tfrecord"):
        assert figure(text, f"| {variant} |", column=0) > 0  # examples/s
        assert figure(text, f"| {variant} |", column=1) > 0  # vs feed_dict


@pytest.mark.timeout(600)
def test_bench_streaming(tmp_path: Path) -> None:
    out = tmp_path / "bench_streaming.md"
    run_bench(
        "bench_streaming.py",
        "--limit-mib",
        "1200",
        "--ratio",
        "0.1",
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=480,
    )
    text = out.read_text()
    assert figure(text, "| data (TFRecord files) |", column=0) > 0
    assert figure(text, "| peak memory use of the cgroup |", column=0) > 0
    assert "| processes killed by the OOM killer | 0 |" in text
    assert "| trained to the end under the limit | yes |" in text


@pytest.mark.timeout(600)
def test_bench_user_model(tmp_path: Path) -> None:
    out = tmp_path / "bench_user_model.md"
    run_bench(
        "bench_user_model.py",
        "--examples",
        "3200",
        "--only",
        "downpour",
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=480,
    )
    text = out.read_text()
    assert 0 < figure(text, "| one process, Keras fit |", column=0) <= 1
    assert 0 < figure(text, "| downpour |", column=0) <= 1


@pytest.mark.timeout(300)
def test_bench_plan(tmp_path: Path) -> None:
    out = tmp_path / "bench_plan.md"
    args = ["--hosts", "3,4", "--runs", "1", "--small-runs", "1", "--out", str(out)]
    run_bench("bench_plan.py", *args, cwd=tmp_path, timeout=240)
    text = out.read_text()
    assert figure(text, "`tfplan plan` wall time at 4 hosts", column=2) > 0
    assert figure(text, "plan file per task", column=2) > 0
    assert figure(text, "| 4 x 8 (37 tasks) | now (1 run)") > 0
    assert figure(text, "bare Hydra compose of the same tree") > 0
    assert figure(text, "the same, composed anew (`TFPLAN_COMPOSE_CACHE=0`)") > 0
    assert "imported by `tfplan plan` (`python -X importtime`): none." in text


@pytest.mark.timeout(600)
def test_bench_algorithms(tmp_path: Path) -> None:
    out, png, raw = tmp_path / "algorithms.md", tmp_path / "algorithms.png", tmp_path / "runs.json"
    args = ["--minibatches", "40", "--rounds", "1", "--only", "hogwild,allreduce,pss"]
    args += ["--out", str(out), "--png", str(png), "--json", str(raw)]
    run_bench("bench_algorithms.py", *args, cwd=tmp_path, timeout=480)
    runs = {r["name"]: r for r in json.loads(raw.read_text())}
    assert sorted(runs) == ["allreduce", "hogwild", "pss"]
    for name, run in runs.items():
        assert "error" not in run, f"{name}: {run.get('log')}"
        assert run["result"]["examples_per_sec"] > 0 and run["result"]["accuracy"] > 0
        assert run["curve"], f"{name}: the evaluator scored no checkpoint"
    text = out.read_text()
    for name in runs:
        assert figure(text, f"| `{name}`", column=5) > 0  # examples/s
    assert png.stat().st_size > 0


@pytest.mark.timeout(300)
def test_bench_fault_accuracy(tmp_path: Path) -> None:
    """One run a side, a short training: the fault side's ps is killed, comes back, and both
    sides' final scores are reported (the figures are the 5-run report's, docs/)."""
    out = tmp_path / "bench_fault_accuracy.md"
    args = ["--runs", "1", "--steps", "400", "--checkpoint-steps", "100", "--pace", "0.01"]
    run_bench("bench_fault_accuracy.py", *args, "--out", str(out), cwd=tmp_path, timeout=240)
    text = out.read_text()
    for side in ("| no fault |", "| ps/0 killed |"):
        assert 0 < figure(text, side, column=0) <= 1, text  # the median held-out accuracy
    assert re.search(r"\| ps/0 killed \| 0 \| [\d.]+ \| [\d.]+ \| 40\d \| \d+ \| \w", text), text


@pytest.mark.timeout(600)
def test_bench_reliability(tmp_path: Path) -> None:
    out = tmp_path / "reliability.md"
    fault = "SIGKILL ps/0 (program), cold, warm standby"
    args = ["--repeats", "1", "--only", fault, "--speed-runs", "1", "--speed-steps", "100"]
    args += ["--speed-only", "ps_standby"]  # the snapshot sides are the same path, other keys
    args += ["--fault-at", "100", "--step-pause", "0.05"]  # a paced fault round, quick
    run_bench("bench_reliability.py", *args, "--out", str(out), cwd=tmp_path, timeout=480)
    text = out.read_text()
    assert "Failed rounds" not in text, text
    assert figure(text, f"| {fault}", column=2) > 0  # fault -> victim back (s)
    assert figure(text, f"| {fault}", column=6) >= 0  # training lost (s)
    assert figure(text, "| ps_standby=false") > 0 and figure(text, "| ps_standby=true") > 0
    assert re.search(r"CPU [\d.]+ % of one core, RSS \d+ MiB", text), text


@pytest.mark.netns
@pytest.mark.timeout(600)
def test_bench_scale(tmp_path: Path) -> None:
    """Tiny: 3 local tasks (this checkout as its own baseline), 2 namespace hosts x 2 tasks."""
    out = tmp_path / "bench_scale.md"
    args = ["--sizes", "3", "--baseline", str(REPO), "--ssh-hosts", "2", "--ssh-tasks", "2"]
    args += ["--settle", "0.5", "--measure", "1", "--training-repeats", "1"]
    args += ["--training-steps", "40", "--out", str(out)]
    run_bench("bench_scale.py", *args, cwd=tmp_path, timeout=540)
    text = out.read_text()
    assert figure(text, "| now | local | 3", column=3) >= 0  # processes per task
    assert figure(text, "| before | local | 3", column=5) > 0  # supervisor RSS
    assert "| now | ssh 2x2 | 4 |" in text and text.count("| 0 |") >= 3  # nothing left
    assert figure(text, "| hogwild", column=1) > 0 and figure(text, "| downpour") > 0
    assert (tmp_path / "bench_scale.png").stat().st_size > 0


@pytest.mark.netns
@pytest.mark.timeout(900)
def test_bench_table_traffic(tmp_path: Path) -> None:
    """pss only, one vocabulary scale, short runs, no batch-1 runs: the path (namespace hosts,
    the veths' counters, the plan's sizes, the distinct ids counted in the data), not the
    figures (a row's cost is the difference of two such steps: docs/bench_table_traffic.md)."""
    out = tmp_path / "bench_table_traffic.md"
    args = ["--algos", "pss", "--steps", "20,60", "--vocab-scales", "0.001", "--no-batch-one"]
    run_bench("bench_table_traffic.py", *args, "--out", str(out), cwd=tmp_path, timeout=840)
    text = out.read_text()
    assert figure(text, "| pss | 0.001 |", column=2) > 0  # dense variables' bytes
    assert figure(text, "| pss | 0.001 |", column=3) > 0  # a step's bytes to the ps
    assert figure(text, "| pss | 0.001 |", column=7) > 0  # the step against its rows' bound
    assert re.search(r"U the mean distinct ids of a batch \(counted in the data: [\d,]+", text)


@pytest.mark.timeout(300)
def test_bench_strategies(tmp_path: Path) -> None:
    out = tmp_path / "bench_strategies.md"
    args = ["--repeats", "1", "--steps", "20", "--out", str(out)]
    run_bench("bench_strategies.py", *args, cwd=tmp_path, timeout=240)
    text = out.read_text()
    for name in ("allreduce", "sync", "pss", "pss K=1", "hogwild"):
        row = re.search(rf"^\| `{re.escape(name)}` \| [^|]+ \| (\d+) \| {NUMBER} \|", text, re.M)
        assert row, f"no row for {name}:\n{text}"
        assert int(row.group(1)) >= 20 and float(row.group(2).replace(",", "")) > 0


@pytest.mark.timeout(300)
def test_bench_training(tmp_path: Path) -> None:
    out = tmp_path / "bench_training.md"
    args = ["--only", "hogwild", "--repeats", "1", "--steps", "30", "--single-secs", "0.2"]
    run_bench("bench_training.py", *args, "--out", str(out), cwd=tmp_path, timeout=240)
    text = out.read_text()
    assert figure(text, "| hogwild | 100") > 0  # cluster examples/s
    assert figure(text, "| 100") > 0  # one process, default threads
    assert figure(text, "| worker/0") > 0  # launch to its first step


@pytest.mark.slurm
@pytest.mark.netns
@pytest.mark.timeout(600)
def test_bench_slurm(tmp_path: Path, slurm_cluster: SlurmTestbed) -> None:
    out = tmp_path / "bench_slurm.md"
    args = ["--repeats", "1", "--job-end-steps", "20", "--slurm-conf", str(slurm_cluster.conf)]
    run_bench(
        "bench_slurm.py",
        *args,
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=480,
        env=slurm_cluster.env(),
    )
    text = out.read_text()
    assert figure(text, "apply -> first step of every worker, tfplan (warm") > 0
    assert figure(text, "the same, tfplan with `cluster.warm=false`") > 0
    assert figure(text, "the same tasks by hand") > 0
    assert figure(text, "training done (chief exited) -> job gone from squeue") >= 0
    assert slurm_cluster.run("squeue", "-h").stdout.strip() == ""  # nothing left queued


@pytest.mark.spark
@pytest.mark.netns
@pytest.mark.timeout(900)
def test_bench_spark(tmp_path: Path) -> None:
    """The bench starts its own Spark test bed (a master and 3 workers in namespaces) and
    stops it: one round of each measure, few steps."""
    if os.geteuid() != 0:
        pytest.skip("the Spark test bed needs root for network namespaces (CI runs as root)")
    if spark_missing():
        pytest.fail(f"Spark is not installed ({', '.join(spark_missing())}): run scripts/setup.sh")
    out = tmp_path / "bench_spark.md"
    run_bench("bench_spark.py", "--smoke", "--out", str(out), cwd=tmp_path, timeout=780)
    text = out.read_text()
    assert figure(text, "apply -> first step of every worker, tfplan") > 0
    assert figure(text, "the same tasks by hand") > 0
    assert figure(text, "ratio of the medians, tfplan / by hand") > 0
    assert 0 < figure(text, "ps SIGKILLed -> training again") < 120
    assert figure(text, "global steps lost") >= 0
    assert re.search(r"restored from its (snapshot|checkpoint) of step \d+", text), text
    assert figure(text, "tfplan destroy of a running job") > 0
    assert figure(text, "destroy's start -> nothing left") > 0
    assert "| processes left on the worker hosts when destroy returned (all rounds) | 0 |" in text
    assert "Destroy complete! 3 task(s) stopped" in text
    for daemon in ("| master |", "| worker 0 |", "| worker 2 |"):
        assert figure(text, daemon, column=0) >= 0 and figure(text, daemon, column=1) > 0
    assert figure(text, "| executors' JVMs |", column=0) > 0  # RSS
    assert figure(text, "| TensorFlow tasks", column=1) > 0  # RSS
    assert not re.search(r"^\| .* \| nan", text, re.M), text  # every phase was seen


@pytest.mark.slurm
@pytest.mark.netns
@pytest.mark.timeout(300)
def test_slurm_study(tmp_path: Path, slurm_cluster: SlurmTestbed) -> None:
    out = tmp_path / "study.json"
    args = ["--reps", "1", "--only", "allocation", "exit_codes"]
    args += ["--slurm-conf", str(slurm_cluster.conf), "--json", str(out)]
    run_bench("slurm_study.py", *args, cwd=tmp_path, timeout=240, env=slurm_cluster.env())
    facts = json.loads(out.read_text())
    started = re.fullmatch(r"median (\d+) ms \(n=1, .*\)", facts["sbatch -> RUNNING"])
    assert started and int(started.group(1)) > 0, facts
    assert facts["srun rc: task exit 3"].startswith("3 "), facts
    assert slurm_cluster.run("squeue", "-h").stdout.strip() == ""  # nothing left queued


@pytest.mark.timeout(600)
def test_bench_snapshots(tmp_path: Path) -> None:
    """The default side alone (a copy of each ps's snapshot on the next ps's host), on the CTR
    example's split tables: the job trains, its row and the plan's memory line are written."""
    out = tmp_path / "bench_snapshots.md"
    args = ["--repeats", "1", "--steps", "60", "--vocab-scale", "0.001", "--sides", "copies"]
    run_bench("bench_snapshots.py", *args, "--out", str(out), cwd=tmp_path, timeout=480)
    text = out.read_text()
    row = "| own host + copy on the next ps's (default) |"
    assert figure(text, row, column=0) > 0, text  # examples/s
    assert "on its host and on the next ps's host (lifecycle.snapshot_copies)" in text, text


@pytest.mark.netns
@pytest.mark.timeout(900)
def test_bench_host_loss(tmp_path: Path) -> None:
    """One round with the copies (the default): ps/1's host cut off, the re-planned cluster's
    chief brings ps/1 back from the copy of its snapshot on ps/0's host, past the checkpoint."""
    out = tmp_path / "bench_host_loss.md"
    args = ["--repeats", "1", "--sides", "copies", "--fault-at", "300"]
    run_bench("bench_host_loss.py", *args, "--out", str(out), cwd=tmp_path, timeout=840)
    text = out.read_text()
    row = "| a copy on the next ps's host (default) |"
    assert f"{row} 1 | copy |" in text, text
    assert figure(text, row, column=2) >= 0, text  # steps lost (none went back past the cut)
    assert re.search(r"back to [\d,]+ \(copy\): `ps/1 restored from its snapshot of step", text)
