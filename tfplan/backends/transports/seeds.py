"""Warm seeds: tasks forked from one process per host that has imported TensorFlow already.

A Python task spends seconds importing TensorFlow before its first line of work (about 3.7 s
of CPU on the reference machine, per process); a sweep of short points pays it for every task
of every point. A seed (:mod:`.seed_agent`) pays it once per host: it imports, then
forks each task it is asked for, and the child is the task, in its own session, process group,
workdir and log, as the shell wrapper would have started it. This module is the pure part:
which tasks a seed can start, and the records kept of seeds.

    seed = backend.start_seed(host, folder, python, env)     # a sweep, once per host
    backend.use_seeds([seed, ...])                            # each point's backend
    backend.launch(request, allocation)                       # forks when it can, else starts
    backend.stop_seed(seed)                                   # the sweep's end
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tfplan.planning.state import Allocation
from tfplan.planning.tf_config import is_python

__all__ = [
    "AGENT_DIGEST",
    "AGENT_SOURCE",
    "KEEP_ENV",
    "KEPT_RECORD",
    "WARM_DIR_ENV",
    "CLIENT_SOURCE",
    "IMPORT_TIME_ENV",
    "PRELOAD",
    "SEEDS_KEY",
    "WITHOUT_KERAS",
    "WarmSeed",
    "allocation_seeds",
    "fork_request",
    "forkable",
    "host_folder_name",
    "kept_env",
    "kept_key",
    "kept_lookup_script",
    "kept_root",
    "names_tensorflow",
    "worth_a_seed",
    "runs_python_code",
    "seed_env",
]

AGENT_SOURCE = (Path(__file__).with_name("seed_agent.py")).read_text()
AGENT_DIGEST = hashlib.sha256(AGENT_SOURCE.encode()).hexdigest()[:12]
# what a task's own step runs where the scheduler wants a step per task (Slurm)
CLIENT_SOURCE = (Path(__file__).with_name("seed_client.py")).read_text()
PRELOAD = ("tensorflow",)  # what a seed imports: the seconds every task would spend
# What a seed for tasks that never use Keras defers (seed_agent.py ``--defer``): TensorFlow's
# own import pulls in Keras 3 (``keras.src.optimizers``, 1.5 s of its 6 s of CPU here)
WITHOUT_KERAS = ("--defer", "keras")

# Read once, at import, by what the seed has imported: a task that wants other values than
# the seed was started with cannot be forked from it (it starts the usual way).
IMPORT_TIME_ENV = (
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_CPP_MIN_VLOG_LEVEL",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_USE_LEGACY_KERAS",
    "KERAS_BACKEND",
    "PYTHONHASHSEED",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
)

# Per task, never part of a seed's environment.
_PER_TASK_ENV = ("TF_CONFIG", "TF_CONFIG_FILE", "PYTHONPATH")

# What recipes/train.py sets before it imports TensorFlow when the environment leaves them
# unset: a seed started for the built-in recipes imports with the same values.
_RECIPE_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
RECIPES_MODULE = "recipes.train"


@dataclass(frozen=True)
class WarmSeed:
    """One seed process on one host, as the sweep that started it records it."""

    host: str
    pid: int
    pgid: int
    folder: str  # on the host: the agent, its log, ``ready``, ``requests/``
    python: str  # the interpreter it runs: only commands of this one are forked
    env: dict[str, str] = field(default_factory=dict)  # what it was started with
    # False: TensorFlow imported without Keras 3 (for tasks that never use it); a task that
    # does still forks from it, and imports Keras itself
    keras: bool = True
    # kept: the host's seed that outlives the run (cluster.warm_keep_secs): not stopped at
    # release, it ends by itself once idle that long; any apply on the host may fork from it
    kept: bool = False
    adopted: bool = False  # kept, and found running by this apply (an earlier run started it)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for flag in ("kept", "adopted"):  # the records of seeds that are not kept: as before
            if not data[flag]:
                data.pop(flag)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WarmSeed:
        return cls(
            str(data["host"]),
            int(data["pid"]),
            int(data["pgid"]),
            str(data["folder"]),
            str(data["python"]),
            {str(k): str(v) for k, v in dict(data.get("env") or {}).items()},
            bool(data.get("keras", True)),
            bool(data.get("kept", False)),
            bool(data.get("adopted", False)),
        )

    @property
    def agent_path(self) -> str:
        return posixpath.join(self.folder, "seed_agent.py")

    @property
    def log_path(self) -> str:
        return posixpath.join(self.folder, "seed.log")

    @property
    def ready_path(self) -> str:
        return posixpath.join(self.folder, "ready")

    @property
    def started_path(self) -> str:
        return posixpath.join(self.folder, "started")

    @property
    def requests(self) -> str:
        return posixpath.join(self.folder, "requests")


SEEDS_KEY = "seeds"  # an allocation's record of its warm seeds (Allocation.data)


def allocation_seeds(allocation: Allocation | None) -> dict[str, WarmSeed]:
    """The warm seeds an apply recorded in its allocation, by the plan's host."""
    if allocation is None:
        return {}
    seeds = [WarmSeed.from_dict(s) for s in allocation.data.get(SEEDS_KEY) or []]
    return {s.host: s for s in seeds}


def runs_python_code(command: Sequence[str]) -> bool:
    if len(command) >= 3 and command[1] == "-m":
        return True
    return len(command) >= 2 and command[1].endswith(".py") and not command[1].startswith("-")


# A program whose files never name these cannot import TensorFlow itself: a seed would only make
# it wait for an import it never does (the seed's seconds of CPU, for nothing).
_TENSORFLOW_NAMES = re.compile(rb"\b(tensorflow|keras|tf_keras)\b")
_SCAN_FILES = 200  # .py files of the script's folder read at most
_SCAN_BYTES = 1 << 20  # of each


def worth_a_seed(command: Sequence[str], workdir: str = "") -> bool:
    """Whether a seed would save this task TensorFlow's import: a Python module or script
    (``runs_python_code``) that may import TensorFlow (:func:`names_tensorflow`)."""
    if not runs_python_code(command) or not is_python(command[0]):
        return False
    if command[1] == "-m":
        return True  # a module (the built-in recipes): found on the task's path, on its host
    script = command[1]
    if not os.path.isabs(script) and workdir:
        script = os.path.join(workdir, script)
    return names_tensorflow(script)


def names_tensorflow(script: str) -> bool:
    """Whether the script, or a ``.py`` file beside it (the modules it may import), names
    ``tensorflow``, ``keras`` or ``tf_keras``. True when the script cannot be read here (it
    lives on another host only): a training program is assumed, and a seed is worth it."""
    try:
        stat = os.stat(script)
    except OSError:
        return True
    return _names_tensorflow(os.path.abspath(script), stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _names_tensorflow(script: str, mtime_ns: int) -> bool:
    folder = os.path.dirname(script)
    try:
        siblings = sorted(
            os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".py")
        )
    except OSError:
        siblings = []
    for path in [script, *[s for s in siblings if s != script][:_SCAN_FILES]]:
        try:
            with open(path, "rb") as source:
                if _TENSORFLOW_NAMES.search(source.read(_SCAN_BYTES)):
                    return True
        except OSError:
            if path == script:
                return True
    return False


def forkable(seed: WarmSeed, command: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether ``seed`` can start a task with this command and environment (pure): the seed's
    own interpreter running a module (``-m``) or a ``.py`` script, with the same values of the
    variables read at import time (:data:`IMPORT_TIME_ENV`)."""
    if not command or command[0] != seed.python or not runs_python_code(command):
        return False
    wanted = seed_env(command, env)
    return all(wanted.get(k) == seed.env.get(k) for k in IMPORT_TIME_ENV)


def seed_env(command: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The environment a seed for tasks like this one is started with (pure): the task's, less
    what is the task's own (TF_CONFIG, PYTHONPATH, TFPLAN_*: given at the fork), plus the built-in
    recipes' import-time defaults when the task runs them."""
    out = {k: v for k, v in env.items() if k not in _PER_TASK_ENV and not k.startswith("TFPLAN_")}
    if len(command) >= 3 and command[1] == "-m" and command[2] == RECIPES_MODULE:
        for key, value in _RECIPE_DEFAULTS.items():
            out.setdefault(key, value)
    return out


# -- seeds kept between runs (cluster.warm_keep_secs) -------------------------------------------
# Where a host's kept seeds live: TFPLAN_WARM_DIR of the machine running tfplan when it is set
# (the same path on every host), else a folder of the host's user in its /tmp. Each seed has a
# folder of its own, ``<root>/<host>/<key>-<token>``; ``seed.json`` there is its record, and
# ``pgid`` its process group (written by the apply that started it, once it runs).
WARM_DIR_ENV = "TFPLAN_WARM_DIR"
KEEP_ENV = "TFPLAN_WARM_KEEP_SECS"  # cluster.warm_keep_secs where that is null
KEPT_RECORD = "seed.json"


def kept_root(environ: Mapping[str, str]) -> str:
    """The kept seeds' root on a host, as a shell word (evaluated there)."""
    given = environ.get(WARM_DIR_ENV)
    if given:
        return shlex.quote(given)
    return '"/tmp/tfplan-warm-$(id -u)"'


def kept_env(
    command: Sequence[str], env: Mapping[str, str], local: Mapping[str, str] | None
) -> dict[str, str]:
    """A kept seed's environment: only what is read at import time (:data:`IMPORT_TIME_ENV`),
    so that no run's own variables reach another run's tasks; ``local``: the environment of
    tfplan's own process, whose values a task started on this machine inherits."""
    wanted = seed_env(command, env)
    out = {}
    for key in IMPORT_TIME_ENV:
        value = wanted.get(key, (local or {}).get(key))
        if value is not None:
            out[key] = value
    return out


def kept_key(host: str, python: str, env: Mapping[str, str], keras: bool) -> str:
    """Which kept seed can fork a run's tasks on ``host``: the same interpreter, import-time
    environment, Keras or not, and the same seed agent (a newer tfplan starts its own)."""
    blob = json.dumps(
        [host, python, sorted(env.items()), keras, PRELOAD, AGENT_DIGEST], separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def kept_lookup_script(root: str, host: str, key: str) -> str:
    """Print ``root <folder>`` (the host's kept-seed folder), then the record of one live,
    ready kept seed of ``key`` that is not exiting, marked adopted (its idle clock starts
    again), if there is one."""
    where = f"{root}/{host_folder_name(host)}"
    return (
        f'r={where}; printf "root %s\n" "$r"; '
        f'for f in "$r"/{key}-*/{KEPT_RECORD}; do [ -f "$f" ] || continue; d=${{f%/*}}; '
        '[ -e "$d/ready" ] && [ ! -e "$d/exiting" ] || continue; '
        'p=$(cat "$d/pgid" 2>/dev/null); '
        '[ -n "$p" ] && kill -0 -"$p" 2>/dev/null || continue; '
        ': > "$d/adopted" && cat "$f" && exit 0; done; exit 0'
    )


def host_folder_name(host: str) -> str:
    """``host`` as one folder name (a seed's folder per host)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "host"


def fork_request(
    command: Sequence[str],
    env: Mapping[str, str],
    workdir: str,
    log_path: str,
    exit_file: str,
    memory_limit: int | None = None,
    cgroup: str = "",
    env_whole: bool = False,
) -> bytes:
    """What the seed agent reads from ``requests/<token>.json``; with ``memory_limit``, the
    task enters the memory cgroup ``cgroup`` of that limit before its program runs;
    ``env_whole``: ``env`` is the task's whole environment (not added to the seed's)."""
    data: dict[str, Any] = {
        "argv": list(command),
        "env": dict(env),
        "workdir": workdir,
        "log_path": log_path,
        "exit_file": exit_file,
    }
    if memory_limit is not None:
        data.update(memory_limit=memory_limit, cgroup=cgroup)
    if env_whole:
        data["env_whole"] = True
    return json.dumps(data).encode()
