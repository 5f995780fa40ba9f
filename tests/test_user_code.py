"""The user's packages in the plan: found in recipe.code_dir (or installed), recorded with their
size and digest, shipped by every backend, shown in the plan, and checked again when a saved plan
is applied; and what the planner checks of the user's model and data config without
TensorFlow."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

import pytest
from apply_helpers import tfplan

from tfplan.backends.staging import RECIPES_DIR, package_files, ship_code, shipped_code
from tfplan.cli.render import plan_lines
from tfplan.config.compose import compose_config, to_config
from tfplan.config.schema import Config
from tfplan.engine.plans import check_user_code
from tfplan.engine.user_code import find_user_code
from tfplan.errors import ConfigError
from tfplan.planning.context import PlanContext
from tfplan.planning.plan import Plan, UserCode
from tfplan.planning.planner import plan

CONF = Path(__file__).resolve().parent.parent / "conf"


@cache
def _composed(overrides: tuple[str, ...]) -> Config:
    return to_config(compose_config(list(overrides), CONF))


def config(*overrides: str) -> Config:
    return copy.deepcopy(_composed(overrides))


def _project(root: Path) -> Path:
    pkg = root / "my_pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("def build(units=8):\n    pass\n")
    (pkg / "__pycache__" / "models.cpython-311.pyc").write_bytes(b"\0" * 100)
    (pkg / ".hidden").write_text("x")
    (root / "losses.py").write_text("def fn(labels, outputs):\n    pass\n")
    return root


USER = ("model._target_=my_pkg.models.build", "model.units=8")


def test_the_named_packages_are_found_with_their_size_and_digest(tmp_path: Path) -> None:
    root = _project(tmp_path)
    cfg = config(*USER, "model.loss=losses.fn")
    found = find_user_code(cfg, str(root))
    assert [(c.name, c.is_package, c.files, c.keys) for c in found] == [
        ("losses", False, 1, ("model.loss",)),
        ("my_pkg", True, 2, ("model._target_",)),  # no caches, no hidden files
    ]
    pkg = found[1]
    assert pkg.bytes == len("def build(units=8):\n    pass\n") and pkg.source == str(
        root / "my_pkg"
    )
    assert [p.name for p in package_files(Path(pkg.source))] == ["__init__.py", "models.py"]
    # a change to the code changes the digest (and so the plan's config digest)
    (root / "my_pkg" / "models.py").write_text("def build(units=16):\n    pass\n")
    assert find_user_code(cfg, str(root))[1].digest != pkg.digest


def test_code_dir_is_where_the_packages_are_looked_up(tmp_path: Path) -> None:
    _project(tmp_path / "src")
    with pytest.raises(ConfigError) as err:
        find_user_code(config(*USER), str(tmp_path))
    assert str(err.value) == (
        f"model._target_: no package 'my_pkg' in recipe.code_dir={tmp_path} (the current "
        f"directory), and none installed; run tfplan in the folder that holds my_pkg/ (or "
        f"my_pkg.py), or set recipe.code_dir=/path/to/that/folder"
    )
    found = find_user_code(config(*USER, "recipe.code_dir=src"), str(tmp_path))
    assert [c.source for c in found] == [str(tmp_path / "src" / "my_pkg")]


def test_an_installed_package_is_not_shipped_and_the_built_ins_need_nothing(tmp_path: Path) -> None:
    assert find_user_code(config("model._target_=yaml.safe_load"), str(tmp_path)) == ()
    assert find_user_code(config(), str(tmp_path)) == ()


CTX = PlanContext(cwd="/home/user/project", local_python="/usr/bin/python3", tf_version="2.21.0")
CODE = UserCode("my_pkg", "/home/user/project/my_pkg", 2, 1234, "abcd", ("model._target_",))


def _plan(*overrides: str, code: tuple[UserCode, ...] = (CODE,)) -> Plan:
    from tfplan.backends import backend_class

    cfg = config(*overrides)
    ctx = PlanContext(CTX.cwd, CTX.local_python, CTX.tf_version, code)
    return plan(cfg, None, ctx, backend_class(cfg.cluster.backend).target(cfg.cluster, ctx))


def test_the_plan_records_ships_and_shows_the_users_code() -> None:
    made = _plan(*USER, "data=tfrecord", "data.train=shards/*.tfrecord")
    assert made.user_code == (CODE,)
    assert Plan.from_json(made.to_json()) == made
    # the data's paths are made absolute against the directory tfplan runs in
    assert made.run_config["data"]["train"] == "/home/user/project/shards/*.tfrecord"
    assert shipped_code(made) == [
        (RECIPES_DIR, f"{made.code_dir}/recipes"),
        (Path("/home/user/project/my_pkg"), f"{made.code_dir}/my_pkg"),
    ]
    text = "\n".join(line for _, line in plan_lines(made))
    assert (
        f"Your code: my_pkg (2 file(s), 1.2 KiB) from /home/user/project/my_pkg, shipped to "
        f"{made.code_dir}/my_pkg (model._target_)"
    ) in text
    # the code is part of what the tasks run: another digest, another config digest
    other = _plan(*USER, "data=tfrecord", "data.train=shards/*.tfrecord", code=())
    assert other.config_digest != made.config_digest


def test_ship_code_puts_folders_as_trees_and_modules_as_files(tmp_path: Path) -> None:
    root = _project(tmp_path)
    code = find_user_code(config(*USER, "model.loss=losses.fn"), str(root))
    made = _plan(*USER, "model.loss=losses.fn", code=code)
    calls: list[tuple[str, object, str]] = []

    class Recorder:
        def put_tree(self, local_dir: Path, remote_dir: str) -> None:
            calls.append(("tree", Path(local_dir), remote_dir))

        def write_file(self, path: str, data: bytes) -> None:
            calls.append(("file", data, path))

    ship_code(made, Recorder())
    assert calls == [
        ("tree", RECIPES_DIR, f"{made.code_dir}/recipes"),
        ("file", (root / "losses.py").read_bytes(), f"{made.code_dir}/losses.py"),
        ("tree", root / "my_pkg", f"{made.code_dir}/my_pkg"),
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("model=keras",),
            "model._target_: model=keras needs the callable that returns your keras.Model",
        ),
        (("data=csv",), "data.train: data=csv needs your files"),
        (("data=factory",), "data._target_: data=factory needs your function"),
        ((*USER, "model.loss=cosine"), "model.loss: unknown loss 'cosine'"),
        ((*USER, "model.metrics=[auc]"), "model.metrics: unknown metric 'auc'"),
        ((*USER, "model.loss=mse"), "model.metrics: accuracy needs a classification loss"),
        ((*USER, "data.shard=rows"), "data.shard: 'rows' is not a sharding"),
        ((*USER, "data.compression=BZ2"), "data.compression: 'BZ2' is not a compression"),
        ((*USER, "model.partition_bytes=0"), "model.partition_bytes: 0 < 1"),
    ],
)
def test_bad_model_and_data_keys_are_one_line_errors(
    overrides: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _plan(*overrides, code=())
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_regression_and_a_custom_loss_plan() -> None:
    assert _plan(*USER, "model.loss=mse", "model.metrics=[mae]", code=()).run_config["model"][
        "metrics"
    ] == ["mae"]
    assert _plan(*USER, "model.loss=my_pkg.losses.fn", code=()).run_config["model"]["loss"] == (
        "my_pkg.losses.fn"
    )


def test_kubernetes_carries_the_users_package_in_the_configmap_or_refuses_it(
    tmp_path: Path,
) -> None:
    """The ConfigMap holds the user's files beside the recipes (text only: a binary file is a
    one-line refusal with the fix); the Job mounts them under the code folder."""
    import dataclasses

    from k8s_helpers import k8s_plan

    from tfplan.backends.kubernetes import export_manifests
    from tfplan.errors import TfplanError

    root = _project(tmp_path)
    code = find_user_code(config(*USER), str(root))
    made = dataclasses.replace(k8s_plan("algo=downpour"), user_code=code)
    config_map = export_manifests(made, "jobs")[0]
    data = config_map["data"]
    assert data["my_pkg.models.py"] == (root / "my_pkg" / "models.py").read_text()
    assert "my_pkg.__init__.py" in data and "recipes.train.py" in data
    (root / "my_pkg" / "weights.bin").write_bytes(b"\xff\xfe\x00")
    code = find_user_code(config(*USER), str(root))
    with pytest.raises(TfplanError, match=r"my_pkg/weights.bin .* is not text.*code=image"):
        export_manifests(dataclasses.replace(made, user_code=code), "jobs")


# --- a saved plan is exact about the user's code ------------------------------------------------


def _saved_digest(path: Path) -> str:
    return Plan.from_json(path.read_text()).user_code[0].digest


def test_apply_refuses_a_saved_plan_whose_code_changed_and_starts_nothing(tmp_path: Path) -> None:
    """Planned, then the user's module edited: apply (of the saved plan or a plan file) refuses
    in one line with both digests, before the lock or any task; the first apply, not the second,
    says so. A module that is gone is refused the same way."""
    (tmp_path / "losses.py").write_text("def fn(labels, outputs):\n    pass\n")
    for args in (("plan",), ("plan", "-out", "my.plan")):
        done = tfplan(tmp_path, *args, "model.loss=losses.fn", "cluster.port_base=24610")
        assert done.returncode == 0, done.stderr
    before = _saved_digest(tmp_path / ".tfplan" / "plan.json")
    assert _saved_digest(tmp_path / "my.plan") == before
    check_user_code(Plan.from_json((tmp_path / "my.plan").read_text()))  # unchanged: applies
    (tmp_path / "losses.py").write_text("def fn(labels, outputs):\n    return 0\n")
    after = find_user_code(config("model.loss=losses.fn"), str(tmp_path))[0].digest
    assert after != before
    made = sorted(p.name for p in (tmp_path / ".tfplan").iterdir())
    for words in (("apply",), ("apply", "my.plan")):
        done = tfplan(tmp_path, *words, "--auto-approve")
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr == (
            f"error: your code changed since the plan was saved (losses: digest {before[:8]} -> "
            f"{after[:8]}, model.loss): run `tfplan plan` again\n"
        )
    assert sorted(p.name for p in (tmp_path / ".tfplan").iterdir()) == made  # no state, no lock
    (tmp_path / "losses.py").unlink()
    done = tfplan(tmp_path, "apply", "my.plan")
    assert done.returncode == 1 and done.stderr == (
        f"error: your code changed since the plan was saved (losses: {tmp_path / 'losses.py'} "
        "is gone, model.loss): run `tfplan plan` again\n"
    )
