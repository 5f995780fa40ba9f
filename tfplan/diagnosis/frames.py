"""Where in the user's own code a task failed: the innermost frames of their files in its log.

A user who reads ``worker/0 failed`` needs the file and line of *their* code that raised, not
the TensorFlow internals a traceback ends in nor tfplan's own recipes. Two shapes of log hold it:

- the recipes' one line for an exception in the user's code (recipes/train.py ``_fail``)::

      error: model._target_=pkg.models.build raised KeyError: 'units' at /p/pkg/models.py:7 ...
        /p/pkg/models.py:7 in build: units = cfg['units']
        (TFPLAN_DEBUG=1 shows the whole traceback)

- a plain Python traceback, from a program of the user's own (``recipe=command``), whose frames
  are filtered here: never the standard library, an installed package (site-packages,
  dist-packages: TensorFlow, Keras, numpy), frozen or generated code, nor tfplan and its recipes.

Pure: text in, lines out (the caller reads the log).
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

__all__ = ["FRAMES", "LastError", "error_frames", "is_own_file", "last_error", "project_path"]

FRAMES = 3  # the innermost ones: where it raised, and the calls that led there

# the recipes' frame line, as recipes/errors.py ``user_frames`` writes it under ``error:``
_RECIPE_FRAME = re.compile(r"^  (?P<frame>\S.*?:\d+ in \S.*)$")
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):\s*$")
_PY_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>.+))?$')
_STDLIB = re.compile(r"/lib(?:64)?/python\d+(?:\.\d+)*/")

# tfplan's own files, as installed here and as shipped to a task (<workdir>/_code/recipes)
_TFPLAN_DIR = os.path.dirname(os.path.abspath(__file__)).rsplit(os.sep, 1)[0]
_OWN_DIRS = (_TFPLAN_DIR + os.sep, os.path.join(os.path.dirname(_TFPLAN_DIR), "recipes") + os.sep)
_SHIPPED = "/_code/"
_SHIPPED_RECIPES = _SHIPPED + "recipes/"


def is_own_file(path: str) -> bool:
    """Whether a frame's file is the user's own: not the standard library, not an installed
    package, not frozen or generated code (``<frozen runpy>``, ``<string>``), not tfplan."""
    if not path or path.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return False
    if _STDLIB.search(path) or _SHIPPED_RECIPES in path:
        return False
    return not path.startswith(_OWN_DIRS)


def project_path(path: str) -> str:
    """A path of the user's code as their project names it: apply ships a package to
    ``<workdir>/_code/<package>`` (planning/planner.py), so a task's frame
    ``/w/_code/pkg/models.py:7`` is ``pkg/models.py:7`` in the project; any other path as is."""
    _, shipped, rest = path.rpartition(_SHIPPED)
    return rest if shipped and rest else path


class LastError(NamedTuple):
    """The log's last error: its form (``error``: the recipes' ``error:`` line and its indented
    frames; ``traceback``: a Python traceback), its line (the ``error:`` line, or the
    traceback's exception line) and the user's frames behind it, innermost last."""

    form: str
    line: str
    frames: list[str]


def error_frames(output: str, limit: int = FRAMES) -> list[str]:
    """The innermost ``limit`` frames of the user's own files behind the log's last error, as
    ``path:line in function: source``, innermost last; empty when the log shows none (a
    failure inside TensorFlow, a program that printed no traceback)."""
    found = last_error(output, limit)
    return found.frames if found is not None else []


def last_error(output: str, limit: int = FRAMES) -> LastError | None:
    """The log's last error (:class:`LastError`); whichever comes last counts, the recipes'
    ``error:`` line or a Python traceback (the last one: a chained exception's outermost).
    None when the log has neither."""
    lines = [line.rstrip() for line in output.splitlines()]
    error_at = max((i for i, x in enumerate(lines) if x.startswith("error: ")), default=-1)
    traceback_at = max((i for i, x in enumerate(lines) if _TRACEBACK.match(x)), default=-1)
    if error_at < 0 and traceback_at < 0:
        return None
    if error_at > traceback_at:
        found = LastError("error", lines[error_at], _recipe_frames(lines[error_at + 1 :]))
    else:
        line, frames = _traceback_frames(lines[traceback_at + 1 :])
        found = LastError("traceback", line, frames)
    return found._replace(frames=found.frames[-limit:] if limit > 0 else [])


def _recipe_frames(after: list[str]) -> list[str]:
    frames = []
    for line in after:
        match = _RECIPE_FRAME.match(line)
        if match is None:
            break
        frames.append(match["frame"])
    return [f for f in frames if is_own_file(f.split(" in ", 1)[0].rsplit(":", 1)[0])]


def _traceback_frames(after: list[str]) -> tuple[str, list[str]]:
    """(the exception line, the user's frames) of a traceback's body."""
    frames: list[tuple[str, str, str, str]] = []  # file, line, function, source
    error = ""
    for line in after:
        match = _PY_FRAME.match(line)
        if match is not None:
            frames.append((match["file"], match["line"], match["fn"] or "", ""))
        elif line.startswith("    ") and frames and not frames[-1][3]:
            source = line.strip()
            if source and not set(source) <= set("~^ "):  # 3.11's carets under the source
                file, number, fn, _ = frames[-1]
                frames[-1] = (file, number, fn, source)
        elif line.startswith("    ") or not line.strip():
            continue
        else:
            error = line  # the exception line ends the traceback
            break
    own = [
        f"{file}:{number}" + (f" in {fn}" if fn else "") + (f": {source}" if source else "")
        for file, number, fn, source in frames
        if is_own_file(file)
    ]
    return error, own
