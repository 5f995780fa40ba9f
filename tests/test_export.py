"""The trained model back (recipes/export.py, tfplan/engine/model_export.py): a checkpoint's
weights in the user's Keras model, saved as ``.keras``.

No cluster: checkpoints are written here with the recipes' own naming, in both formats (the TF1
recipes' name-based ones through a ``Saver`` in a private graph, as the evaluator reads them;
the TF2 strategies' object ones through ``recipes.strategies.checkpoints.Checkpoints``), a
variable split over parameter servers stored as its parts. The user's package (a functional
model with a batch norm, a subclassed model with a registered custom layer, a ``Lambda``) is
written to a folder of its own and put on ``sys.path``, as a user's would be importable.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import yaml

from recipes.checkpoint_names import model_name
from recipes.config import AlgoConf, DataConf, ModelConf, RunConfig, TrainerConf, load_run_config
from recipes.errors import ConfigError
from recipes.export import export_final, export_model, final_model_path, finish_export, start_export
from recipes.export import main as export_main
from recipes.strategies.checkpoints import Checkpoints
from recipes.workload import Workload
from tfplan.cli.main import main as tfplan_main
from tfplan.engine.store import StateStore
from tfplan.planning.state import State, TaskRecord, TaskStatus

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "exportcase"  # the user's package: no other test imports a package of this name
MODELS = textwrap.dedent(
    '''
    """A user's models: nothing of tfplan."""
    import keras


    def build(units=8, classes=10):
        x = keras.Input((64,), name="x")
        h = keras.layers.Dense(units, activation="relu", name="hidden")(x)
        h = keras.layers.BatchNormalization(name="norm")(h)
        return keras.Model(x, keras.layers.Dense(classes, name="logits")(h))


    @keras.saving.register_keras_serializable(package="exportcase")
    class Scale(keras.layers.Layer):
        """A custom layer with a weight of its own."""

        def __init__(self, factor=2.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def build(self, shape):
            self.gain = self.add_weight(shape=(shape[-1],), initializer="ones", name="gain")

        def call(self, x):
            return x * self.gain * self.factor

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}


    @keras.saving.register_keras_serializable(package="exportcase")
    class Net(keras.Model):
        """Subclassed: no keras.Input, built on the data's shape; dropout keeps a seed."""

        def __init__(self, units=6, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.hidden = keras.layers.Dense(units)
            self.scale = Scale(3.0)
            self.norm = keras.layers.BatchNormalization()
            self.drop = keras.layers.Dropout(0.1)
            self.out = keras.layers.Dense(10)

        def call(self, x, training=False):
            h = self.norm(self.scale(self.hidden(x)), training=training)
            return self.out(self.drop(h, training=training))

        def get_config(self):
            return {**super().get_config(), "units": self.units}


    def net(units=6):
        return Net(units)


    def tabled(rows=1000, dim=4):
        ids = keras.Input((2,), dtype="int64", name="ids")
        h = keras.layers.Embedding(rows, dim, name="table")(ids)
        h = keras.layers.Flatten(name="flat")(h)
        return keras.Model(ids, keras.layers.Dense(3, name="out")(h))


    def doubled(units=4):
        return keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(units, name="first"),
                keras.layers.Lambda(lambda t: t * 2.0, name="twice"),
                keras.layers.Dense(10, name="last"),
            ]
        )
    '''
)


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The user's project folder, on ``sys.path`` (where Keras finds the custom classes)."""
    where = tmp_path_factory.mktemp("user_project")
    (where / PACKAGE).mkdir()
    (where / PACKAGE / "__init__.py").write_text("")
    (where / PACKAGE / "models.py").write_text(MODELS)
    sys.path.insert(0, str(where))
    yield where
    sys.path.remove(str(where))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        del sys.modules[name]


def _cfg(out: Path, factory: str, **kwargs: Any) -> RunConfig:
    model = ModelConf(target=f"{PACKAGE}.models.{factory}", kwargs=kwargs)
    return RunConfig(str(out), AlgoConf("allreduce"), model, DataConf(), TrainerConf())


def _trained(cfg: RunConfig, seed: int = 1) -> tuple[dict[str, np.ndarray], list[str], set[str]]:
    """New values for every weight the checkpoints hold (as training would leave them), by
    path; the paths of ``model.weights`` in their order; the trainable ones."""
    model = Workload.of(cfg).model.template()
    rng = np.random.RandomState(seed)
    values = {}
    for w in [*model.trainable_variables, *model.non_trainable_variables]:
        shape = tuple(int(d) for d in w.shape)
        dtype = np.dtype(tf.as_dtype(w.dtype).as_numpy_dtype)
        if dtype.kind == "f":
            values[w.path] = rng.standard_normal(shape).astype(dtype)
        else:
            values[w.path] = rng.randint(0, 1000, size=shape).astype(dtype)
    trainable = {w.path for w in model.trainable_variables}
    return values, [w.path for w in model.weights], trainable


def _split(values: dict[str, np.ndarray], path: str, parts: int) -> dict[str, np.ndarray]:
    """``path`` stored as ``parts`` row ranges, as keras_model splits it over parameter servers."""
    rows = values[path].shape[0]
    bounds = [rows * i // parts for i in range(parts + 1)]
    stored = {k: v for k, v in values.items() if k != path}
    for i in range(parts):
        stored[f"{path}/part_{i}"] = values[path][bounds[i] : bounds[i + 1]]
    return stored


def _write_tf1(folder: Path, stored: dict[str, np.ndarray], step: int) -> str:
    """A name-based checkpoint as the TF1 recipes write it: ``model/<name>``, ``global_step``
    (a private graph, as the evaluator's scorer builds one in an eager process)."""
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        gs = v1.Variable(step, dtype=tf.int64, name="global_step")
        names = {
            model_name(k): v1.Variable(v, name=f"v{i}") for i, (k, v) in enumerate(stored.items())
        }
        saver = v1.train.Saver(var_list={"global_step": gs, **names})
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            return str(saver.save(sess, str(folder / "model.ckpt"), global_step=step))


def _write_tf2(folder: Path, stored: dict[str, np.ndarray], step: int, trainable: set[str]) -> str:
    """An object checkpoint as the TF2 strategies write it (their own writer)."""
    params = {k: tf.Variable(v) for k, v in stored.items() if k.split("/part_")[0] in trainable}
    state = {k: tf.Variable(v) for k, v in stored.items() if k not in params}
    gs = tf.Variable(step, dtype=tf.int64)
    return Checkpoints(str(folder), gs, params, {}, state=state).write(step)


def _names(ckpt: str) -> set[str]:
    keys = tf.train.load_checkpoint(ckpt).get_variable_to_shape_map()
    return {k.split("/.ATTRIBUTES")[0] for k in keys}


def _same_weights(loaded: Any, values: dict[str, np.ndarray], order: list[str]) -> None:
    """The loaded model's weights are exactly ``values`` (``model.weights``' order: a loaded
    subclassed model's layers may be named by Keras' counter afresh)."""
    assert len(loaded.weights) == len(order)
    for weight, path in zip(loaded.weights, order, strict=True):
        np.testing.assert_array_equal(np.asarray(weight.numpy()), values[path], err_msg=path)


def _load(path: str, **kwargs: Any) -> Any:
    import keras

    return keras.saving.load_model(path, **kwargs)


@pytest.mark.parametrize("fmt", ["tf1", "tf2"])
def test_both_formats_and_a_partitioned_variable_round_trip_to_identical_weights(
    fmt: str, code_dir: Path, tmp_path: Path
) -> None:
    cfg = _cfg(tmp_path, "build", units=16)
    values, order, trainable = _trained(cfg)
    assert "norm/moving_mean" in values  # the non-trainable state is exported too
    stored = _split(values, "hidden/kernel", 3)  # 64 rows over 3 ps: 21, 21, 22
    if fmt == "tf1":
        ckpt = _write_tf1(tmp_path, stored, 60)
    else:
        ckpt = _write_tf2(tmp_path, stored, 60, trainable)
    names = _names(ckpt)
    if fmt == "tf1":  # parts under their own names, as TF1 checkpoints before slices held them
        assert "model/hidden/kernel/part_2" in names and "model/hidden/kernel" not in names
    else:  # the strategies' writer stores the parts as slices of one tensor
        assert "model/hidden/kernel" in names and "model/hidden/kernel/part_2" not in names
    out = export_model(cfg, ckpt, str(tmp_path / "model.keras"))
    _same_weights(_load(out), values, order)
    # a folder stands for its latest checkpoint; nothing half-written is left beside
    export_model(cfg, str(tmp_path), str(tmp_path / "again.keras"))
    _same_weights(_load(str(tmp_path / "again.keras")), values, order)
    assert not list(tmp_path.glob(".*.tmp.*"))


def test_a_subclassed_model_with_a_custom_layer_exports_and_loads(
    code_dir: Path, tmp_path: Path
) -> None:
    """No keras.Input: built on a batch shaped as the data's features, as the tasks build it;
    the custom layer's weight and the dropout's seed (state) are in the checkpoint."""
    cfg = _cfg(tmp_path, "net", units=5)
    values, order, trainable = _trained(cfg)
    assert any(p.endswith("scale/gain") for p in values)
    ckpt = _write_tf2(tmp_path, values, 7, trainable)
    out = export_model(cfg, ckpt, str(tmp_path / "net.keras"))
    loaded = _load(out)  # the package is importable: its classes are registered
    assert type(loaded).__name__ == "Net" and loaded.units == 5
    _same_weights(loaded, values, order)
    x = np.random.RandomState(0).standard_normal((3, 64)).astype(np.float32)
    assert loaded.predict(x, verbose=0).shape == (3, 10)


def test_a_lambda_layer_loads_with_safe_mode_off(code_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "doubled")
    values, order, _ = _trained(cfg)
    ckpt = _write_tf1(tmp_path, values, 3)
    out = export_model(cfg, ckpt, str(tmp_path / "doubled.keras"))
    with pytest.raises(ValueError, match="safe_mode=False"):
        _load(out)
    loaded = _load(out, safe_mode=False)
    _same_weights(loaded, values, order)
    x = np.ones((2, 64), np.float32)
    w1, b1, w2, b2 = (values[p] for p in order)  # sequential/first/kernel, ...
    want = (x @ w1 + b1) * 2.0 @ w2 + b2
    np.testing.assert_allclose(loaded.predict(x, verbose=0), want, rtol=1e-5, atol=1e-5)


def test_a_weight_missing_or_of_another_shape_is_one_line(code_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "build", units=16)
    values, _, trainable = _trained(cfg)
    ckpt = _write_tf2(
        tmp_path, {k: v for k, v in values.items() if k != "logits/bias"}, 5, trainable
    )
    with pytest.raises(ConfigError) as missing:
        export_model(cfg, ckpt, str(tmp_path / "m.keras"))
    assert f"checkpoint {ckpt} holds no model/logits/bias" in str(missing.value)
    assert "run.yaml of the run that wrote it" in str(missing.value)
    ckpt = _write_tf1(tmp_path, values, 6)
    with pytest.raises(ConfigError) as shape:
        export_model(_cfg(tmp_path, "build", units=8), ckpt, str(tmp_path / "m.keras"))
    assert "holds model/hidden/kernel as [64, 16], but this model's is [64, 8]" in str(shape.value)
    for error in (missing.value, shape.value):
        assert "\n" not in str(error)
    assert not (tmp_path / "m.keras").exists()


def test_a_failed_export_at_the_end_of_training_is_one_warning_line(
    code_dir: Path, tmp_path: Path
) -> None:
    """The chiefs' end of training: a failed export (in-process for the TF2 strategies, a
    subprocess for the TF1 chief) is a warning naming the retry, never an exception."""
    cfg = _cfg(tmp_path, "build", units=16)
    values, _, trainable = _trained(cfg)
    ckpt = _write_tf2(
        tmp_path, {k: v for k, v in values.items() if k != "logits/bias"}, 5, trainable
    )
    lines: list[str] = []
    export_final(cfg, ckpt, lines.append)
    assert len(lines) == 1 and lines[0].startswith(
        f"warning: the trained model was not exported to {tmp_path / 'model.keras'}: checkpoint"
    ), lines
    assert lines[0].endswith("(tfplan export model -e default retries)")
    failing = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.exit('error: checkpoint x holds no y: fix it')"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    finish_export(failing, cfg, ckpt, lines.append)
    assert lines[1].startswith("warning: the trained model was not exported to ")
    assert ": checkpoint x holds no y: fix it; the checkpoints are intact" in lines[1], lines
    _write_tf2(tmp_path, values, 6, trainable)
    export_final(cfg, str(tmp_path / "model.ckpt-6"), lines.append)
    assert lines[2] == (
        f"exported the trained model to {tmp_path / 'model.keras'} "
        "(keras.saving.load_model opens it)"
    )
    assert final_model_path(_cfg(tmp_path, "build")) == str(tmp_path / "model.keras")
    switched_off = dataclasses.replace(
        _cfg(tmp_path, "build"), trainer=TrainerConf(export_model=False)
    )
    assert final_model_path(switched_off) is None  # trainer.export_model=false: no export
    builtin = RunConfig(str(tmp_path), AlgoConf("sync"), ModelConf(), DataConf(), TrainerConf())
    assert final_model_path(builtin) is None
    assert start_export(builtin, "run.yaml", lines.append) is None and len(lines) == 3


# What a TF1 chief does with its exporter (recipes/train.py), in a fresh interpreter: TensorFlow
# imported, eager and its runtime not started, one thread, so the exporter is forked from it.
FORKING_CHIEF = textwrap.dedent(
    """
    import json, os, sys
    import tensorflow as tf
    from recipes.config import load_run_config
    from recipes.export import ForkedExporter, finish_export, start_export

    run_yaml, checkpoint = sys.argv[1:]
    cfg = load_run_config(run_yaml)
    lines = []
    ended = start_export(cfg, run_yaml, lines.append)  # the chief dies before its checkpoint
    assert isinstance(ended, ForkedExporter), ended
    _, err = ended.communicate("", timeout=240)
    made = os.path.exists(os.path.join(cfg.output_dir, "model.keras"))
    forked = start_export(cfg, run_yaml, lines.append)
    tf.compat.v1.disable_eager_execution()  # the chief goes on in graph mode; the child is eager
    finish_export(forked, cfg, checkpoint, lines.append)
    print(json.dumps({"ended": [ended.returncode, err, made], "lines": lines}))
    """
)


def test_a_chiefs_exporter_builds_first_then_writes_or_ends_with_the_chief(
    code_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TF1 chief's exporter starts with the chief (the build overlaps training) and waits
    for the final checkpoint on stdin: given one it writes model.keras; when the chief ends
    first (its stdin closes) it ends without writing. Forked from the chief where that is safe
    (just after the chief's TensorFlow import), a subprocess otherwise (this pytest process: its
    TensorFlow runtime is started, and pytest-xdist runs threads)."""
    cfg = _cfg(tmp_path, "build", units=16)
    values, order, trainable = _trained(cfg)
    ckpt = _write_tf2(tmp_path, values, 7, trainable)
    run_yaml = _run_yaml(
        tmp_path / "run",
        tmp_path,
        {"_target_": f"{PACKAGE}.models.build", "kwargs": {"units": 16}},
    )
    exported = (
        f"exported the trained model to {tmp_path / 'model.keras'} "
        "(keras.saving.load_model opens it)"
    )
    python_path = os.pathsep.join([str(code_dir), str(REPO)])
    forking = subprocess.run(
        [sys.executable, "-c", FORKING_CHIEF, str(run_yaml), ckpt],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": python_path, "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=300,
    )
    assert forking.returncode == 0, forking.stderr[-3000:]
    seen = json.loads(forking.stdout.strip().splitlines()[-1])
    assert seen == {"ended": [0, "", False], "lines": [exported]}
    _same_weights(_load(str(tmp_path / "model.keras")), values, order)
    (tmp_path / "model.keras").unlink()
    monkeypatch.setenv("PYTHONPATH", python_path)
    lines: list[str] = []
    exporter = start_export(load_run_config(str(run_yaml)), str(run_yaml), lines.append)
    assert isinstance(exporter, subprocess.Popen)  # not forked from this process
    finish_export(exporter, load_run_config(str(run_yaml)), ckpt, lines.append)
    assert lines == [exported]


def _run_yaml(folder: Path, output_dir: Path, model: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "output_dir": str(output_dir),
        "experiment": {"id": "exp"},
        "algo": {"name": "allreduce"},
        "model": model,
        "data": {"name": "digits"},
        "trainer": {"max_steps": 60},
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_module_refuses_a_builtin_model_and_a_bad_out_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_yaml = _run_yaml(tmp_path, tmp_path, {"name": "mlp"})
    assert load_run_config(str(run_yaml)).model.name == "mlp"
    args = ["--config", str(run_yaml), "--checkpoint", str(tmp_path), "--out"]
    assert export_main([*args, str(tmp_path / "m.keras")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model.name=mlp is a built-in model"), err
    custom = _run_yaml(tmp_path / "b", tmp_path, {"_target_": f"{PACKAGE}.models.build"})
    assert (
        export_main(["--config", str(custom), "--checkpoint", str(tmp_path), "--out", "m.h5"]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "end it in .keras" in err[0], err


# -- tfplan export model ----------------------------------------------------------------------
def _experiment(
    workspace: Path,
    name: str,
    output_dir: Path,
    model: dict[str, Any],
    code_dir: Path,
    copy_back: bool = False,
    program: tuple[str, ...] = (),
) -> Path:
    """An applied experiment as its state records it: the chief's folder with its run.yaml,
    its command and environment (the process backend, this machine; ``copy_back``: per-host
    output, the chief's folder elsewhere; ``program``: the user's own, recipe=command)."""
    workdir = workspace.parent / "work" / name / "worker-0"
    run_yaml = _run_yaml(workdir, output_dir, model)
    output_dir.mkdir(parents=True, exist_ok=True)
    command = program or (sys.executable, "-m", "recipes.train", "--config", str(run_yaml))
    chief = TaskRecord(
        name="worker/0",
        role="worker",
        index=0,
        planned_host="localhost",
        host="localhost",
        address="127.0.0.1",
        port=2222,
        handle={"pid": 1, "pgid": 1},
        workdir=str(workdir),
        log_path=str(workdir / "task.log"),
        command=command,
        env={"PYTHONPATH": str(code_dir)},
        devices=(),
        is_chief=True,
        fingerprint="f",
        config_digest="c",
        cluster_digest="d",
        started_at=0.0,
        status=TaskStatus.SUCCEEDED,
        exit_code=0,
    )
    state = State(
        lineage="l",
        serial=1,
        experiment_id=name,
        cluster_name="local",
        output_dir=str(output_dir),
        tasks=(chief,),
        record_dir=str(workspace / name / "output") if copy_back else "",
        copy_back=copy_back,
    )
    StateStore(workspace / name).write(state)
    return output_dir


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = tfplan_main(["export", "model", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_errors_are_one_line_each(
    tmp_path: Path, code_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = tmp_path / ".tfplan"
    out = _experiment(
        ws, "exp", tmp_path / "out", {"_target_": f"{PACKAGE}.models.build"}, code_dir
    )
    _experiment(ws, "plain", tmp_path / "plain", {"name": "mlp"}, code_dir)
    keras_model = {"_target_": f"{PACKAGE}.models.build"}
    _experiment(ws, "apart", tmp_path / "apart", keras_model, code_dir, copy_back=True)
    _experiment(ws, "own", tmp_path / "own", keras_model, code_dir, program=("python", "t.py"))
    where = ("--workspace", str(ws))
    cases = [
        (["-e", "nope"], "no experiment 'nope' in", "(known: apart, exp, own, plain)"),
        (["-e", "exp"], f"no checkpoint in {out} yet: train first (tfplan apply)", ""),
        (["-e", "plain"], "trains the built-in model model.name=mlp, not a Keras model", ""),
        (
            ["-e", "apart"],
            f"are on localhost in {tmp_path / 'apart'} (per-host output), not on this machine",
            "run `python -m recipes.export --config ",
        ),
        (["-e", "own"], "runs your own program (recipe=command)", ""),
    ]
    for args, expected, also in cases:
        code, _, err = _cli(capsys, *args, *where)
        lines = err.strip().splitlines()
        assert code != 0 and len(lines) == 1, (args, err)
        assert expected in lines[0] and also in lines[0], (args, lines)
    for step in (10, 20, 30):  # only the names matter before anything runs
        (out / f"model.ckpt-{step}.index").write_text("")
    code, _, err = _cli(capsys, "-e", "exp", "--step", "15", *where)
    assert code != 0 and err.strip().splitlines() == [
        f"error: no checkpoint of step 15 in {out}: there are steps 10, 20, 30 (--step 30)"
    ]
    code, _, err = _cli(capsys, "-e", "exp", "--out", str(tmp_path / "m.h5"), *where)
    assert code != 0 and "end it in .keras" in err and len(err.strip().splitlines()) == 1


def test_the_cli_exports_the_latest_or_a_given_step(
    tmp_path: Path, code_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through ``python -m recipes.export`` with the chief's interpreter (one subprocess per
    export: tfplan imports no TensorFlow)."""
    ws = tmp_path / ".tfplan"
    model = {"_target_": f"{PACKAGE}.models.build", "kwargs": {"units": 16}}
    out = _experiment(ws, "exp", tmp_path / "out", model, code_dir)
    cfg = _cfg(out, "build", units=16)
    values, order, trainable = _trained(cfg)
    older = {k: v + 1 for k, v in values.items()}
    _write_tf2(out, older, 30, trainable)
    _write_tf2(out, values, 60, trainable)
    code, printed, err = _cli(capsys, "-e", "exp", "--workspace", str(ws))
    assert code == 0, err
    assert f"Exported step 60 of experiment exp to {out / 'model-60.keras'}" in printed
    _same_weights(_load(str(out / "model-60.keras")), values, order)
    # another step, with --join-bytes below the model's size: its parts, and the line says so
    mine = tmp_path / "mine" / "older.keras"
    args = ("--step", "30", "--out", str(mine), "--join-bytes", "10", "--workspace", str(ws))
    code, printed, err = _cli(capsys, "-e", "exp", *args)
    folder = tmp_path / "mine" / "older.parts"
    assert code == 0, err
    assert f"Exported step 30 of experiment exp as parts to {folder}" in " ".join(printed.split())
    assert (folder / "model.json").is_file() and not mine.exists()
    from recipes import assemble_parts

    for path in order:
        np.testing.assert_array_equal(assemble_parts.weight(str(folder), path), older[path])
    code, printed, err = _cli(capsys, "-e", "exp", "--join-bytes", "0", "--workspace", str(ws))
    assert code != 0 and "--join-bytes 0: give a positive number of bytes" in err


def _write_tf1_sliced(folder: Path, values: dict[str, np.ndarray], path: str, parts: int) -> str:
    """A TF1 recipes' checkpoint of today: ``path`` split in ``parts`` variables marked as
    slices of ``model/<path>`` (recipes/keras_model.py), saved as one tensor in slices."""
    from recipes.checkpoint_names import sliced_names
    from recipes.keras_model import _mark_slice

    v1 = tf.compat.v1
    with tf.Graph().as_default():
        named: dict[str, Any] = {"global_step": v1.Variable(60, dtype=tf.int64, name="gs")}
        for i, (key, value) in enumerate(values.items()):
            if key != path:
                named[model_name(key)] = v1.Variable(value, name=f"v{i}")
                continue
            rows = value.shape[0]
            bounds = [rows * j // parts for j in range(parts + 1)]
            for j in range(parts):
                lo, hi = bounds[j], bounds[j + 1]
                part = v1.Variable(value[lo:hi], name=f"t{j}")
                _mark_slice(part, (lo, hi), value.shape, model_name(path))
                named[f"{model_name(path)}/part_{j}"] = part
        saver = v1.train.Saver(var_list=sliced_names(named))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            return str(saver.save(sess, str(folder / "model.ckpt"), global_step=60))


@pytest.mark.parametrize("fmt", ["tf1", "tf2", "tf1-parts-named"])
def test_a_model_too_large_to_join_is_exported_as_parts_that_assemble_to_the_same_model(
    fmt: str, code_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35 item 5, at both sizes: under the join limit one .keras file; over it (here
    ``join_bytes`` below the model's 16 KiB) the weights as files of rows (at most 4,000 bytes
    each here; the table read one stored slice at a time: the 3 parameter servers' parts),
    a model.json and an assemble.py that joins them, run as a user would, into a .keras file
    whose weights and predictions are the joined export's."""
    import keras

    from recipes import export_parts

    monkeypatch.setattr(export_parts, "CHUNK_BYTES", 4000)
    from recipes import export as export_module

    read = export_module._Entries.rows
    widest: list[int] = []  # the most rows of a table one read asked for

    def rows(self: Any, path: str, shape: tuple[int, ...], lo: int, hi: int) -> Any:
        if path == "table/embeddings":
            widest.append(hi - lo)
        return read(self, path, shape, lo, hi)

    monkeypatch.setattr(export_module._Entries, "rows", rows)
    cfg = _cfg(tmp_path, "tabled")
    values, order, trainable = _trained(cfg)
    assert values["table/embeddings"].shape == (1000, 4)
    if fmt == "tf1":
        ckpt = _write_tf1_sliced(tmp_path, values, "table/embeddings", 3)
    elif fmt == "tf2":
        ckpt = _write_tf2(tmp_path, _split(values, "table/embeddings", 3), 60, trainable)
    else:  # a checkpoint of an older tfplan: the parts under their own names
        ckpt = _write_tf1(tmp_path, _split(values, "table/embeddings", 3), 60)
    joined = export_model(cfg, ckpt, str(tmp_path / "joined.keras"))
    out = str(tmp_path / "big.keras")
    folder = export_model(cfg, ckpt, out, join_bytes=100)
    assert folder == str(tmp_path / "big.parts") and not os.path.exists(out)
    manifest = json.loads((tmp_path / "big.parts" / "model.json").read_text())
    assert [w["path"] for w in manifest["weights"]] == order
    table = next(w for w in manifest["weights"] if w["path"] == "table/embeddings")
    # each of the 3 stored slices (333, 333, 334 rows) read once, written in files of 250 rows
    assert [f["rows"] for f in table["files"]] == [
        [0, 250], [250, 333], [333, 583], [583, 666], [666, 916], [916, 1000],
    ]  # fmt: skip
    assert manifest["bytes"] == sum(v.nbytes for v in values.values())
    # read range by range (the files' 250 rows) where the files are read directly, never a
    # stored slice whole (an older checkpoint's parts: TensorFlow reads each part whole)
    assert max(widest) == (250 if fmt != "tf1-parts-named" else 334), widest
    from recipes import assemble_parts

    for path in order:  # every weight's files join to the checkpoint's value
        joined_value = assemble_parts.weight(str(tmp_path / "big.parts"), path)
        np.testing.assert_array_equal(joined_value, values[path], err_msg=path)
    if fmt != "tf1":  # the user's side, once (the same files for every format)
        return
    # the user's side: the folder's own assemble.py, no tfplan on the path
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "big.parts" / "assemble.py"), str(tmp_path / "a.keras")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assembled = _load(str(tmp_path / "a.keras"))
    _same_weights(assembled, values, order)
    ids = np.array([[0, 999], [250, 749], [3, 500]], dtype=np.int64)
    np.testing.assert_allclose(
        assembled.predict(ids, verbose=0), _load(joined).predict(ids, verbose=0)
    )
    # served by rows: memory-mapped ranges, no join
    spec = importlib.util.spec_from_file_location(
        "assemble", tmp_path / "big.parts" / "assemble.py"
    )
    assemble = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(assemble)  # type: ignore[union-attr]
    ranges = assemble.parts(str(tmp_path / "big.parts"), "table/embeddings")
    assert all(isinstance(rows, np.memmap) for _, _, rows in ranges)
    lo, _, rows = next(r for r in ranges if r[0] <= 510 < r[1])
    np.testing.assert_array_equal(rows[510 - lo], values["table/embeddings"][510])
    # a later joined export of the same name replaces the parts: one form of the model
    assert export_model(cfg, ckpt, out) == out and not os.path.exists(tmp_path / "big.parts")
    assert isinstance(_load(out), keras.Model)
    assert not list(tmp_path.glob(".*.tmp.*"))


@pytest.mark.parametrize("ids", [np.array([], np.int64), np.array([], str)], ids=["int", "str"])
def test_a_dynamic_table_with_no_resident_id_exports_a_lookup_that_reads_zeros(
    ids: np.ndarray,
) -> None:
    """Every row freed (a stream gone quiet): the export is still a model that takes raw ids,
    every id reading the zeros an unknown id reads (a lookup layer takes no empty vocabulary:
    one stand-in id whose row is zeros)."""
    import keras

    from recipes.dynamic_export import with_lookups

    dtype = "string" if ids.dtype.kind == "U" else "int64"
    item = keras.Input((), dtype=dtype, name="item")
    out = keras.layers.Dense(1, name="out")(keras.layers.Embedding(10, 3, name="emb")(item))
    model = keras.Model(item, out)
    exported = with_lookups(model, {"emb": (ids, np.zeros((0, 3), np.float32))})
    raw = np.array(["a", "b"]) if dtype == "string" else np.array([5, 2**40], np.int64)
    got = exported(raw).numpy().ravel()
    bias = float(model.get_layer("out").bias.numpy()[0])
    np.testing.assert_allclose(got, [bias, bias])  # zeros in: the output layer's bias out


def test_the_join_limit_is_a_quarter_of_what_the_process_can_still_take_under_its_memory_cgroup(
    tmp_path: Path,
) -> None:
    """``trainer.export_join_bytes`` unset: a quarter of the host's available memory, or of what the
    process's memory cgroup (a task's own limit, a container's) leaves it, whichever is less;
    read from the kernel's files for cgroup v1 and v2 alike (here: folders shaped as the
    kernel's), and in a real cgroup of 600 MiB."""
    from recipes.export_parts import cgroup_memory_left

    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("4:memory:/job/task\n0::/job/task\n")
    v1_dir = tmp_path / "memory" / "job" / "task"
    v1_dir.mkdir(parents=True)
    (v1_dir / "memory.limit_in_bytes").write_text("1000\n")
    (v1_dir / "memory.usage_in_bytes").write_text("400\n")
    (v1_dir.parent / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    (v1_dir.parent / "memory.usage_in_bytes").write_text("400\n")
    v2_dir = tmp_path / "job"
    (v2_dir / "task").mkdir(parents=True)
    (v2_dir / "memory.max").write_text("900\n")  # the parent's limit binds too
    (v2_dir / "memory.current").write_text("500\n")
    (v2_dir / "task" / "memory.max").write_text("max\n")
    (v2_dir / "task" / "memory.current").write_text("500\n")
    assert cgroup_memory_left(str(proc_cgroup), str(tmp_path)) == 400  # min(1000-400, 900-500)
    (v2_dir / "memory.max").write_text("max\n")
    assert cgroup_memory_left(str(proc_cgroup), str(tmp_path)) == 600
    assert cgroup_memory_left(str(tmp_path / "missing"), str(tmp_path)) is None
    if os.geteuid() != 0:
        return  # a real memory cgroup needs root (CI runs as root)
    from cgroup_helpers import memory_cgroup

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from recipes.config import AlgoConf, DataConf, ModelConf, RunConfig, TrainerConf; "
        "from recipes.export_parts import join_limit; "
        "cfg = RunConfig('/tmp', AlgoConf('hogwild'), ModelConf(), DataConf(), TrainerConf()); "
        "print(join_limit(cfg))"
    )
    with memory_cgroup(600 << 20) as procs:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.stdin.readline(); exec({code!r})", str(REPO)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.write_text(str(proc.pid))  # in the cgroup before it reads anything
        out, _ = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0
    assert 0 < int(out) <= 150 << 20, out  # a quarter of 600 MiB at most
