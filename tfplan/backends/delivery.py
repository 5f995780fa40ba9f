"""TF_CONFIG of any size, for every backend: in the environment when it fits, else in a file.

Every task's TF_CONFIG lists the whole cluster, and Linux refuses to start a program when one
environment string is over MAX_ARG_STRLEN (128 KiB, about 7,000 tasks' worth). So::

    delivery = deliver(request)              # pure; the same decision for every backend
    for path, text in delivery.files.items():
        write text to path where the task runs (its workdir), before it starts
    start delivery.command with delivery.env  (not request.command / request.env)

- TF_CONFIG fits: ``env`` has it, the command is the task's own.
- It does not, and the command runs a Python interpreter (``python3 train.py``,
  ``python -m recipes.train``): the file ``<workdir>/tf_config.json`` holds it, ``env`` has
  ``TF_CONFIG_FILE`` naming it, and the command becomes ``python [its options] -c LAUNCHER
  ...``: a launcher of a dozen lines, carried in the command line itself (so nothing has to be
  shipped to the hosts, whatever the backend), reads the file into ``os.environ["TF_CONFIG"]``
  inside the program's own interpreter, then runs the script, module or ``-c`` code exactly as
  ``python`` would have (``sys.argv``, ``sys.path[0]``, ``__main__``). TensorFlow reads
  TF_CONFIG from ``os.environ``, so the program sees no difference. The variable is not
  exported to programs the task starts itself (they could not start with it); they get
  ``TF_CONFIG_FILE``.
- It does not, and the command is not Python (a shell script, a binary): the program gets
  ``TF_CONFIG_FILE`` only, and a one-line warning in its log says so (the plan warns too).

No file and no launcher for the clusters most people run: the command line stays what the
plan shows.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tfplan.backends.api import LaunchRequest
from tfplan.planning.tf_config import MAX_ARG_STRLEN, is_python

__all__ = [
    "LAUNCHER",
    "TF_CONFIG_FILE",
    "Delivery",
    "deliver",
    "launcher_command",
    "shell_bytes",
]

TF_CONFIG_FILE = "tf_config.json"  # in the task's workdir

# Runs as ``python [options] -c LAUNCHER KIND TARGET ARGS...`` (KIND: -m, -c or a script path).
LAUNCHER = """\
import os, runpy, sys
path = os.environ.get("TF_CONFIG_FILE", "")
try:
    with open(path) as config:
        os.environ["TF_CONFIG"] = config.read()
except OSError as error:
    sys.exit(f"tfplan: cannot read TF_CONFIG from TF_CONFIG_FILE={path!r}: {error}")
os.unsetenv("TF_CONFIG")  # too large to pass on: programs this one starts get TF_CONFIG_FILE
kind, target, *args = sys.argv[1:]
if kind == "-m":
    sys.argv = [target, *args]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
elif kind == "-c":
    sys.argv = ["-c", *args]
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
else:
    sys.argv = [target, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(target))
    runpy.run_path(target, run_name="__main__")
"""

# For a program that is not Python: say once, in its log, where TF_CONFIG is, then exec it.
_EXEC = (
    "echo \"tfplan: TF_CONFIG is over Linux's 128 KiB limit for one environment variable, so it "
    'is not set: read it from the file TF_CONFIG_FILE=$TF_CONFIG_FILE" >&2; exec "$@"'
)

# Interpreter options that take a value as the next word.
_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


@dataclass(frozen=True)
class Delivery:
    """How to start a task so that it gets its TF_CONFIG."""

    command: tuple[str, ...]  # what to run
    env: dict[str, str]  # what to export: TF_CONFIG, or TF_CONFIG_FILE
    files: dict[str, str] = field(default_factory=dict)  # path on the task's host -> text
    how: str = "env"  # "env", "python" (file + launcher), "file" (not Python), "none"


def deliver(request: LaunchRequest, limit: int = MAX_ARG_STRLEN, overhead: int = 0) -> Delivery:
    """How ``request`` starts with its TF_CONFIG (pure).

    Args:
        request: the task to start; ``request.tf_config`` may be empty (nothing to deliver).
        limit: the longest string the way the backend starts programs can pass (Linux's
            MAX_ARG_STRLEN for one environment string, with its NUL).
        overhead: bytes that travel in the same string as TF_CONFIG (a transport that sends
            the whole environment inside one ``sh -c`` script, as SSH does).

    Returns:
        The command, environment and files to start the task with.
    """
    env = dict(request.env)
    if not request.tf_config:
        return Delivery(request.command, env, how="none")
    if len(request.tf_config.encode()) + len("TF_CONFIG=") + 1 + overhead <= limit:
        return Delivery(request.command, {**env, "TF_CONFIG": request.tf_config})
    path = posixpath.join(request.workdir, TF_CONFIG_FILE)
    env["TF_CONFIG_FILE"] = path
    command = launcher_command(request.command)
    how = "python" if command is not None else "file"
    if command is None:
        command = ("/bin/sh", "-c", _EXEC, "tfplan-task", *request.command)
    return Delivery(command, env, {path: request.tf_config}, how)


def launcher_command(command: Sequence[str]) -> tuple[str, ...] | None:
    """``command`` run through :data:`LAUNCHER` in its own interpreter, or None when it is not
    a Python command the launcher can run (not an interpreter; no script, ``-m`` or ``-c``)."""
    if not command or not is_python(command[0]):
        return None
    options: list[str] = []
    words = list(command[1:])
    while words and words[0].startswith("-") and words[0] != "-":
        word = words.pop(0)
        if word.startswith("--"):
            options.append(word)
            if word in _OPTIONS_WITH_VALUE and words:
                options.append(words.pop(0))
            continue
        # a cluster of short options, as python parses it: "-u", "-um mod", "-Wignore", "-cCODE"
        for position, letter in enumerate(word[1:], start=1):
            rest = word[position + 1 :]
            if letter in "mc":
                if position > 1:
                    options.append(word[:position])
                target = rest or (words.pop(0) if words else None)
                if target is None:
                    return None
                return (command[0], *options, "-c", LAUNCHER, f"-{letter}", target, *words)
            if letter in "WX":
                options.append(word[: position + 1])
                value = rest or (words.pop(0) if words else None)
                if value is None:
                    return None
                options.append(value)
                break
        else:
            options.append(word)
    if not words or words[0] == "-":
        return None  # an interactive interpreter, or a program on stdin
    return (command[0], *options, "-c", LAUNCHER, "script", words[0], *words[1:])


def shell_bytes(command: Sequence[str], env: Mapping[str, str]) -> int:
    """About how many bytes ``command`` and ``env`` take as a ``sh`` script (``export K=V;``
    and the quoted words), for a transport that sends them in one string."""
    exports = sum(len(key) + len(shlex.quote(value)) + 10 for key, value in env.items())
    return exports + sum(len(shlex.quote(word)) + 1 for word in command)
