"""What the plan can know about the user's model and data is an error at plan time, when every
task runs on this machine, in one line naming the key (plus the user's own frames when their code
raised): the label, the model's inputs against the data's features, a keyword the factory does
not take, a model or data factory that raises. Nothing starts. The features the model does not
take are listed in the plan.

The model is built once per plan in a subprocess (``python -m recipes.inspect_model``), as a
replica builds it, and run on a batch shaped as the data's features.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from apply_helpers import example_with_data, tfplan

SHARDS = ("data=tfrecord", "data.train=data/train-*.tfrecord", "data.eval=data/eval.tfrecord")
MODEL = "model._target_=tabular.models.build"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return example_with_data("tabular", tmp_path_factory.mktemp("checks") / "project")


@pytest.fixture
def project(generated: Path, tmp_path: Path) -> Path:
    where = tmp_path / "project"
    shutil.copytree(generated, where)
    return where


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))


def _refused(project: Path, *args: str) -> list[str]:
    proc = tfplan(project, "plan", "--no-save", *args)
    assert proc.returncode != 0, proc.stdout
    assert not (project / "work").exists()  # nothing started
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[0].startswith("error: "), proc.stderr
    return lines


def test_a_keyerror_in_the_model_factory_shows_the_users_frame(project: Path) -> None:
    models = project / "tabular" / "models.py"
    _edit(
        models,
        "def build(units=32, classes=3, vocab=10, embed=4):",
        "def build(units=32, classes=3, vocab=10, embed=4, **cfg):\n    units = cfg['hidden_units']",
    )
    lines = _refused(project, MODEL, *SHARDS)
    assert lines[0].startswith("error: model._target_=tabular.models.build raised KeyError: ")
    assert f"{models}:7" in lines[0]
    assert any(f"{models}:7 in build: units = cfg['hidden_units']" in ln for ln in lines[1:])
    assert not any("site-packages" in ln or "/recipes/" in ln for ln in lines), lines


def test_an_input_named_unlike_every_feature_is_an_error_listing_the_features(
    project: Path,
) -> None:
    _edit(project / "tabular" / "models.py", 'name="num")', 'name="numeric")')
    _edit(project / "tabular" / "models.py", '{"num": num, "cat": cat}', "[num, cat]")
    (line,) = _refused(project, MODEL, *SHARDS)
    assert "the model's input 'numeric' is not a feature" in line
    assert "its features: cat, num" in line and "model._target_" in line


@pytest.mark.full
def test_the_features_the_model_does_not_take_are_listed(project: Path) -> None:
    models = project / "tabular" / "models.py"
    _edit(models, 'cat = keras.Input((), dtype="int64", name="cat")', "")
    _edit(
        models,
        'keras.layers.Embedding(vocab, embed, name="cat_embedding")(cat)',
        "keras.layers.Dense(embed)(num)",
    )
    _edit(
        models,
        'keras.layers.Embedding(vocab, classes, name="cat_bias")(cat)',
        "keras.layers.Dense(classes)(num)",
    )
    _edit(models, '{"num": num, "cat": cat}', '{"num": num}')
    proc = tfplan(project, "plan", "--no-save", MODEL, *SHARDS)
    assert proc.returncode == 0, proc.stderr
    assert "features the model does not take: cat" in proc.stdout


@pytest.mark.full
def test_an_embedding_whose_ids_arrive_as_floats_is_a_one_line_error(project: Path) -> None:
    """The records hold int64 ids, but the model's keras.Input is float32 (Keras' default):
    a float32 holds ids exactly only up to 2^24, so larger ones would share rows silently."""
    models = project / "tabular" / "models.py"
    _edit(
        models,
        'cat = keras.Input((), dtype="int64", name="cat")',
        'cat = keras.Input((), name="cat")',
    )
    (line,) = _refused(project, MODEL, *SHARDS)
    assert line.startswith(
        "error: the Embedding 'cat_embedding' (feature 'cat') gets its ids as float32"
    ), line
    assert 'dtype="int64"' in line and "data.features.cat.dtype=int64" in line


@pytest.mark.full
def test_a_label_the_records_do_not_have_is_an_error(project: Path) -> None:
    (line,) = _refused(project, MODEL, *SHARDS, "data.label=target")
    assert line.startswith("error: data.label='target': the records have no feature 'target'")
    assert "they have: cat, label, num" in line


@pytest.mark.full
def test_keywords_the_factories_do_not_take_are_errors(project: Path) -> None:
    (line,) = _refused(project, MODEL, "+model.unitz=3", *SHARDS)
    assert "model._target_=tabular.models.build: cannot be called with unitz" in line
    factory = ("data._target_=tabular.data.make", "algo=allreduce", "cluster.ps=0")
    (line,) = _refused(project, MODEL, *factory, "+data.kwargs.zzz=1")
    assert "data._target_=tabular.data.make cannot be called with" in line and "zzz" in line


@pytest.mark.full
def test_a_data_factory_that_raises_is_an_error_with_its_frame(project: Path) -> None:
    data = project / "tabular" / "data.py"
    _edit(
        data,
        "    features, label = examples(",
        "    raise RuntimeError('no data today')\n    features, label = examples(",
    )
    lines = _refused(
        project, MODEL, "data._target_=tabular.data.make", "algo=allreduce", "cluster.ps=0"
    )
    assert lines[0].startswith(
        "error: data._target_=tabular.data.make (split='train') raised RuntimeError: no data today"
    )
    assert any(f"{data}:" in ln and "in make" in ln for ln in lines[1:]), lines


def test_the_tfrecord_label_is_checked_without_tensorflow(generated: Path) -> None:
    """check_static reads the first record's feature names with a protobuf decoder of its own:
    the planner never imports TensorFlow."""
    code = (
        "import sys\n"
        "from recipes.config import DataConf\n"
        "from recipes.inputs import check_static\n"
        "from recipes.errors import InputError\n"
        f"d = DataConf(name='tfrecord', train=({str(generated / 'data' / 'eval.tfrecord')!r},))\n"
        "check_static(d)\n"
        "try:\n"
        "    check_static(DataConf(name='tfrecord', train=d.train, label='nope'))\n"
        "except InputError as e:\n"
        "    print(e)\n"
        "assert 'tensorflow' not in sys.modules, 'imported TensorFlow'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "data.label='nope': the records have no feature 'nope'" in out
