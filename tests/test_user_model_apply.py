"""The user's own Keras model and files through ``tfplan apply``, as a user would do it.

``tests/user_project`` is laid out as a user's project (its own package ``tabular``, importing
nothing of tfplan, and a script that writes TFRecord shards and a CSV table). Each test copies it
to a folder apart from this repository, writes the data with the project's own script, and runs
tfplan there through its CLI only: ``model._target_=tabular.models.build`` plus keyword arguments,
``data=tfrecord`` with relative globs, ``data=csv`` for a regression, ``data._target_`` for a
tf.data factory. tfplan ships the package to the tasks (``<workdir>/_code/tabular``).

The fast tier runs the three representative paths (a windowed TF1 algorithm on TFRecord shards,
the synchronous TF1 one on a CSV regression, a TF2 strategy on the factory); ``--tier=full`` runs
every algorithm on the shards: this is where each of the fourteen runs through apply (its
topology, its result, every task ended; tests/test_algorithms_apply.py runs the built-in model
with sync only). Downpour, allreduce and pss (the export checked) each run as an apply; the
other eleven as the points of two sweeps (by steps), each point a cluster of its own with the
same checks, sharing the sweep's CLI and warm seed (issue 33's budget).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    EXAMPLES,
    alive,
    base_overrides,
    example_with_data,
    free_port_base,
    kill_groups,
    minibatches_per_step,
    recorded_groups,
    seed_ready_line,
    state_of,
    tfplan,
    topology,
)

from tfplan.config.algorithms import ALGORITHMS

PROJECT = EXAMPLES / "tabular"
MINIBATCHES = 60
SHARDS = ("data=tfrecord", "data.train=data/train-*.tfrecord", "data.eval=data/eval.tfrecord")
TABULAR = ("model._target_=tabular.models.build", "model.units=16", "data.batch_size=32")
FAST_TIER = ("downpour",)
# The export and its predict check, per checkpoint format and chief: the TF1 recipes' (downpour),
# the TF2 strategies' (allreduce's eager chief, pss's coordinator). Every other algorithm writes
# the same TF1 checkpoint as downpour, through the same chief; they train with
# trainer.export_model=false to keep the suite in its budget.
# TFPLAN_TEST_EXPORT_EVERY_ALGORITHM=1 checks the export of all fourteen (how the table in
# docs/your_model.md was measured).
EXPORT_CHECKED = (
    tuple(ALGORITHMS)
    if os.environ.get("TFPLAN_TEST_EXPORT_EVERY_ALGORITHM")
    else ("downpour", "allreduce", "pss")
)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's project with its data written by its own script (once per module)."""
    return example_with_data("tabular", tmp_path_factory.mktemp("elsewhere") / "project")


@pytest.fixture
def project(generated: Path, tmp_path: Path) -> Iterator[Path]:
    """A fresh copy of the generated project for one test (its own .tfplan state)."""
    where = tmp_path / "project"
    shutil.copytree(generated, where)
    yield where
    kill_groups(recorded_groups(where))


def _apply(
    project: Path,
    algo: str,
    *overrides: str,
    package: str = "tabular",
    ps: int | None = None,
    steps: int | None = None,
) -> dict[str, object]:
    steps = steps or math.ceil(MINIBATCHES / minibatches_per_step(algo))
    proc = tfplan(
        project,
        "apply",
        "--auto-approve",
        *base_overrides(project, free_port_base()),
        f"algo={algo}",
        *topology(algo),
        f"trainer.max_steps={steps}",
        "trainer.log_steps=20",
        f"trainer.checkpoint_steps={steps}",
        *overrides,
        timeout=240,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    # the algorithm's topology as the registry says it needs (allreduce: no ps; pss: a chief)
    needs = ALGORITHMS[algo]
    n_ps = (1 if needs.needs_ps else 0) if ps is None else ps  # ps: the cluster.ps asked
    assert f"Apply complete! Tasks: {2 + n_ps + int(needs.chief)} started" in proc.stdout
    result: dict[str, object] = json.loads((project / "out" / "result.json").read_text())
    assert result["status"] == "succeeded" and result["algo"] == algo, result
    assert int(result["global_step"]) >= steps  # type: ignore[call-overload]
    assert result["replicas"] == 2 and result["ps"] == n_ps, result
    state = state_of(project)
    statuses = {t["name"]: t["status"] for t in state["tasks"]}
    assert statuses["chief/0" if needs.chief else "worker/0"] == "succeeded", statuses
    assert set(statuses.values()) <= {"succeeded", "stopped"}, statuses
    assert not [t["name"] for t in state["tasks"] if alive(int(t["handle"]["pid"]))]
    # the package went to the tasks beside the recipes, as the user wrote it
    shipped = project / "work" / "_code" / package / "models.py"
    assert shipped.read_text() == (project / package / "models.py").read_text()
    # the user's Keras model: the warm seed imported TensorFlow with Keras 3 for its tasks
    assert seed_ready_line(project).endswith("(tensorflow imported)")
    return result


def _checkpoint_shapes(
    project: Path, result: dict[str, object], out: Path | None = None
) -> dict[str, list[int]]:
    """The variables stored in the final checkpoint and their shapes (TF's own reader, in this
    process: a subprocess per test paid TensorFlow's import each time)."""
    import tensorflow as tf

    folder = out or project / "out"
    reader = tf.train.load_checkpoint(str(folder / str(result["checkpoint"])))
    shapes = reader.get_variable_to_shape_map().items()
    return {name.split("/.ATTRIBUTES")[0]: list(shape) for name, shape in shapes}


def _checkpoint_names(project: Path, result: dict[str, object]) -> set[str]:
    return set(_checkpoint_shapes(project, result))


# Loads the chief's model.keras where neither tfplan nor the recipes can be imported (the
# user's project folder on sys.path, as Keras needs for custom objects), and scores it with
# Keras' predict as recipes/objective.py scores a classification: argmax == label, over every
# held-out example the chief scored (data.eval, all of it: fewer than data.eval_examples).
_PREDICT = """
import importlib.abc, json, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tfplan", "recipes"):
            raise ImportError(f"{name}: the model must load without tfplan and the recipes")
        return None
sys.meta_path.insert(0, Refuse())
sys.path.insert(0, sys.argv[1])
import keras, numpy as np, tensorflow as tf
model = keras.saving.load_model(sys.argv[2])
spec = {
    "num": tf.io.FixedLenFeature([4], tf.float32),
    "cat": tf.io.FixedLenFeature([], tf.int64),
    "label": tf.io.FixedLenFeature([], tf.int64),
}
batch = next(iter(tf.data.TFRecordDataset(sys.argv[3]).batch(1 << 20)))
rows = {k: v.numpy() for k, v in tf.io.parse_example(batch, spec).items()}
label = rows.pop("label")
outputs = model.predict(rows, batch_size=256, verbose=0)
print(json.dumps({"examples": len(label), "accuracy": float(np.mean(outputs.argmax(-1) == label))}))
"""


def _predicted_accuracy(project: Path) -> float:
    """The accuracy of ``out/model.keras`` on the held-out file, by Keras alone (one
    subprocess)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _PREDICT,
            str(project),
            str(project / "out" / "model.keras"),
            str(project / "data" / "eval.tfrecord"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=project,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    scored = json.loads(proc.stdout.strip().splitlines()[-1])
    assert scored["examples"] == 1000  # examples/tabular/make_data.py's eval file, every record
    return float(scored["accuracy"])


def _swept_together(algo: str) -> bool:
    """The full tier's other algorithms train in sweeps (one per number of steps): those of
    the default topology whose export is not checked (each point is its own cluster, as an apply
    makes it; the sweep's one CLI and one warm seed are what its points share)."""
    return algo not in FAST_TIER and algo not in EXPORT_CHECKED and not topology(algo)


def _steps(algo: str) -> int:
    return math.ceil(MINIBATCHES / minibatches_per_step(algo))


# steps -> the algorithms swept with that trainer.max_steps (sagn's 15 trained to 30: one sweep
# the fewer, its check the same)
SWEEPS: dict[int, list[str]] = {}
for _algo in ALGORITHMS:
    if _swept_together(_algo):
        SWEEPS.setdefault(max(30, _steps(_algo)), []).append(_algo)


@pytest.mark.cluster
@pytest.mark.parametrize(
    "algo",
    [
        pytest.param(a, marks=() if a in FAST_TIER else pytest.mark.full)
        for a in ALGORITHMS
        if not _swept_together(a)
    ],
)
def test_the_users_keras_model_trains_on_tfrecord_shards(algo: str, project: Path) -> None:
    export = algo in EXPORT_CHECKED
    result = _apply(project, algo, *TABULAR, *SHARDS, f"trainer.export_model={str(export).lower()}")
    assert 0.0 < float(result["accuracy"]) <= 1.0  # type: ignore[arg-type]
    assert math.isfinite(float(result["eval_loss"]))  # type: ignore[arg-type]
    # the user's layers (named in their code) are what was trained and checkpointed
    names = _checkpoint_names(project, result)
    # two tables (the category's embedding and its per-class bias), through every algorithm
    tables = {"model/cat_embedding/embeddings", "model/cat_bias/embeddings"}
    assert {"model/hidden/kernel", "model/logits/bias", *tables} <= names
    run_yaml = (project / "work" / "worker-0" / "run.yaml").read_text()
    assert "_target_: tabular.models.build" in run_yaml and "units: 16" in run_yaml
    assert f"{project}/data/train-*.tfrecord" in run_yaml  # made absolute at plan time
    if not export:
        assert not (project / "out" / "model.keras").exists()  # trainer.export_model=false
        return
    # the trained model back: the chief wrote it from the final checkpoint, Keras alone loads
    # it, and its predictions score exactly what result.json says
    logs = "".join(p.read_text() for p in (project / "work").glob("*/task.log"))
    assert f"exported the trained model to {project / 'out' / 'model.keras'}" in logs, logs[-3000:]
    accuracy = _predicted_accuracy(project)
    print(f"{algo}: predict accuracy {accuracy:.6f}, result.json {result['accuracy']}")
    assert abs(accuracy - float(result["accuracy"])) <= 1e-6, (accuracy, result)  # type: ignore[arg-type]


@pytest.mark.cluster
@pytest.mark.full
@pytest.mark.timeout(900)
@pytest.mark.parametrize("steps", sorted(SWEEPS), ids=lambda n: f"{n}-steps")
def test_every_other_algorithm_trains_the_users_keras_model_in_one_sweep(
    steps: int, project: Path
) -> None:
    """What the test above checks of one algorithm, for every point of a sweep over the
    algorithms that take ``steps`` global steps for MINIBATCHES minibatches: each point is a
    cluster of its own (its experiment ``s-<n>``, its output ``out/<n>``, its workdir
    ``work/<n>``), forked from the sweep's one warm seed."""
    algos = SWEEPS[steps]
    proc = tfplan(
        project,
        "apply",
        "-m",
        "--auto-approve",
        *base_overrides(project, free_port_base(20 * len(algos)), experiment="s"),
        f"algo={','.join(algos)}",
        f"trainer.max_steps={steps}",
        "trainer.log_steps=20",
        f"trainer.checkpoint_steps={steps}",
        *TABULAR,
        *SHARDS,
        "trainer.export_model=false",
        timeout=840,
    )
    assert f"Sweep complete! {len(algos)} succeeded, 0 failed." in proc.stdout, (
        f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    )
    # the user's Keras model: the sweep's seed imported TensorFlow with Keras 3 for every point
    assert re.search(
        r"warm seed on localhost ready in [\d.]+s \(pid \d+\): tasks fork", proc.stdout
    )
    for num, algo in enumerate(algos):
        point = project / "out" / str(num)
        result = json.loads((point / "result.json").read_text())
        assert result["status"] == "succeeded" and result["algo"] == algo, result
        assert int(result["global_step"]) >= steps, result
        assert result["replicas"] == 2 and result["ps"] == 1, result
        assert 0.0 < float(result["accuracy"]) <= 1.0 and math.isfinite(result["eval_loss"])
        state = state_of(project, f"s-{num}")
        statuses = {t["name"]: t["status"] for t in state["tasks"]}
        assert statuses["worker/0"] == "succeeded", (algo, statuses)
        assert set(statuses.values()) <= {"succeeded", "stopped"}, (algo, statuses)
        assert not [t["name"] for t in state["tasks"] if alive(int(t["handle"]["pid"]))]
        work = project / "work" / str(num)
        shipped = work / "_code" / "tabular" / "models.py"
        assert shipped.read_text() == (project / "tabular" / "models.py").read_text()
        names = set(_checkpoint_shapes(project, result, point))
        tables = {"model/cat_embedding/embeddings", "model/cat_bias/embeddings"}
        assert {"model/hidden/kernel", "model/logits/bias", *tables} <= names, (algo, names)
        run_yaml = (work / "worker-0" / "run.yaml").read_text()
        assert "_target_: tabular.models.build" in run_yaml and "units: 16" in run_yaml
        assert f"{project}/data/train-*.tfrecord" in run_yaml  # made absolute at plan time
        assert not (point / "model.keras").exists()  # trainer.export_model=false


@pytest.mark.cluster
@pytest.mark.full  # the CSV reader and sync each run end to end in the fast tier elsewhere
def test_a_regression_on_a_csv_table_trains_with_sync(project: Path) -> None:
    """data=csv (the header names the columns, every column but the label is a feature),
    model.loss=mse and model.metrics=[mae]: a regression, not a classification."""
    result = _apply(
        project,
        "sync",
        "model._target_=tabular.models.regressor",
        "data=csv",
        "data.train=data/table.csv",
        "data.label=y",
        "data.eval_examples=500",
        "model.loss=mse",
        "model.metrics=[mae]",
        "algo.lr=0.05",
    )
    assert "accuracy" not in result
    # y has a variance of about 5.3: a model that learnt nothing has an mse near that
    assert float(result["eval_loss"]) < 2.0, result  # type: ignore[arg-type]
    assert 0.0 < float(result["mae"]) < 1.2, result  # type: ignore[arg-type]


@pytest.mark.cluster
@pytest.mark.full  # factories are unit-tested in the fast tier, allreduce runs there too
def test_a_tf_data_factory_feeds_allreduce(project: Path) -> None:
    """data._target_: the user's function returns the tf.data.Dataset of each shard."""
    result = _apply(project, "allreduce", *TABULAR, "data._target_=tabular.data.make")
    assert 0.0 < float(result["accuracy"]) <= 1.0  # type: ignore[arg-type]
    names = _checkpoint_names(project, result)
    assert "model/hidden/kernel" in names and "model/cat_embedding/embeddings" in names


def test_bad_input_is_one_line_at_plan_time_and_starts_nothing(project: Path) -> None:
    cases = {
        "model._target_=nosuch.models.build": "model._target_: no package 'nosuch'",
        "data.train=nodata/*.tfrecord": "data.train='",
        "model.loss=cosine": "model.loss: unknown loss 'cosine'",
        "model.metrics=[accuracy]": "",  # fine for a classification loss
    }
    for override, expected in cases.items():
        args = [*TABULAR, *SHARDS, override]
        proc = tfplan(project, "plan", *base_overrides(project, free_port_base()), *args)
        if not expected:
            assert proc.returncode == 0, proc.stderr
            continue
        assert proc.returncode != 0, (override, proc.stdout)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (override, proc.stderr)
    regression = [*TABULAR, *SHARDS, "model.loss=mse"]
    proc = tfplan(project, "plan", *base_overrides(project, free_port_base()), *regression)
    assert "model.metrics: accuracy needs a classification loss" in proc.stderr
    assert not (project / "work").exists()  # nothing staged, nothing started


@pytest.mark.cluster
# the fast tier: the split in-process (test_recipes_keras_model), rows read from real ps
# (test_sparse_lookup), the plan (test_plan_tables)
@pytest.mark.full
@pytest.mark.parametrize("algo", ["hogwild", "downpour"])
def test_a_large_embedding_is_split_over_two_parameter_servers(tmp_path: Path, algo: str) -> None:
    """examples/wide_deep: the 50,000 x 16 table over model.partition_bytes is split by rows,
    one part per ps; the plan shows each part's ps, the chief reports the same split as
    placed, and the checkpoint holds the table once (the parts are its slices). A step moves only the batch's rows: the traffic
    a worker measured with TensorFlow's step statistics (trainer.trace_step) is within the
    plan's bound for the tables' rows at this batch plus the dense variables (hogwild), or the
    rows alone (downpour's traced step is a local step of its window: the dense layers are the
    worker's copy, the tables are not), far below the tables themselves."""
    project = example_with_data("wide_deep", tmp_path / "wide_deep", "4000")
    args = (
        "model._target_=wide_deep.models.build",
        "model.partition_bytes=1000000",
        "data=tfrecord",
        "data.train=data/train-*.tfrecord",
        "data.eval=data/eval.tfrecord",
        "data.label=clicked",
        "model.loss=binary_crossentropy",
        "cluster.ps=2",
        "data.batch_size=32",
        "trainer.trace_step=2",
        # downpour's chief exports the 3.3 MiB model as parts (issue 35 item 5); hogwild joins it
        *(["trainer.export_join_bytes=1000000"] if algo == "downpour" else []),
    )
    try:
        plan = tfplan(project, "plan", *base_overrides(project, free_port_base()), *args)
        assert plan.returncode == 0, plan.stderr
        sharding = json.loads((project / ".tfplan" / "plan.json").read_text())["sharding"]
        parts = [ln.split() for ln in plan.stdout.splitlines() if "/part_" in ln]
        assert [p[0] for p in parts] == [
            "model/item_embedding/embeddings/part_0",
            "model/item_embedding/embeddings/part_1",
        ]
        assert {p[1] for p in parts} == {"25000x16"} and {p[-1] for p in parts} == {"ps/0", "ps/1"}
        result = _apply(project, algo, *args, package="wide_deep", ps=2)
        log = (project / "work" / "worker-0" / "task.log").read_text()
        placed = re.search(
            r"model variables: 9 \(3\.3 MiB\) on ps/0 ([\d.]+) MiB, ps/1 ([\d.]+) MiB", log
        )
        assert placed and min(float(placed[1]), float(placed[2])) >= 1.5, log[-2000:]
        # one logical table in the checkpoint, its parts written as slices of it
        shapes = _checkpoint_shapes(project, result)
        assert shapes["model/item_embedding/embeddings"] == [50000, 16], shapes
        assert not [n for n in shapes if "/part_" in n], shapes
        _assert_only_rows_moved(sharding, project / "work", dense_moves=algo == "hogwild")
        out, chief_log = project / "out", (project / "work" / "worker-0" / "task.log").read_text()
        if algo == "hogwild":
            assert (out / "model.keras").is_file() and not (out / "model.parts").exists()
        else:
            assert f"exported the trained model as parts to {out / 'model.parts'}" in chief_log
            assert not (out / "model.keras").exists()
            manifest = json.loads((out / "model.parts" / "model.json").read_text())
            table = next(w for w in manifest["weights"] if w["path"] == "item_embedding/embeddings")
            assert table["shape"] == [50000, 16] and table["files"][-1]["rows"][1] == 50000
    finally:
        kill_groups(recorded_groups(project))


@pytest.mark.cluster
def test_a_split_model_resumes_on_another_number_of_parameter_servers(
    project: Path, request: pytest.FixtureRequest
) -> None:
    """Every variable over model.partition_bytes is split into one part per ps (the tables,
    the kernels, and adagrad's slot of each); the checkpoint holds each once, in slices, so the
    experiment trained on 2 ps resumes with 1: the resume trains a step at algo.lr=1e-30 (the
    weights stay as restored) and scores the held-out file exactly as the checkpoint of 2 ps
    did. (2 -> 3 -> 1 ps on the CTR example's 26 split tables, the same assertions:
    test_bench_smoke's bench_reshard; pss's object checkpoint: test_strategies_units, 2 parts
    into 3 and 1; no model.keras here: the export is tested on its own.)"""
    split = (
        *TABULAR,
        *SHARDS,
        "model.partition_bytes=100",
        "algo.optimizer=adagrad",
        "trainer.export_model=false",
    )
    first = _apply(project, "hogwild", *split, "cluster.ps=2", ps=2)
    step = int(first["global_step"])  # type: ignore[call-overload]
    shapes = _checkpoint_shapes(project, first)
    assert shapes["model/cat_embedding/embeddings"] == [10, 4], shapes
    assert shapes["model/hidden/kernel"] == [8, 16], shapes
    # its adagrad slot: one tensor too, under the name it has unsplit (the Keras op name)
    assert shapes["hidden/kernel/Adagrad"] == [8, 16], shapes
    assert not [n for n in shapes if "/part_" in n], shapes  # never the parts' own names
    full = request.config.getoption("--tier") == "full"
    for n_ps in (1,):
        again = _apply(
            project,
            "hogwild",
            *split,
            f"cluster.ps={n_ps}",
            "algo.lr=1e-30",
            ps=n_ps,
            steps=step + 1,
        )
        log = (project / "work" / "worker-0" / "task.log").read_text()  # the chief's
        assert f"restoring model.ckpt-{step}" in log, log[-3000:]
        # one step more (each of the two asynchronous workers may take its own)
        assert step < int(again["global_step"]) <= step + 2, again  # type: ignore[call-overload]
        step = int(again["global_step"])  # type: ignore[call-overload]
        for score in ("accuracy", "eval_loss"):
            assert abs(float(again[score]) - float(first[score])) <= 1e-6, (n_ps, again, first)  # type: ignore[arg-type]
    # a table of other rows than the checkpoint's is not a re-shard. A model.* key changed is
    # refused before anything starts (the experiment's record); the user's code changed under
    # the same keys is found by the chief's restore, explained with the variable, both shapes
    # and the fix (checkpoint-shape). --tier=full: the fast tier has the explanation from
    # TensorFlow's own words (test_diagnosis) and the refusal of a changed model through apply
    # (test_experiments::test_checkpoints_of_another_model_are_refused)
    if not full:
        return
    models = project / "tabular" / "models.py"
    models.write_text(models.read_text().replace("vocab=10", "vocab=12"))
    refused = tfplan(
        project,
        "apply",
        "--auto-approve",
        *base_overrides(project, free_port_base()),
        "algo=hogwild",
        *topology("hogwild"),
        f"trainer.max_steps={step + 1}",
        *split,
        "cluster.ps=2",
        timeout=240,
    )
    said = [ln for ln in refused.stdout.splitlines() if "worker/0 failed: " in ln]
    assert refused.returncode != 0 and said, refused.stdout[-3000:]
    # the table or its adagrad slot, whichever the restore reads first
    shapes_said = (
        r"hold (model/)?cat_(embedding|bias)/embeddings(/Adagrad)? as \[10,[34]\], but the "
        r"model's is \[12,"
    )
    assert re.search(shapes_said, said[-1]), said[-1]
    assert not [t["name"] for t in state_of(project)["tasks"] if alive(int(t["handle"]["pid"]))]


def _assert_only_rows_moved(sharding: dict[str, Any], work: Path, dense_moves: bool) -> None:
    """A worker's traced step received and sent every dense variable (``dense_moves``: else
    none) plus at most the plan's bound for the tables' rows (batch x ids per example rows of
    4 x width bytes plus an 8-byte id, per table), with 10 %."""
    tables = sharding["tables"]
    assert {t["name"] for t in tables} == {
        "model/item_embedding/embeddings",
        "model/item_wide/embeddings",
    }
    rows_bound = sum(t["read_bytes_per_step"] for t in tables)
    assert rows_bound == 32 * (16 * 4 + 8) + 32 * (1 * 4 + 8)  # the batch's rows at most

    def in_a_table(name: str) -> bool:
        return any(name == t["name"] or name.startswith(t["name"] + "/part_") for t in tables)

    dense_bytes = sum(v["bytes"] for v in sharding["variables"] if not in_a_table(v["name"]))
    dense = dense_bytes if dense_moves else 0
    whole = sum(t["bytes"] for t in tables)
    traced = [
        m
        for log in sorted(work.glob("worker-*/task.log"))
        for m in re.finditer(
            r"traffic of its step \d+ \(TensorFlow's step statistics\): received ([\d,]+) B "
            r"from the ps, sent ([\d,]+) B to them",
            log.read_text(),
        )
    ]
    assert traced, "no worker logged its traced step"
    for m in traced:
        received, sent = (int(m[i].replace(",", "")) for i in (1, 2))
        # the dense variables move whole each way (read, then their gradients), or not at all
        # (a local step): what is left is the tables' rows, at most the batch's (+256 B for the
        # run's own small tensors)
        assert 0 < received - dense <= 1.1 * rows_bound + 256, (received, rows_bound, dense)
        assert 0 < sent - dense <= 1.1 * rows_bound + 256, (sent, rows_bound, dense)
        assert received < whole / 50
