"""Make a plan: ask the backend where the cluster can run, plan on it, attach its dry run.

The planner is pure and knows no backend; this is where the two meet (the CLI, sweeps and the
supervisor's re-plan all come through here).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from recipes.vocabulary import FACTORY_SOURCE, FILE_SOURCES
from tfplan.errors import ConfigError, StaleStateError, TfplanError
from tfplan.planning.context import PlanContext
from tfplan.planning.plan import Plan, UserCode
from tfplan.planning.state import State

if TYPE_CHECKING:
    from tfplan.config.schema import Config

__all__ = [
    "check_data_files",
    "check_user_code",
    "make_plan",
    "plan_context",
    "replan_from_state",
    "tf_version",
]


TF_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tf-nightly")
# the data sources check_data_files looks at: files of records, and the user's function
FILE_DATA_SOURCES = (*FILE_SOURCES, FACTORY_SOURCE)


def tf_version() -> str:
    """The installed TensorFlow's version, read from package metadata (no import: 2 s saved).

    The version is in the name of the ``.dist-info`` folder; importlib.metadata, which reads
    it otherwise, costs more to import than a small plan takes to make."""
    for dist in TF_DISTRIBUTIONS:
        prefix = dist.replace("-", "_") + "-"
        for entry in sys.path:
            try:
                names = os.listdir(entry or ".")
            except OSError:
                continue
            for name in names:
                if name.startswith(prefix) and name.endswith(".dist-info"):
                    return name[len(prefix) : -len(".dist-info")]
    from importlib import metadata

    for dist in TF_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def plan_context(cfg: Config | None = None) -> PlanContext:
    """The facts the planner needs from this machine; with ``cfg``, the user's packages it
    names too (found on disk: a one-line ConfigError when one is nowhere)."""
    from tfplan.engine.user_code import find_user_code

    cwd = os.getcwd()
    return PlanContext(
        cwd=cwd,
        local_python=sys.executable,
        tf_version=tf_version(),
        user_code=find_user_code(cfg, cwd) if cfg is not None else (),
    )


def make_plan(
    cfg: Config,
    state: State | None,
    ctx: PlanContext | None = None,
    targets: Sequence[str] = (),
) -> Plan:
    """The plan of ``cfg`` against ``state`` on the backend ``cfg.cluster.backend`` names,
    narrowed to ``targets`` (``-target``: task names or roles) when given.

    Raises:
        ConfigError: a bad value (the backend's own options included), naming the key, or a
            target that names no task.
        PlanError: the tasks do not fit.
    """
    from tfplan.backends import backend_class
    from tfplan.planning.planner import plan

    backend = backend_class(cfg.cluster.backend)
    if cfg.cluster.firewall and not backend.capabilities.firewall:
        raise ConfigError(
            "cluster.firewall",
            f"the {backend.name} backend cannot install firewall rules",
            "set cluster.firewall=false and restrict the ports with what that platform offers "
            "(e.g. a NetworkPolicy on Kubernetes)",
        )
    if cfg.cluster.output_mode == "per_host" and not backend.capabilities.per_host_output:
        raise ConfigError(
            "cluster.output_mode",
            f"per_host, but the {backend.name} backend needs output_dir on one folder every "
            "task shares",
            "set cluster.output_mode=auto (or shared) and mount output_dir on every node"
            + (
                f" ({backend.capabilities.output_mount_key})"
                if backend.capabilities.output_mount_key
                else ""
            ),
        )
    ctx = ctx or plan_context(cfg)
    step = checkpoint_step(state) if state is not None and state.running else None
    made = plan(cfg, state, ctx, backend.target(cfg.cluster, ctx), targets, step)
    made = check_data_files(made)
    made = preview_user_model(made, cfg)
    request = backend.dryrun(made)
    return replace(made, request=request) if request else made


LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")
_CHECKPOINT_PATH = re.compile(r'^model_checkpoint_path:\s*"[^"]*?-(\d+)"', re.M)


def checkpoint_step(state: State) -> int | None:
    """The global step of the running job's last checkpoint, from TensorFlow's ``checkpoint``
    index in its output folder when that folder is readable here (a local host, or a folder
    shared with this machine): 0 when the folder holds none yet, None when it is not here."""
    folder = Path(state.output_dir or "")
    if not state.output_dir or not folder.is_dir():
        return None
    chief = next((t for t in state.tasks if t.is_chief), None)
    chief_here = chief is not None and (chief.address or chief.host) in LOCAL_ADDRESSES
    try:
        text = (folder / "checkpoint").read_text()
    except FileNotFoundError:
        return 0 if chief_here else None  # elsewhere, the chief's folder may differ from ours
    except OSError:
        return None
    found = _CHECKPOINT_PATH.search(text)
    return int(found.group(1)) if found else None


def _every_task_here(made: Plan) -> bool:
    """Every task runs on this machine: what fails here fails there."""
    from tfplan.backends import backend_class

    return backend_class(made.backend.name).runs_here(made)


def preview_user_model(made: Plan, cfg: Config) -> Plan:
    """The sharding preview of a user's Keras model, from an inspection build (cached in the
    user's cache, tfplan.engine.model_shapes.user_cache_dir), which
    also runs the user's data factory and the model on one batch of the data's shape, and lists
    the features the model does not take.

    Raises:
        TfplanError: the build refused the config or the user's code raised, and every task
            runs on this machine (elsewhere it is a plan warning: the hosts may differ).
    """
    if not made.builtin_recipes or not (cfg.model._target_ or cfg.data._target_):
        return made
    from tfplan.engine.model_shapes import inspect_model, user_cache_dir
    from tfplan.planning.sharding import preview_of
    from tfplan.planning.tables import describe_tables, replicated_table_problem

    # as tfplan/engine/user_code.py resolves it (a "~" in recipe.code_dir included)
    code_dir = str(
        Path(
            made.source_config.get("context", {}).get("cwd", "."),
            os.path.expanduser(cfg.recipe.code_dir or "."),
        )
    )
    num_ps = sum(1 for t in made.tasks if t.role.value == "ps")
    found = inspect_model(
        made.run_config,
        made.user_code,
        code_dir,
        user_cache_dir() / "models",
        made.tf_version,
        num_ps,
    )
    if found.variables is None:
        if found.refused and _every_task_here(made):
            frames = "".join(f"\n  {frame}" for frame in found.frames)
            hint = "\n  (TFPLAN_DEBUG=1 shows the whole traceback)" if frames else ""
            raise TfplanError(f"{found.problem}{frames}{hint}")
        what = (
            f"model._target_={cfg.model._target_}"
            if cfg.model._target_
            else (f"data._target_={cfg.data._target_}")
        )
        note = (
            f"{what}: could not build the model on the data here ({found.problem}); the plan "
            "shows no variables of it, and the tasks fail the same way unless their hosts "
            "differ from this machine"
        )
        return replace(made, warnings=(*made.warnings, note))
    if found.unused_features:
        taken = f"features the model does not take: {', '.join(found.unused_features)}"
        note = f"{made.data_note}; {taken}" if made.data_note else taken
        made = replace(made, data_note=note)
    if not cfg.model._target_:
        return made  # a built-in model: the planner knows its variables already
    preview = preview_of(found.variables, num_ps, found.source, found.devices)
    algo = made.run_config.get("algo") or {}
    tables = describe_tables(
        list(found.tables),
        preview.variables,
        preview.placements[0] if preview.placements else None,
        num_ps,
        str(algo.get("name", "")),
        str(algo.get("optimizer", "sgd")),
        int((made.run_config.get("data") or {}).get("batch_size") or 1),
    )
    limit = algo.get("replicated_table_limit_mb")
    problem = limit is not None and replicated_table_problem(tables, algo["name"], float(limit))
    if problem:
        raise TfplanError(problem)
    notes = [
        f"{t.name} (layer {t.layer!r}) is read whole "
        + ("at every step" if t.reads == "whole" else "into every worker's copy, per window")
        + ": an Embedding subclass with its own call, or a quantized or LoRA one, is not read "
        'row by row (docs/your_model.md, "Only the batch\'s rows move")'
        for t, listed in zip(tables, found.tables, strict=True)
        if t.reads in ("whole", "window") and not listed.get("rows_only")  # the layer's doing
    ]
    return replace(
        made,
        sharding=replace(preview, tables=tables),
        warnings=(*made.warnings, *notes),
    )


def check_data_files(made: Plan) -> Plan:
    """The data checks that need no TensorFlow (the recipes' own: globs match, files exist,
    CSV headers and npz arrays hold the configured columns), on this machine. When every task
    runs here a failure is an error; otherwise the hosts may see other files, so it is a plan
    warning.

    Raises:
        TfplanError: the data cannot be read as configured, every task being local.
    """
    data = made.run_config.get("data") or {}
    if not made.builtin_recipes or data.get("name") not in FILE_DATA_SOURCES:
        return made
    from recipes.config import ConfigError as RunConfigError
    from recipes.config import data_conf
    from recipes.inputs import InputError, check_static, sharding_reason

    replicas = sum(1 for t in made.tasks if t.role.value in ("worker", "chief"))
    # where the user's packages are (recipe.code_dir against the folder tfplan runs in): the
    # factory's module is looked for there too, as the tasks will find it beside the recipes
    search_path = tuple(dict.fromkeys(str(Path(c.source).parent) for c in made.user_code))
    try:
        conf = data_conf(data)
        check_static(conf, search_path=search_path)
        if conf.target:
            note = f"{data.get('name')}: {conf.target} shards its own data"
        else:
            note = f"{conf.name}, {sharding_reason(conf, max(1, replicas))}"
    except (InputError, RunConfigError) as error:
        if _every_task_here(made):
            raise TfplanError(str(error)) from None
        note = f"{error} (checked on this machine; the hosts must see the data at that path)"
        return replace(made, warnings=(*made.warnings, note))
    return replace(made, data_note=note)


def replan_from_state(state: State) -> Plan | None:
    """Plan again from the config the state carries (after hosts went down); None when the
    state carries none. The planning context is the one of the original plan."""
    if not state.config:
        return None
    from tfplan.config.compose import config_from_dict

    cfg = config_from_dict(state.config["config"])
    return make_plan(cfg, state, PlanContext.from_dict(state.config["context"]))


def check_user_code(plan: Plan) -> None:
    """Refuse a saved plan whose user code changed on disk since it was made.

    Apply ships the files as they are now, while the plan (its digests, its tasks' fingerprints)
    describes the ones it saw: applying it would run code nobody planned, and only the next
    apply would notice. The digests are recomputed by the function that recorded them, on the
    plan's own config and folder.

    Raises:
        StaleStateError: a package's files differ, or it is no longer where it was (one line
            naming each, with the keys that name it).
        ConfigError: the plan's config no longer fits this version's schema.
    """
    if not plan.user_code or not plan.source_config:
        return
    from tfplan.config.compose import config_from_dict
    from tfplan.engine.user_code import find_user_code

    gone = [code for code in plan.user_code if not Path(code.source).exists()]
    now: dict[str, UserCode] = {}
    if not gone:  # else find_user_code's error says where to run tfplan; the fix is a new plan
        cfg = config_from_dict(plan.source_config["config"])
        cwd = str(plan.source_config.get("context", {}).get("cwd") or os.getcwd())
        now = {code.name: code for code in find_user_code(cfg, cwd)}
    changed = []
    for code in gone or plan.user_code:
        found = now.get(code.name)
        keys = ", ".join(code.keys)
        if found is None:
            changed.append(f"{code.name}: {code.source} is gone, {keys}")
        elif found.source != code.source:
            changed.append(f"{code.name}: from {found.source} now, not {code.source}, {keys}")
        elif found.digest != code.digest:
            changed.append(f"{code.name}: digest {code.digest[:8]} -> {found.digest[:8]}, {keys}")
    if changed:
        raise StaleStateError(
            f"your code changed since the plan was saved ({'; '.join(changed)}): "
            "run `tfplan plan` again"
        )
