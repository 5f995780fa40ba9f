"""Dynamic tables through ``tfplan apply`` (real ps and worker processes), as a user runs them.

``examples/drift`` is the user's project: a click model whose ``item`` ids are raw int64 values
scattered over [0, 2^63), on a stream whose ids drift (about 2,700 distinct ids here, nine times
the table's 300 rows). ``model.dynamic=[item_embedding]`` makes its Embedding a dynamic table;
nothing else of the model changes. What is checked is read from the job's own files: the
checkpoint (each shard's rows, the id each row holds, when each was last seen), the chief's
eviction records (``dynamic_tables.jsonl``), ``result.json`` and the exported ``model.keras``,
opened with Keras alone and fed raw ids.

The fast tier runs one job (hogwild, two ps): rows evicted while training, never more resident
than the capacity, no id with two rows, no row with two ids, every resident id one of the
stream's; the export serves raw ids. The full tier resumes it (the ids keep their rows, the
index rebuilt from the checkpoint), re-shards it on 3 and 1 ps, trains a windowed algorithm
(downpour) and a synchronous one (sync) on it, trains it under ParameterServerStrategy (pss:
evictions, the export) and kills a ps mid-training (it comes back from its in-memory snapshot
with its share of the table).
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apply_helpers import (
    base_overrides,
    example_with_data,
    free_port_base,
    kill_groups,
    paced,
    recorded_groups,
    tfplan,
    topology,
)
from chaos_helpers import ApplyRun, kill_task

from recipes.checkpoint_names import PlainNames

pytestmark = pytest.mark.cluster

CAPACITY = 300  # rows over both ps: 150 on each
DRIFT = (
    "model._target_=drift.models.build",
    "model.dynamic=[item_embedding]",
    f"model.rows={CAPACITY}",
    "model.ttl_steps=40",
    "data=tfrecord",
    "data.train=data/part-*.tfrecord",
    "data.eval=data/eval.tfrecord",
    "data.label=clicked",
    "data.batch_size=32",
    "model.loss=binary_crossentropy",
    "cluster.ps=2",
)
DATA = ("--examples", "6000", "--parts", "3", "--live", "200")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example_with_data("drift", tmp_path_factory.mktemp("elsewhere") / "project", *DATA)


@pytest.fixture
def project(generated: Path, tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "project"
    shutil.copytree(generated, where)
    yield where
    kill_groups(recorded_groups(where))


def _apply(project: Path, algo: str, steps: int, *extra: str) -> Any:
    proc = tfplan(
        project,
        "apply",
        "--auto-approve",
        *base_overrides(project, free_port_base()),
        *DRIFT,
        f"algo={algo}",
        *topology(algo),
        f"trainer.max_steps={steps}",
        f"trainer.checkpoint_steps={steps}",
        "trainer.log_steps=50",
        *extra,
        timeout=300,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    return proc


@functools.cache
def _stream_ids(data: str) -> frozenset[str]:
    """Every ``item`` id of the stream's training files in the folder ``data`` (read once)."""
    import tensorflow as tf

    stream = set()
    for path in sorted(glob.glob(os.path.join(data, "part-*.tfrecord"))):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
            example = tf.train.Example.FromString(raw)
            stream.add(str(example.features.feature["item"].int64_list.value[0]))
    return frozenset(stream)


def _read(project: Path, keras_file: Path | None = None) -> dict[str, Any]:
    """The final checkpoint's dynamic table (either format, by the plain names:
    recipes/checkpoint_names.py's ``PlainNames``) and the stream's ids; with ``keras_file``, what
    the exported model holds and serves. Read in this process (TensorFlow's reader, Keras):
    a subprocess per read paid TensorFlow's import each time."""
    import numpy as np
    import tensorflow as tf

    name = (project / "out" / "checkpoint").read_text().split('"')[1]
    reader = PlainNames(tf.train.load_checkpoint(str(project / "out" / name)))
    keys, get = reader.get_variable_to_shape_map(), reader.get_tensor
    table = "model/item_embedding/embeddings"
    count = sum(1 for n in keys if n.startswith(f"{table}/shard_") and n.count("/") == 3)
    shards = []
    for i in range(count):
        aux = f"dynamic/item_embedding/embeddings/shard_{i}"
        seen, ids, rows = get(f"{aux}/last_seen"), get(f"{aux}/row_ids"), get(f"{table}/shard_{i}")
        live = np.flatnonzero(seen >= 0)
        shards.append(
            {
                "capacity": int(seen.shape[0]),
                "free_count": int(get(f"{aux}/free_count")),
                "pairs": [[str(int(ids[r])), int(r)] for r in live],
                "rows": {str(int(ids[r])): rows[r].tolist() for r in live},
            }
        )
    out: dict[str, Any] = {
        "step": int(get("global_step")),
        "shards": shards,
        "stream": sorted(_stream_ids(str(project / "data"))),
    }
    if keras_file is not None:
        import keras

        model = keras.saving.load_model(str(keras_file))
        layer = model.get_layer("item_embedding")
        vocab = [str(int(v)) for v in layer.layers[0].get_vocabulary()[1:]]
        weights = layer.layers[1].get_weights()[0]
        known = [int(k) for k in list(shards[0]["rows"])[:3] + list(shards[1]["rows"])[:3]]
        ids = np.array(known + [12345, 67890], np.int64)
        pred = model({"item": ids, "count0": np.zeros(len(ids), np.float32)}).numpy().ravel()
        out["export"] = {
            "vocab": sorted(vocab),
            "zero_row": float(np.abs(weights[0]).max()),
            "rows": {v: weights[i + 1].tolist() for i, v in enumerate(vocab)},
            "pred": pred.tolist(),
        }
    return out


def _check_evictions(project: Path) -> None:
    """Rows freed while training (the stream brings nine times the capacity), never more
    resident on a shard than its half of the capacity: the chief's eviction records."""
    events = [
        json.loads(line)
        for line in (project / "out" / "dynamic_tables.jsonl").read_text().splitlines()
    ]
    assert sum(e["evicted"] for e in events) >= CAPACITY, events[-3:]
    assert all(e["resident"] <= CAPACITY // 2 for e in events), events


def _check_table(got: dict[str, Any]) -> dict[str, int]:
    """No id with two rows, no row with two ids, never over capacity, ids from the stream, no
    row leaked; returns each resident id's row index."""
    where: dict[str, int] = {}
    for shard in got["shards"]:
        rows = [r for _, r in shard["pairs"]]
        assert len(rows) == len(set(rows)), "a row holds two ids"
        assert len(rows) <= shard["capacity"]
        assert shard["free_count"] + len(rows) == shard["capacity"], "a row leaked"
        for ident, row in shard["pairs"]:
            assert ident not in where, f"id {ident} has two rows"
            where[ident] = row
    assert where and set(where) <= set(got["stream"]), "a resident id is not the stream's"
    return where


def test_a_dynamic_table_trains_on_raw_ids_evicts_and_exports_a_model_that_serves_them(
    project: Path,
) -> None:
    proc = _apply(project, "hogwild", 240)
    assert "dynamic: raw int64 ids, capacity 300 rows (150 per ps" in proc.stdout
    result = json.loads((project / "out" / "result.json").read_text())
    assert result["status"] == "succeeded" and result["global_step"] >= 240, result
    _check_evictions(project)
    got = _read(project, project / "out" / "model.keras")
    where = _check_table(got)
    assert [s["capacity"] for s in got["shards"]] == [CAPACITY // 2] * 2
    assert len(got["stream"]) > 5 * CAPACITY
    # the export: a lookup of exactly the resident ids in front of their rows, row 0 zeros
    export = got["export"]
    assert export["vocab"] == sorted(where) and export["zero_row"] == 0.0
    rows = {i: r for shard in got["shards"] for i, r in shard["rows"].items()}
    assert all(export["rows"][i] == rows[i] for i in where)
    # it serves raw ids: known ids give their own outputs, unknown ones the zeros row's
    pred = export["pred"]
    known, unknown = pred[:-2], pred[-2:]  # up to 3 resident ids per shard, then 12345, 67890
    assert len(known) >= 2 and len(set(round(p, 6) for p in known)) > 1, pred
    assert unknown[0] == unknown[1], pred


@pytest.mark.full
def test_a_dynamic_table_resumes_with_its_ids_on_the_same_and_another_number_of_ps(
    project: Path,
) -> None:
    # room for every id of the stream: nothing evicted, every id must come back
    wide = ("model.rows=4000", "model.ttl_steps=100000")

    def vectors(got: dict[str, Any]) -> dict[str, list[float]]:
        return {i: r for shard in got["shards"] for i, r in shard["rows"].items()}

    _apply(project, "hogwild", 120, *wide)
    before = _check_table(_read(project))
    # resumed: the index is rebuilt from the checkpoint, every id keeps its row
    proc = _apply(project, "hogwild", 130, *wide)
    assert "restoring model.ckpt-" in proc.stdout, proc.stdout[-2000:]
    after = _read(project)
    assert after["step"] >= 130
    again = _check_table(after)
    assert set(before) <= set(again), "an id was lost on resume"
    assert all(again[i] == before[i] for i in before), "an id changed rows on resume"
    # resumed on 3 ps, then on 1: every id re-sharded by its hash, with its row
    held = vectors(after)
    for ps, steps in ((3, 132), (1, 134)):
        proc = _apply(project, "hogwild", steps, *wide, f"cluster.ps={ps}")
        assert "re-sharded by their hash" in proc.stdout, proc.stdout[-3000:]
        got = _read(project)
        assert len(got["shards"]) == ps and got["step"] >= steps
        _check_table(got)
        now = vectors(got)
        # every id back, on its new shard; the few a step or two trained changed, no other
        assert set(now) == set(held), "an id was lost"
        same = sum(now[i] == held[i] for i in held)
        assert same >= len(held) - 4 * 32 * 2, (same, len(held))
        held = now


@pytest.mark.full
def test_a_dynamic_table_trains_under_windowed_and_sync_algorithms(project: Path) -> None:
    for algo in ("downpour", "sync"):
        fresh = project.parent / f"{algo}-project"
        shutil.copytree(project, fresh, ignore=shutil.ignore_patterns("out", "work", ".tfplan"))
        try:
            _apply(fresh, algo, 60)
            result = json.loads((fresh / "out" / "result.json").read_text())
            assert result["status"] == "succeeded" and result["algo"] == algo, result
            _check_table(_read(fresh))
        finally:
            kill_groups(recorded_groups(fresh))


@pytest.mark.full
def test_pss_trains_a_dynamic_table_evicts_and_exports_it(project: Path) -> None:
    """ParameterServerStrategy: the coordinator's functions, scheduled on the workers, look ids
    up, allocate rows in each shard's lock on its ps (an id once seen twice: the admission
    counters too); the coordinator's own thread evicts."""
    _apply(project, "pss", 240, "model.min_count=2")
    result = json.loads((project / "out" / "result.json").read_text())
    assert result["status"] == "succeeded" and result["algo"] == "pss", result
    _check_evictions(project)
    got = _read(project, project / "out" / "model.keras")
    where = _check_table(got)
    assert [s["capacity"] for s in got["shards"]] == [CAPACITY // 2] * 2
    export = got["export"]
    assert export["vocab"] == sorted(where) and export["zero_row"] == 0.0
    # (a resume re-sharded on another number of ps, its index rebuilt by the coordinator's
    # first check: tests/test_strategies_units.py, in one process, the same code)


def _refused(project: Path, *overrides: str, command: str = "plan") -> str:
    """The one line ``tfplan plan`` (or apply) refuses ``overrides`` with; nothing started."""
    args = [command, "--auto-approve"] if command == "apply" else [command]
    proc = tfplan(
        project,
        *args,
        *base_overrides(project, free_port_base()),
        *DRIFT,
        "algo=hogwild",
        *overrides,
        timeout=120,
    )
    assert proc.returncode != 0, proc.stdout[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert not recorded_groups(project), "something was started"
    return lines[0]


def test_bad_dynamic_settings_are_one_line_naming_the_key_and_the_fix(project: Path) -> None:
    assert _refused(project, "model.min_count=0") == "error: model.min_count: 0 < 1; use 1 or more"
    assert _refused(project, "model.ttl_steps=0") == (
        "error: model.ttl_steps: 0 < 1; use e.g. 10000"
    )
    assert _refused(project, "algo=allreduce", "cluster.ps=0") == (
        "error: model.dynamic: algo=allreduce cannot train a dynamic table (every worker holds "
        "every table whole: there is no parameter server for the ids); use a parameter-server "
        "algorithm (algo=hogwild, downpour, pss, ...) with cluster.ps >= 1, or drop model.dynamic"
    )
    # a name that is no Embedding of the model (the inspection build finds it)
    assert _refused(project, "model.dynamic=[logit]") == (
        "error: model.dynamic: 'logit' is a Dense, not a keras.layers.Embedding: name one of "
        "the model's Embedding layers (item_embedding)"
    )


FLOAT_IDS = '''
import keras


def build(rows=300):
    """The drift model whose id input was left at Keras' default dtype, float32."""
    item = keras.Input((), name="item")
    count0 = keras.Input((), name="count0")
    embedded = keras.layers.Embedding(rows, 4, name="item_embedding")(item)
    x = keras.layers.Concatenate()([embedded, keras.layers.Reshape((1,))(count0)])
    return keras.Model({"item": item, "count0": count0}, keras.layers.Dense(1)(x))
'''


@pytest.mark.full
def test_float_ids_and_a_capacity_no_host_holds_are_refused(project: Path) -> None:
    (project / "drift" / "float_ids.py").write_text(FLOAT_IDS)
    assert _refused(project, "model._target_=drift.float_ids.build") == (
        "error: model.dynamic: the Embedding 'item_embedding' gets its ids as float32: a dynamic "
        'table takes raw ids as int64 or string: give the keras.Input that feeds it dtype="int64" '
        'or dtype="string" (data.features.item.dtype to match)'
    )
    line = _refused(project, "model.capacity=4000000000", command="apply")
    assert "need(s) at least" in line and "add parameter servers (cluster.ps)" in line, line


RESTORED = r"^worker/0\s+\| ps/0 restored from its (snapshot|checkpoint)"


def _newest_meta(folder: Path) -> dict[str, Any]:
    """What the newest complete ``.meta`` of ps/0's own snapshots says (by number), or {}."""
    metas = []
    for path in folder.glob("tfplan-snapshots-*/ps0/*/snapshot.meta"):
        try:
            metas.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # emptied: a full snapshot being written
    return max(metas, key=lambda m: int(m["generation"]), default={})


FIRST_SNAPSHOT = r"^worker/0\s+\| snapshots: every [\d.]+s, each ps into \S+ on its own host"


@pytest.mark.full
@pytest.mark.timeout(600)
def test_a_killed_ps_comes_back_with_its_share_of_the_table_and_no_id_gets_two_rows(
    project: Path,
) -> None:
    """SIGKILL of a ps mid-training: it comes back from its in-memory snapshot (its shard's rows,
    ids, last-seen steps, free rows: variables like any other), its index rebuilt by the
    maintenance the chief's next check asks for; training goes on allocating, and the final table has no id twice, no row twice, no
    row leaked. 20,000 rows of 64 per shard, far more than the stream's ids take: each ps's
    snapshots are a chain (a full one, then the rows changed: recipes/snapshot_deltas.py; the
    ids, last-seen steps and free rows by blocks), the kill right after a delta was written
    (the next snapshot may have been a full one all the same)."""
    run = ApplyRun(
        project,
        [
            *base_overrides(project, free_port_base()),
            *DRIFT,
            "algo=hogwild",
            "model.rows=40000",
            "model.embed=64",
            "model.ttl_steps=100000",
            "trainer.max_steps=1500",  # far past the kill: the job ends after it, by itself
            *paced(0.02),
            "trainer.log_steps=25",
            "trainer.checkpoint_steps=100000",
            "lifecycle.restart.backoff_secs=0.2",
            "lifecycle.snapshot_secs=0.5",
        ],
    )
    first = run.wait_for(FIRST_SNAPSHOT, 300)
    run.wait_step(150, 300, task="worker/0")
    deadline = time.monotonic() + 300
    while _newest_meta(project / "shm").get("deltas", 0) < 1:  # a delta, named by its .meta
        assert time.monotonic() < deadline and run.proc.poll() is None, run.text()[-3000:]
        time.sleep(0.02)
    before = len(run.lines) - 1
    kill_task(project, "ps/0")
    restored = run.wait_for(RESTORED, 120, before)
    assert "snapshot" in run.lines[restored][1], run.lines[restored][1]
    assert run.finish(timeout=300) == 0, run.text()[-3000:]
    assert first < before < restored
    got = _read(project)
    assert got["step"] >= 1500
    _check_table(got)
