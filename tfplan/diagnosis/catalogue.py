"""The known failures of distributed TensorFlow: how each looks from outside, its cause, its fix.

Plain data (docs/troubleshooting.md lists every entry, and a test checks it does): a signature
(the exit status, patterns in the task's output, the host's record of an out-of-memory kill), a
cause and a fix, both one line with ``{placeholders}`` filled from the pattern's named groups and
from what tfplan knows of the task (``task``, ``host``, ``output_dir``, ``rss``, ``at_rss``, ...). The first
entry whose signature matches explains the failure; an extension appends its own
(:func:`register`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["CATALOGUE", "KnownFailure", "register"]


@dataclass(frozen=True)
class KnownFailure:
    """One known failure.

    Attributes:
        id: a stable name (``tfplan explain`` shows it; docs/troubleshooting.md is keyed by it).
        title: what it is, for the docs.
        patterns: regular expressions searched in the end of the task's output (the last error is
            at the end); any one matching is enough. Empty: the exit status alone decides.
        exit_codes: the task's exit status must be one of these (empty: any failure, that is
            anything but 0).
        needs_oom_record: the host's kernel must have recorded an out-of-memory kill in the
            task's life (``OomKill``).
        needs_never_listened: the task ran with a port and was never seen listening on it.
        needs_memory_limit: the task had a memory limit of its own (``cluster.memory``), and
            the kill's record does not say another limit or the host's memory was reached.
        user_frames_in: the log's last error shows frames of the user's own files, in this
            form: ``error`` (the recipes' ``error:`` line and its indented frames) or
            ``traceback`` (a Python traceback); fills ``{error}`` and ``{where}`` (the
            innermost frame's ``path:line``, relative to the project for code apply shipped:
            tfplan/diagnosis/frames.py). Empty: not looked at.
        catch_all: tried after every other entry (an extension's included): a broad signature
            that a specific one must win over.
        free_space_of: the folder (a template, e.g. ``{folder}``) whose free space the cause
            reports as ``{free_now}``; the caller reads it (I/O) and explains again.
        cause: one line, ``{task}``, ``{host}``, ``{output_dir}``, the pattern's named groups...
        fix: one line naming the key or command to change.
        reproduce: how the test provokes it (the docs say it).
        where: ``run`` (seen after a failure) or ``preflight`` (refused before anything starts).
    """

    id: str
    title: str
    cause: str
    fix: str
    reproduce: str
    patterns: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    needs_oom_record: bool = False
    needs_never_listened: bool = False
    needs_memory_limit: bool = False
    user_frames_in: str = ""
    catch_all: bool = False
    free_space_of: str = ""
    where: str = "run"
    _compiled: tuple[re.Pattern[str], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", tuple(re.compile(p, re.M) for p in self.patterns))

    @property
    def compiled(self) -> tuple[re.Pattern[str], ...]:
        return self._compiled


CATALOGUE: list[KnownFailure] = [
    KnownFailure(
        id="memory-limit",
        title="Killed by the kernel at the task's own memory limit (cluster.memory)",
        exit_codes=(137, -9),
        needs_oom_record=True,
        needs_memory_limit=True,
        cause="killed by the kernel on host {host}: it reached its memory limit of {limit} "
        "({limit_key})",
        fix="raise {limit_key} (a TensorFlow process alone needs about 400 MiB), or make the task "
        "use less (a smaller data.batch_size or model)",
        reproduce="a program that allocates more than its role's cluster.memory",
    ),
    KnownFailure(
        id="oom-killed",
        title="Killed by the out-of-memory killer",
        exit_codes=(137, -9),
        needs_oom_record=True,
        cause="killed by the out-of-memory killer on host {host}{at_rss}",
        fix="give the task more memory, or make it use less (a smaller data.batch_size or model, "
        "fewer tasks per host: the host's cpu_slots)",
        reproduce="a task whose memory limit (a cgroup) is below what it allocates",
    ),
    KnownFailure(
        id="disk-full",
        title="The disk is full (ENOSPC) where the task writes",
        patterns=(
            r"(?P<path>/[^\s;:'\"]+); No space left on device",
            r"\[Errno 28\] No space left on device: '(?P<path2>/[^']+)'",
            r"(?P<path3>/[^\s;:'\"]+)'?: No space left on device",
            r"No space left on device",
        ),
        free_space_of="{folder}",
        cause="{task} could not write to {folder}: its disk is full{free_now}",
        fix="free space there, set cluster.output_dir to a folder on a larger disk, or keep "
        "fewer checkpoints (the built-in recipes keep trainer.keep_checkpoints, 5 by default)",
        reproduce="an output folder on a tmpfs too small for the chief's first checkpoint",
    ),
    KnownFailure(
        id="keras3-multiworker-fit",
        title="Keras 3 and MultiWorkerMirroredStrategy in model.fit",
        patterns=(r"Attempt to convert a value \(PerReplica:",),
        cause="Keras 3 (bundled since TensorFlow 2.16) does not support "
        "MultiWorkerMirroredStrategy in fit (keras-team/keras#20585)",
        fix="set recipe.legacy_keras=true (Keras 2 from the tf_keras package, "
        "TF_USE_LEGACY_KERAS=1)",
        reproduce="TensorFlow's multi-worker Keras tutorial (MultiWorkerMirroredStrategy, "
        "model.fit) on two workers",
    ),
    KnownFailure(
        id="tf-config-ignored",
        title="A program that never read TF_CONFIG: every task trained alone",
        exit_codes=(0,),
        needs_never_listened=True,
        cause="it never listened on its port, then ended by itself: the program did not "
        "read TF_CONFIG (nor the {{ps_hosts}}/{{job_name}} placeholders), so every task "
        "trained alone",
        fix="build the cluster from TF_CONFIG (a tf.distribute strategy, or "
        "tf.distribute.cluster_resolver.TFConfigClusterResolver and a tf.distribute.Server), "
        "or pass the placeholders on recipe.command (docs/contract.md)",
        reproduce="a program that trains without looking at TF_CONFIG, as a ps and two workers",
    ),
    KnownFailure(
        id="estimator-removed",
        title="tf.estimator is gone (TensorFlow 2.16 and later)",
        patterns=(
            r"No module named '?tensorflow_estimator'?",
            r"No module named '?tensorflow\.estimator'?",
            r"module 'tensorflow' has no attribute 'estimator'",
            r"module 'tensorflow\.compat\.v1' has no attribute 'estimator'",
        ),
        cause="the program uses tf.estimator, which TensorFlow removed in 2.16",
        fix="run it with TensorFlow <= 2.15 and tensorflow-estimator: point cluster.python (or "
        "the host's python) at an interpreter that has them and start it as "
        "recipe.command='{python} your_program.py'",
        reproduce="an Estimator program (train_and_evaluate) under TensorFlow 2.16 or later",
    ),
    KnownFailure(
        id="checkpoint-shape",
        title="A checkpoint holds a variable in another shape than the model's",
        patterns=(
            r"tensor_name = (?P<key>\S+); shape in shape_and_slice spec (?P<ours>\[[\d,]*\]) "
            r"does not match the shape stored in checkpoint: (?P<theirs>\[[\d,]*\])",
        ),
        cause="the checkpoints in {output_dir} hold {key} as {theirs}, but the model's is {ours} "
        "(a table's rows or a layer's width changed since they were written)",
        fix="resume with the model they were written with (the same model.* keys: a table's "
        "input_dim too), or train the new shape under a new experiment.id; another number of "
        "parameter servers is not the cause (a split table restores into any split)",
        reproduce="an experiment trained, then applied again with a larger embedding table",
    ),
    KnownFailure(
        id="foreign-checkpoint",
        title="The output folder holds another model's checkpoints",
        patterns=(
            r"Key (?P<key>\S+) not found in checkpoint",
            r"Assign requires shapes of both tensors to match",
            r"tensor_name = (?P<key>\S+); expected compatible shape",
            r"Shapes? .* (?:are|is) incompatible.*checkpoint",
        ),
        cause="the checkpoints in {output_dir} were written by another model",
        fix="use a new experiment.id or remove them",
        reproduce="an experiment trained with one model, then applied again with another",
    ),
    KnownFailure(
        id="nan-loss",
        title="The loss became NaN",
        patterns=(
            r"loss became NaN near step=(?P<step>\d+)",
            r"NaN loss during training",
            r"Model diverged with loss = NaN",
            r"[Ll]oss (?:is|became) (?:NaN|nan)(?: at step (?P<step2>\d+))?",
        ),
        cause="the loss became NaN{at_step}",
        fix="lower the learning rate (algo.lr), or check the data for NaN or huge values",
        reproduce="a learning rate of 1e6",
    ),
    KnownFailure(
        id="missing-flag",
        title="A flag-style program started without a flag it needs",
        patterns=(
            r"error: the following arguments are required: (?P<flags>.+)",
            r"Flag --(?P<flag>[\w-]+) must (?:have a value other than None|be specified)",
            r"error: argument (?P<flag2>\S+): expected one argument",
        ),
        cause="the program needs {flags}, which recipe.command does not pass",
        fix="add it to recipe.command; {{ps_hosts}}, {{worker_hosts}}, {{job_name}} and "
        "{{task_index}} fill in each task's own values",
        reproduce="a program with a required --job_name flag, started without it",
    ),
    KnownFailure(
        id="peer-unreachable",
        title="A task cannot reach another (route, firewall, wrong address)",
        patterns=(
            r"cannot reach (?P<peer_task>\w+/\d+) at (?P<address>\S+) from",
            r"failed to connect to all addresses[^\n]*?(?:ipv4:|ipv6:)(?P<address2>\[?[\w.:]+\]?:\d+)",
            r"UnavailableError[^\n]*?(?:ipv4:|ipv6:)(?P<address3>\[?[\w.:]+\]?:\d+)",
            r"failed to connect to all addresses",
        ),
        cause="{task} on {host} cannot reach {peer}",
        fix="check the route and the firewall between the hosts (cluster.firewall opens the "
        "cluster's ports to its own hosts only) and each host's address in cluster.hosts",
        reproduce="a route to the parameter server's host dropped on a worker's host",
    ),
    KnownFailure(
        id="user-code",
        title="The user's own code raised (a model, data or loss factory of the recipes)",
        user_frames_in="error",
        catch_all=True,
        cause="{error}",
        fix="fix {where} in your project (TFPLAN_DEBUG=1 in tfplan apply's environment prints "
        "the whole traceback; +recipe.env.TFPLAN_DEBUG=1 for tasks on other hosts)",
        reproduce="a model factory (model._target_) that raises KeyError",
    ),
    KnownFailure(
        id="user-traceback",
        title="The user's own program raised (recipe=command)",
        user_frames_in="traceback",
        catch_all=True,
        cause="{error}",
        fix="fix your code at {where} (tfplan logs {task} shows the whole traceback)",
        reproduce="a program of recipe=command that raises KeyError",
    ),
    KnownFailure(
        id="gpus-missing",
        title="TensorFlow sees fewer GPUs than the plan assigns",
        where="preflight",
        cause="host {host} has {assigned} GPU(s) assigned but TensorFlow there sees {seen}",
        fix="fix the host's CUDA install (nvidia-smi, the tensorflow[and-cuda] package), or set "
        "the host's gpus to what it has",
        reproduce="a cluster that assigns one GPU on a host without one",
    ),
]


def register(entry: KnownFailure, first: bool = False) -> None:
    """Add an entry (``first``: before the built-in ones, so that it wins)."""
    if any(e.id == entry.id for e in CATALOGUE):
        raise ValueError(f"a known failure {entry.id!r} is already registered")
    CATALOGUE.insert(0, entry) if first else CATALOGUE.append(entry)
