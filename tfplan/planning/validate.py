"""Pure: checks of the composed config against itself and the topology, before anything starts.

Hydra's schemas already reject unknown keys and wrong types; these checks cover what a type cannot
say (ranges, cross-field rules, the algorithm against the number of workers). Each failure is a
:class:`ConfigError` naming the key and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from recipes.vocabulary import (
    CLASSIFICATION_LOSSES,
    DATA_SOURCES,
    FACTORY_SOURCE,
    FILE_SOURCES,
    LOSSES,
    METRICS,
    MNIST_SOURCES,
    MODELS,
    OPTIMIZERS,
    PS_OPTIMIZERS,
    USER_MODEL,
)
from tfplan.config.algorithms import ALGORITHMS
from tfplan.config.schema import (
    AdagConfig,
    AllreduceConfig,
    ChiefMode,
    Config,
    EamsgdConfig,
    EasgdConfig,
    MultiGpuConfig,
    PssConfig,
    SagnConfig,
    SyncConfig,
    SyncLrConfig,
)
from tfplan.errors import ConfigError
from tfplan.planning.memory import check_memory
from tfplan.planning.roles import RoleCounts

# The names of losses, metrics, optimizers, models and data sources are the recipes' own
# (recipes/vocabulary.py, stdlib only): import them from there.
__all__ = ["ENV_NAME", "OUTPUT_MODES", "RESTART_POLICIES", "validate"]

RESTART_POLICIES = ("Never", "OnFailure", "Always", "ExitCode")
OUTPUT_MODES = ("auto", "shared", "per_host")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Check = Callable[[Config, RoleCounts], None]


def validate(cfg: Config, counts: RoleCounts) -> None:
    """Raise :class:`ConfigError` for the first problem found; return None when all is well.

    The backend checks its own options (hosts, nodes, ...) before; this checks the rest, with
    ``counts`` the tasks the cluster asks for on the backend's topology.
    """
    for check in _CHECKS:
        check(cfg, counts)


def _require(ok: bool, key: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(key, problem, fix)


def _check_roles(cfg: Config, counts: RoleCounts) -> None:
    cluster = cfg.cluster
    num_ps = counts.ps
    _require(num_ps >= 0, "cluster.ps", f"{num_ps} < 0", "use 0 or more (or per_host)")
    if cfg.recipe.kind == "builtin" and cfg.algo.name in ALGORITHMS:
        algorithm = ALGORITHMS[cfg.algo.name]
        if algorithm.chief:
            _require(
                cluster.chief is ChiefMode.separate,
                "cluster.chief",
                f"worker0, but algo={cfg.algo.name} needs a chief task of its own (the coordinator)",
                "set cluster.chief=separate (cluster=local_chief has one)",
            )
            _require(
                counts.workers >= 1,
                "cluster.workers",
                f"{counts.workers} workers: algo={cfg.algo.name}'s coordinator needs some to train",
                "use at least 1 worker",
            )
        if algorithm.needs_ps:
            _require(
                num_ps >= 1,
                "cluster.ps",
                f"{num_ps} parameter servers, but algo={cfg.algo.name} keeps its variables on them",
                "use at least 1 (or per_host), or a collective algorithm such as algo=allreduce",
            )
        else:
            _require(
                num_ps == 0,
                "cluster.ps",
                f"{num_ps} parameter servers, but algo={cfg.algo.name} uses none",
                "set cluster.ps=0",
            )
    if counts.per_gpu:
        _require(
            counts.workers >= 1,
            "cluster.workers",
            "per_gpu but no host has gpus",
            "give the hosts gpus, or a count, e.g. cluster.workers=2",
        )
    workers = counts.workers
    if cluster.chief is ChiefMode.worker0:
        _require(
            workers >= 1,
            "cluster.workers",
            f"{workers} workers leaves no chief (chief=worker0)",
            "use at least 1 worker, or cluster.chief=separate",
        )
    else:
        _require(workers >= 0, "cluster.workers", f"{workers} < 0", "use 0 or more")


def _check_output_mode(cfg: Config, counts: RoleCounts) -> None:
    mode = cfg.cluster.output_mode
    _require(
        mode in OUTPUT_MODES,
        "cluster.output_mode",
        f"unknown mode {mode!r}",
        f"choose one of {', '.join(OUTPUT_MODES)} (auto: apply finds out whether the hosts "
        "share output_dir)",
    )


def _check_memory(cfg: Config, counts: RoleCounts) -> None:
    check_memory(cfg.cluster.memory or {}, cfg.cluster.backend)


def _check_warm_keep(cfg: Config, counts: RoleCounts) -> None:
    keep = cfg.cluster.warm_keep_secs
    if keep is None:
        return  # TFPLAN_WARM_KEEP_SECS, read by the process backend (others keep no seed)
    _require(keep >= 0, "cluster.warm_keep_secs", f"{keep} < 0", "use e.g. 300, or 0")
    _require(
        keep == 0 or cfg.cluster.backend == "process",
        "cluster.warm_keep_secs",
        f"the {cfg.cluster.backend} backend's warm seeds live inside its allocation and end with it",
        "set it to 0 (only the process backend keeps a seed between runs)",
    )


def _check_ports(cfg: Config, counts: RoleCounts) -> None:
    cluster = cfg.cluster
    _require(
        cluster.port_range >= 1, "cluster.port_range", f"{cluster.port_range} < 1", "use e.g. 100"
    )
    _require(
        cluster.port_offset >= 0,
        "cluster.port_offset",
        f"{cluster.port_offset} < 0",
        "use 0 or more",
    )
    bases = [(cluster.port_base, "cluster.port_base")] + [
        (host.port_base, f"cluster.hosts[{i}].port_base")
        for i, host in enumerate(cluster.hosts)
        if host.port_base is not None
    ]
    for base, key in bases:
        first, last = (
            base + cluster.port_offset,
            base + cluster.port_offset + cluster.port_range - 1,
        )
        _require(
            1024 <= first and last <= 65535,
            key,
            f"ports {first}-{last} are outside 1024-65535",
            "pick a port_base/port_offset/port_range inside that range",
        )


def _check_algo(cfg: Config, counts: RoleCounts) -> None:
    algo = cfg.algo
    if cfg.recipe.kind == "builtin":
        _require(
            algo.name in ALGORITHMS,
            "algo.name",
            f"unknown algorithm {algo.name!r}",
            f"choose one of {', '.join(ALGORITHMS)}",
        )
    _require(algo.lr > 0, "algo.lr", f"{algo.lr} is not positive", "use e.g. algo.lr=0.05")
    _require(
        algo.optimizer in OPTIMIZERS,
        "algo.optimizer",
        f"unknown optimizer {algo.optimizer!r}",
        f"choose one of {', '.join(OPTIMIZERS)}",
    )
    window = getattr(algo, "window", None)
    if window is not None:
        _require(window >= 1, "algo.window", f"{window} < 1", "use a window of at least 1 step")
    ps_optimizer = getattr(algo, "ps_optimizer", None)
    if ps_optimizer is not None:
        allowed = OPTIMIZERS if isinstance(algo, SagnConfig) else PS_OPTIMIZERS
        _require(
            ps_optimizer in allowed,
            "algo.ps_optimizer",
            f"unknown ps optimizer {ps_optimizer!r}",
            "choose sgd or adagrad" if len(allowed) == 2 else f"choose one of {', '.join(allowed)}",
        )
    if cfg.recipe.kind == "builtin":
        _check_sync_semantics(algo.name, algo.sync)
        _check_algorithm_options(cfg, counts)
    if isinstance(algo, SyncConfig):
        _check_sync(algo, counts.training_replicas)


def _check_sync_semantics(name: str, sync: bool) -> None:
    """A synchronous algorithm runs in rounds of every replica; an async one never waits."""
    if ALGORITHMS[name].sync:
        _require(
            sync,
            "algo.sync",
            f"false, but {name} is synchronous (SyncReplicasOptimizer rounds)",
            "leave algo.sync=true, or pick an asynchronous algorithm (e.g. algo=agn for sagn)",
        )
    else:
        _require(
            not sync,
            "algo.sync",
            f"true, but {name} is asynchronous",
            "leave algo.sync=false, or pick one of "
            + ", ".join(f"algo={a.name}" for a in ALGORITHMS.values() if a.sync),
        )


def _check_algorithm_options(cfg: Config, counts: RoleCounts) -> None:
    """Each algorithm's own keys: ranges and what the topology must give it."""
    algo = cfg.algo
    examples = {
        "collective_timeout_secs": 30,
        "startup_timeout_secs": 120,
        "replicated_table_limit_mb": 256,
    }
    for key, example in examples.items():
        value = getattr(algo, key, None)
        if value is not None:
            _require(value > 0, f"algo.{key}", f"{value} is not positive", f"use e.g. {example}")
    if isinstance(algo, AllreduceConfig):
        _require(
            algo.collective_timeout_secs >= 10,
            "algo.collective_timeout_secs",
            f"{algo.collective_timeout_secs} is below TensorFlow's 10 s heartbeat",
            "use 10 or more: below it TF 2.21 aborted the survivors in tests (docs/runtime.md)",
        )
    if isinstance(algo, PssConfig):
        _require(
            algo.steps_per_closure >= 1,
            "algo.steps_per_closure",
            f"{algo.steps_per_closure} < 1",
            "use e.g. 8 minibatches per scheduled function",
        )
    if algo.name in ("downpour_easy", "sync_lr"):
        _require(
            algo.optimizer == "sgd",
            "algo.optimizer",
            f"{algo.optimizer!r}, but {algo.name} runs plain SGD on the workers",
            "use algo.optimizer=sgd (or algo=downpour / algo=sync for other optimizers)",
        )
    if isinstance(algo, AdagConfig):
        _require(
            algo.gamma > 0,
            "algo.gamma",
            f"{algo.gamma} is not positive",
            "use e.g. 1e-4 (the thesis')",
        )
    if isinstance(algo, EasgdConfig) and algo.alpha is not None:
        _require(
            0 <= algo.alpha <= 1,
            "algo.alpha",
            f"elastic rate {algo.alpha} outside [0, 1]",
            "use e.g. 0.9 / workers, or null for that default",
        )
    if isinstance(algo, EamsgdConfig):
        _require(
            0 <= algo.momentum < 1,
            "algo.momentum",
            f"{algo.momentum} outside [0, 1)",
            "use e.g. 0.9",
        )
    if isinstance(algo, SyncLrConfig):
        _check_sync_lr(algo, counts.training_replicas)
    if isinstance(algo, MultiGpuConfig):
        _check_multi_gpu(algo, cfg)


def _check_sync_lr(algo: SyncLrConfig, replicas: int) -> None:
    if algo.lrs:
        _require(
            len(algo.lrs) == replicas,
            "algo.lrs",
            f"{len(algo.lrs)} rates for {replicas} training replicas",
            "give one rate per replica (the chief first), or [] for lr * lr_decay**i",
        )
        _require(
            all(lr > 0 for lr in algo.lrs),
            "algo.lrs",
            f"{list(algo.lrs)} has a rate <= 0",
            "use positive rates",
        )
    _require(
        0 < algo.lr_decay <= 1, "algo.lr_decay", f"{algo.lr_decay} outside (0, 1]", "use e.g. 0.5"
    )


def _check_multi_gpu(algo: MultiGpuConfig, cfg: Config) -> None:
    _require(algo.towers >= 1, "algo.towers", f"{algo.towers} < 1", "use at least 1 tower")
    _require(
        algo.device in ("cpu", "gpu"),
        "algo.device",
        f"unknown device {algo.device!r}",
        "choose cpu or gpu",
    )
    _require(
        cfg.data.batch_size >= algo.towers,
        "data.batch_size",
        f"{cfg.data.batch_size} rows cannot feed {algo.towers} towers",
        f"use a batch of at least {algo.towers} rows, or fewer towers",
    )
    if algo.device == "gpu":
        _require(
            algo.towers <= 1,
            "algo.towers",
            f"{algo.towers} GPU towers, but tfplan gives each worker task one GPU",
            "use algo.device=cpu (logical CPU towers), "
            "or another algorithm with cluster.workers=per_gpu",
        )


def _check_sync(algo: SyncConfig, replicas: int) -> None:
    _require(
        algo.backup_workers >= 0,
        "algo.backup_workers",
        f"{algo.backup_workers} < 0",
        "use 0 or more",
    )
    _require(
        algo.backup_workers < replicas,
        "algo.backup_workers",
        f"{algo.backup_workers} backups with only {replicas} training replicas",
        "keep backup_workers below the number of workers",
    )
    if algo.replicas_to_aggregate is not None:
        r = algo.replicas_to_aggregate
        _require(
            1 <= r <= replicas,
            "algo.replicas_to_aggregate",
            f"{r} but the cluster has {replicas} training replicas",
            f"use 1-{replicas}, or raise cluster.workers",
        )
        _require(
            r + algo.backup_workers == replicas,
            "algo.replicas_to_aggregate",
            f"{r} + {algo.backup_workers} backup workers != {replicas} training replicas",
            "leave replicas_to_aggregate null (= replicas - backup_workers) or make them add up",
        )
    _require(algo.run_timeout_secs > 0, "algo.run_timeout_secs", "not positive", "use e.g. 30")
    _require(algo.stop_grace_secs >= 0, "algo.stop_grace_secs", "negative", "use e.g. 5")


def _check_dynamic(cfg: Config) -> None:
    """model.dynamic and its settings (what names a layer is checked with the model)."""
    model = cfg.model
    if not model.dynamic:
        return
    _require(
        bool(model._target_),
        "model.dynamic",
        "dynamic tables are Embedding layers of your own Keras model",
        "set model._target_=my_pkg.models.build (docs/dynamic_tables.md)",
    )
    _require(model.min_count >= 1, "model.min_count", f"{model.min_count} < 1", "use 1 or more")
    _require(model.ttl_steps >= 1, "model.ttl_steps", f"{model.ttl_steps} < 1", "use e.g. 10000")
    _require(
        model.capacity is None or model.capacity >= 1,
        "model.capacity",
        f"{model.capacity} < 1",
        "use the rows each dynamic table may hold, or null for the layer's input_dim",
    )
    name = cfg.algo.name
    _require(
        name != "allreduce",
        "model.dynamic",
        f"algo={name} cannot train a dynamic table (every worker holds every table whole: "
        "there is no parameter server for the ids)",
        "use a parameter-server algorithm (algo=hogwild, downpour, pss, ...) with "
        "cluster.ps >= 1, or drop model.dynamic",
    )


def _check_model_and_data(cfg: Config, counts: RoleCounts) -> None:
    model, data = cfg.model, cfg.data
    _require(
        model.name in MODELS,
        "model.name",
        f"unknown model {model.name!r}",
        f"choose one of {', '.join(MODELS)}",
    )
    _require(
        model.name != USER_MODEL or bool(model._target_),
        "model._target_",
        "model=keras needs the callable that returns your keras.Model",
        "set model._target_=my_pkg.models.build (docs/your_model.md)",
    )
    _require(
        model.loss in LOSSES or "." in model.loss,
        "model.loss",
        f"unknown loss {model.loss!r}",
        f"choose one of {', '.join(LOSSES)}, or name your own: my_pkg.losses.fn",
    )
    for metric in model.metrics:
        _require(
            metric in METRICS,
            "model.metrics",
            f"unknown metric {metric!r}",
            f"choose from {', '.join(METRICS)}",
        )
    _require(
        "accuracy" not in model.metrics or model.loss in CLASSIFICATION_LOSSES or "." in model.loss,
        "model.metrics",
        f"accuracy needs a classification loss, not model.loss={model.loss}",
        "use model.metrics=[mae] (or mse) for regression",
    )
    _require(
        model.partition_bytes is None or model.partition_bytes >= 1,
        "model.partition_bytes",
        f"{model.partition_bytes} < 1",
        "use e.g. 67108864 (64 MiB), or null to never split a variable",
    )
    _check_dynamic(cfg)
    _require(
        all(h >= 1 for h in model.hidden),
        "model.hidden",
        f"{list(model.hidden)} has a size < 1",
        "use positive sizes",
    )
    if model.name == "cnn":
        _require(
            len(model.conv_channels) >= 1,
            "model.conv_channels",
            "empty for a cnn",
            "use e.g. [16, 32]",
        )
        _require(
            all(c >= 1 for c in model.conv_channels),
            "model.conv_channels",
            "a size < 1",
            "use positive sizes",
        )
        _require(model.dense >= 1, "model.dense", f"{model.dense} < 1", "use e.g. 64")
    _require(
        data.name in DATA_SOURCES,
        "data.name",
        f"unknown data set {data.name!r}",
        f"choose one of {', '.join(DATA_SOURCES)}",
    )
    if data.name in MNIST_SOURCES:
        _require(
            bool(data.path),
            "data.path",
            f"{data.name} needs a file path",
            "set data.path=/path/to/mnist.npz (or the IDX folder)",
        )
    if data.name in FILE_SOURCES:
        _require(
            bool(data.train),
            "data.train",
            f"data={data.name} needs your files",
            "set data.train=path, a glob ('shards/train-*') or a list of them",
        )
    _require(
        data.name != FACTORY_SOURCE or bool(data._target_),
        "data._target_",
        "data=factory needs your function that returns a tf.data.Dataset",
        "set data._target_=my_pkg.data.make (docs/your_model.md)",
    )
    _require(
        data.shard in ("auto", "file", "record", "none"),
        "data.shard",
        f"{data.shard!r} is not a sharding",
        "use auto, file, record or none",
    )
    _require(
        data.compression in (None, "", "GZIP", "ZLIB"),
        "data.compression",
        f"{data.compression!r} is not a compression",
        "use null, GZIP or ZLIB",
    )
    _require(
        data.shuffle_buffer >= 0, "data.shuffle_buffer", "negative", "use e.g. 10000 (0: none)"
    )
    _require(data.batch_size >= 1, "data.batch_size", f"{data.batch_size} < 1", "use e.g. 64")
    _require(
        0 < data.eval_fraction < 1,
        "data.eval_fraction",
        f"{data.eval_fraction} not in (0, 1)",
        "use e.g. 0.2",
    )
    _require(
        data.image_size >= 1 and data.channels >= 1,
        "data.image_size",
        "image dimensions < 1",
        "use the data set's real size",
    )
    _require(
        data.num_classes >= 2,
        "data.num_classes",
        f"{data.num_classes} < 2",
        "use the number of labels",
    )


def _check_trainer(cfg: Config, counts: RoleCounts) -> None:
    t = cfg.trainer
    _require(t.max_steps >= 1, "trainer.max_steps", f"{t.max_steps} < 1", "use e.g. 1000")
    if t.checkpoint_steps is not None:
        _require(
            t.checkpoint_steps >= 1,
            "trainer.checkpoint_steps",
            f"{t.checkpoint_steps} < 1",
            "use e.g. 200, or null",
        )
    if t.checkpoint_secs is not None:
        _require(
            t.checkpoint_secs > 0, "trainer.checkpoint_secs", "not positive", "use e.g. 60, or null"
        )
    _require(
        t.keep_checkpoints >= 1,
        "trainer.keep_checkpoints",
        f"{t.keep_checkpoints} < 1",
        "use e.g. 5",
    )
    if t.export_join_bytes is not None:
        _require(
            t.export_join_bytes >= 1,
            "trainer.export_join_bytes",
            f"{t.export_join_bytes} < 1",
            "use e.g. 4000000000 (bytes), or null for half the host's available memory",
        )
    if t.score_rows_bytes is not None:
        _require(
            t.score_rows_bytes >= 0,
            "trainer.score_rows_bytes",
            f"{t.score_rows_bytes} < 0",
            "use e.g. 67108864 (bytes: larger tables are scored by rows), 0 (all), or null (none)",
        )
    _require(t.summary_steps >= 1, "trainer.summary_steps", f"{t.summary_steps} < 1", "use e.g. 50")
    _require(t.log_steps >= 1, "trainer.log_steps", f"{t.log_steps} < 1", "use e.g. 100")
    _require(t.eval_secs > 0, "trainer.eval_secs", "not positive", "use e.g. 2")


def _check_recipe_and_rest(cfg: Config, counts: RoleCounts) -> None:
    _require(
        cfg.recipe.kind in ("builtin", "command"),
        "recipe.kind",
        f"unknown kind {cfg.recipe.kind!r}",
        "use recipe=builtin or recipe=command",
    )
    if cfg.recipe.kind == "command":
        _require(
            bool(cfg.recipe.command and cfg.recipe.command.strip()),
            "recipe.command",
            "is empty",
            'set it, e.g. recipe.command="python train.py --lr 0.1"',
        )
    _require(
        bool(_ID.match(cfg.experiment.id)),
        "experiment.id",
        f"{cfg.experiment.id!r} is not a plain name",
        "use letters, digits, '_', '-' or '.'",
    )
    _require(
        cfg.lifecycle.on_chief_failure in ("teardown", "keep"),
        "lifecycle.on_chief_failure",
        f"{cfg.lifecycle.on_chief_failure!r}",
        "use teardown or keep",
    )
    for name in cfg.recipe.env or {}:
        _require(
            bool(ENV_NAME.match(name)),
            f"recipe.env.{name}",
            "is not a valid environment variable name",
            "use letters, digits and '_', not starting with a digit",
        )


def _check_lifecycle(cfg: Config, counts: RoleCounts) -> None:
    life = cfg.lifecycle
    for role in ("ps", "chief", "worker", "evaluator"):
        policy = getattr(life.restart, role)
        _require(
            policy in RESTART_POLICIES,
            f"lifecycle.restart.{role}",
            f"unknown restart policy {policy!r}",
            f"choose one of {', '.join(RESTART_POLICIES)}",
        )
    _require(
        life.restart.backoff_limit >= 0,
        "lifecycle.restart.backoff_limit",
        f"{life.restart.backoff_limit} < 0",
        "use 0 (no restarts) or more",
    )
    _require(
        life.restart.backoff_secs >= 0, "lifecycle.restart.backoff_secs", "negative", "use e.g. 1"
    )
    _require(life.ps_grace_secs >= 0, "lifecycle.ps_grace_secs", "negative", "use e.g. 5")
    _require(
        life.evaluator_grace_secs >= 0, "lifecycle.evaluator_grace_secs", "negative", "use e.g. 120"
    )
    _require(life.stop_grace_secs >= 0, "lifecycle.stop_grace_secs", "negative", "use e.g. 5")
    _require(
        life.snapshot_secs >= 0,
        "lifecycle.snapshot_secs",
        "negative",
        "use e.g. 1 (seconds between in-memory snapshots), or 0 for none",
    )
    _require(
        life.snapshot_dir.startswith("/"),
        "lifecycle.snapshot_dir",
        f"{life.snapshot_dir!r} is not an absolute path",
        "use a folder of each ps host's memory, e.g. /dev/shm",
    )
    if life.progress_timeout_secs is not None:
        _require(
            life.progress_timeout_secs > 0,
            "lifecycle.progress_timeout_secs",
            "not positive",
            "use e.g. 120 (longer than the gap between log lines), or null",
        )
    _require(
        life.host_timeout_secs > 0, "lifecycle.host_timeout_secs", "not positive", "use e.g. 20"
    )
    _require(
        life.on_host_failure in ("replace", "fail"),
        "lifecycle.on_host_failure",
        f"{life.on_host_failure!r}",
        "use replace or fail",
    )
    if life.deadline_secs is not None:
        _require(
            life.deadline_secs > 0,
            "lifecycle.deadline_secs",
            "not positive",
            "use e.g. 3600, or null",
        )


_CHECKS: tuple[Check, ...] = (
    _check_roles,
    _check_output_mode,
    _check_memory,
    _check_warm_keep,
    _check_ports,
    _check_algo,
    _check_model_and_data,
    _check_trainer,
    _check_recipe_and_rest,
    _check_lifecycle,
)
