"""The architecture as a test: lower layers never import higher ones, recipes never import tfplan.

    config < planning < diagnosis < backends < engine < sweeps < cli

Every ``import`` and ``from ... import`` in the package is read with ``ast`` (function-level
imports included, ``if TYPE_CHECKING:`` ones too: a type is a dependency as well).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("config", "planning", "diagnosis", "backends", "engine", "sweeps", "cli")
# Modules at the top of the package that everyone may use.
SHARED = {"tfplan", "tfplan.errors", "tfplan.files"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "tfplan" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else None


def _package_modules() -> list[Path]:
    return sorted((ROOT / "tfplan").rglob("*.py"))


@pytest.mark.parametrize("path", _package_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_only_its_own_layer_and_those_below(path: Path) -> None:
    own = _layer(".".join(path.relative_to(ROOT).with_suffix("").parts))
    for module in _imports(path):
        if not module.startswith("tfplan"):
            continue
        target = _layer(module)
        if own is None:  # tfplan/__init__, errors, files, __main__
            assert (
                module in SHARED
                or module.startswith("tfplan.cli")
                or (module.startswith("tfplan.planning.plan"))
            ), f"{path.name} imports {module}"
            continue
        assert target is None or LAYERS.index(target) <= LAYERS.index(own), (
            f"{path.relative_to(ROOT)} ({own}) imports {module} ({target}), a higher layer"
        )


SHARED_BACKEND_PARTS = (
    "api",
    "delivery",
    "fanout",
    "firewall",
    "logstream",
    "staging",
    "transports",
)


# The one backend built on another: Spark runs the process backend's lifecycle through an
# agent in each executor (a transport of its own), instead of a second copy of it.
BUILDS_ON = {"spark": ("process",)}


def test_backends_do_not_import_each_other() -> None:
    """A backend uses the interface and the shared parts (transports, fan-out), never another
    backend (but the one it declares it is built on, never the other way): adding one is one
    module (or package) of its own."""
    for path in (ROOT / "tfplan" / "backends").rglob("*.py"):
        own = path.relative_to(ROOT / "tfplan" / "backends").parts[0].removesuffix(".py")
        allowed = (own, *SHARED_BACKEND_PARTS, *BUILDS_ON.get(own, ()))
        for module in _imports(path):
            parts = module.split(".")
            if parts[:2] == ["tfplan", "backends"] and len(parts) > 2:
                assert parts[2] in allowed, f"{path} imports {module}"


def test_the_planner_imports_no_backend_and_no_io() -> None:
    for path in (ROOT / "tfplan" / "planning").rglob("*.py"):
        for module in _imports(path):
            assert module.split(".")[0] not in ("subprocess", "socket", "paramiko", "fabric")
            assert not module.startswith(("tfplan.backends", "tfplan.engine")), (path, module)


def test_recipes_never_import_tfplan() -> None:
    for path in (ROOT / "recipes").rglob("*.py"):
        for module in _imports(path):
            assert not module.startswith("tfplan"), f"{path} imports {module}"


# recipes/: the modules tfplan's planner imports (and every recipe builds on) need no TensorFlow
PLAIN_RECIPES = (
    "recipes.errors",
    "recipes.vocabulary",
    "recipes.targets",
    "recipes.reporting",
    "recipes.checkpoint_names",
    "recipes.config",
    "recipes.live",
    "recipes.inputs.files",
)
HEAVY = ("tensorflow", "keras", "tf_keras", "numpy")


@pytest.mark.parametrize("module", PLAIN_RECIPES)
def test_the_plain_recipes_modules_import_no_tensorflow(module: str) -> None:
    """What the planner validates with (errors, vocabulary, the importer, file lookup) and what
    every task writes (reporting) stays importable without TensorFlow, and imports only plain
    modules of its own (``recipes.inputs.lazy`` imports TensorFlow only when asked)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    for imported in _imports(path):
        assert imported.split(".")[0] not in HEAVY, f"{module} imports {imported}"
        if imported.startswith("recipes"):
            assert imported in (*PLAIN_RECIPES, "recipes.inputs.lazy"), (
                f"{module} imports {imported}, which is not a plain module"
            )


def test_the_tf2_strategies_do_not_import_the_tf1_training_loop() -> None:
    """allreduce and pss share the recipes' core (workload, reporting, evaluator), not the TF1
    replica's loop or the TF1 algorithms."""
    for path in (ROOT / "recipes" / "strategies").rglob("*.py"):
        for module in _imports(path):
            assert not module.startswith(("recipes.replica", "recipes.algorithms")), (
                f"{path.relative_to(ROOT)} imports {module}"
            )


# The concrete backends: the engine, sweeps and CLI speak only the Backend interface
# (tfplan.backends.api) and open a backend by name (tfplan.backends.open_backend).
CONCRETE_BACKENDS = (
    "tfplan.backends.process",
    "tfplan.backends.slurm",
    "tfplan.backends.kubernetes",
)
# `tfplan export kubernetes` writes the Kubernetes backend's own file format (manifests): a
# command of that backend's, not something the engine does with a backend.
CONCRETE_ALLOWED = {("tfplan/cli/cmd_export.py", "tfplan.backends.kubernetes.export")}


@pytest.mark.parametrize("path", _package_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_outside_the_backends_imports_a_concrete_backend(path: Path) -> None:
    where = str(path.relative_to(ROOT))
    if where.startswith("tfplan/backends/"):
        return
    for module in _imports(path):
        concrete = any(module == c or module.startswith(c + ".") for c in CONCRETE_BACKENDS)
        assert not concrete or (where, module) in CONCRETE_ALLOWED, (
            f"{where} imports {module}: use the Backend interface (capabilities, methods) instead"
        )


def test_the_concrete_backend_check_finds_an_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tfplan.backends.process import ProcessBackend\n")
    found = _imports(module)
    assert found == ["tfplan.backends.process"]
    assert any(found[0].startswith(c) for c in CONCRETE_BACKENDS)


def test_the_commands_that_read_a_state_import_no_hydra_omegaconf_or_tensorflow() -> None:
    """``status``, ``logs``, ``destroy`` and ``watch`` run often (tests and scripts call them by
    the hundred) and need no config composition: omegaconf alone was 0.09 s of each."""
    import subprocess
    import sys

    modules = ("status", "logs", "destroy", "watch")
    code = "; ".join(f"import tfplan.cli.cmd_{m}" for m in modules)
    code += "; import sys; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    for heavy in ("omegaconf", "hydra", "tensorflow", "keras"):
        assert f"'{heavy}'" not in loaded, f"importing the commands {modules} imports {heavy}"
