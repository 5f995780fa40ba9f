"""TensorFlow's start-up noise: which task log lines tfplan leaves out of what it shows.

Importing TensorFlow prints the same few lines in every process: absl's "All log messages
before absl::InitializeLog()", the CPU instruction notice of ``cpu_feature_guard``, the oneDNN
notice, and on a CPU machine with a CUDA build of TensorFlow the ``cudart_stub`` "Could not find
cuda drivers", a ``cuInit`` that finds no GPU, "TF-TRT Warning: Could not find TensorRT" and
the cuDNN / cuFFT / cuBLAS / computation placer registration messages. The planner asks every task for
quiet (``TF_CPP_MIN_LOG_LEVEL=3``), but a ``recipe.env`` of the user's, a program of the user's
or another TensorFlow build prints them all the same: one copy per task, before every life.

This module is the one place that decides what is noise (:data:`NOISE`, plain data); every view
of the tasks' logs asks it: ``tfplan apply``'s stream, ``tfplan logs`` (with and without ``-f``),
``tfplan watch``, a sweep's ``--verbose`` stream and the "last line" of ``tfplan status``. So
they all show the same lines. It is display only: the logs on disk stay whole, and
``--all-lines`` (or ``recipe.show_tf_noise=true``) shows everything.

A line is noise only when the whole line is one of these messages (with TensorFlow's own log
prefix where TensorFlow writes one): a program's own output, and every other TensorFlow message
(a fatal one above all: an ``F`` line is never noise), is always shown.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

__all__ = [
    "HIDDEN_HINT",
    "NOISE",
    "Noise",
    "NoiseFilter",
    "is_noise",
    "noise_of",
    "shows_tf_noise",
]

HIDDEN_HINT = (
    "TensorFlow's start-up messages hidden (the task logs keep them); --all-lines or "
    "recipe.show_tf_noise=true shows them"
)

# TensorFlow's log prefix, then the source file and line, then the message:
#   2024-06-28 00:03:52.491725: I tensorflow/core/util/port.cc:110] <message>   (TF <= 2.16)
#   I0000 00:00:1795504144.178888    1098 cpu_feature_guard.cc:227] <message>   (absl, TF >= 2.17)
# Levels I, W and E only: a fatal (F) line is never noise.
_PREFIXED = re.compile(
    r"(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] |[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ )"
    r"(?:[\w.+-]+/)*(?P<file>[\w.+-]+\.cc):\d+\] (?P<message>.*?)\s*"
)


@dataclass(frozen=True)
class Noise:
    """One start-up message TensorFlow prints.

    ``message`` must match the whole message (after TensorFlow's log prefix when ``prefixed``,
    else the whole line); ``file`` is the source file that prints it, when that never changes.
    """

    name: str
    message: str
    prefixed: bool = True
    file: str | None = None

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.message)

    def matches(self, text: str, file: str | None = None) -> bool:
        if self.file is not None and file != self.file:
            return False
        return self.regex.fullmatch(text) is not None


NOISE: tuple[Noise, ...] = (
    Noise(
        "absl-initialize-log",
        r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
        r"STDERR",
        prefixed=False,
    ),
    Noise(
        "cpu-feature-guard",
        r"This TensorFlow binary is optimized to use available CPU instructions in "
        r"performance-critical operations\."
        # TF 2.4-2.8 and TF <= 2.3 said it so:
        r"|This TensorFlow binary is optimized with oneAPI Deep Neural Network Library \(oneDNN\) "
        r"to use the following CPU instructions in performance-critical operations: .*"
        r"|Your CPU supports instructions that this TensorFlow binary was not compiled to use: .*",
        file="cpu_feature_guard.cc",
    ),
    Noise(  # the second line of the notice above, printed without a prefix
        "rebuild-tensorflow",
        r"To enable the following instructions: .*, in other operations, rebuild TensorFlow with "
        r"the appropriate compiler flags\."
        r"|To enable them in other operations, rebuild TensorFlow with the appropriate compiler "
        r"flags\.",
        prefixed=False,
    ),
    Noise(
        "onednn-custom-operations",
        r"oneDNN custom operations are on\. You may see slightly different numerical results due "
        r"to floating-point round-off errors from different computation orders\. To turn them "
        r"off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`\.",
    ),
    Noise(
        "cuda-drivers",
        r"Could not find cuda drivers on your machine, GPU will not be used\.",
        file="cudart_stub.cc",
    ),
    Noise(  # only "there is no GPU here": CUDA_ERROR_UNKNOWN and the others stay shown
        "cuinit-no-gpu",
        r"(?:failed call to cuInit: (?:INTERNAL: CUDA error: Failed call to cuInit: )?"
        r"|INTERNAL: CUDA error: Failed call to cuInit: )"
        r"(?:UNKNOWN ERROR \(303\)|CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected)",
    ),
    Noise("tf-trt", r"TF-TRT Warning: Could not find TensorRT"),
    Noise(
        "factory-registered",
        r"Unable to register (?:cuDNN|cuFFT|cuBLAS) factory: Attempting to register factory for "
        r"plugin (?:cuDNN|cuFFT|cuBLAS) when one has already been registered",
    ),
    Noise(
        "computation-placer",
        r"computation placer already registered\. Please check linkage and avoid linking the "
        r"same target more than once\.",
        file="computation_placer.cc",
    ),
)

_UNPREFIXED = tuple(n for n in NOISE if not n.prefixed)
_WITH_PREFIX = tuple(n for n in NOISE if n.prefixed)


def noise_of(line: str) -> Noise | None:
    """Which of TensorFlow's start-up messages ``line`` (one line of a task's log) is, if any."""
    text = line.strip()
    if not text:
        return None
    prefixed = _PREFIXED.fullmatch(text)
    if prefixed is None:
        return next((n for n in _UNPREFIXED if n.matches(text)), None)
    message, file = prefixed.group("message"), prefixed.group("file")
    return next((n for n in _WITH_PREFIX if n.matches(message, file)), None)


def is_noise(line: str) -> bool:
    """Whether ``line`` (one line of a task's log) is one of TensorFlow's start-up messages."""
    return noise_of(line) is not None


def shows_tf_noise(source_config: Mapping[str, Any] | None) -> bool:
    """``recipe.show_tf_noise`` of a plan's ``source_config`` (or a state's ``config``);
    False where it is absent (a plan made before the key existed)."""
    config = (source_config or {}).get("config")
    recipe = config.get("recipe") if isinstance(config, Mapping) else None
    return isinstance(recipe, Mapping) and bool(recipe.get("show_tf_noise", False))


class NoiseFilter:
    """What a view of the tasks' logs shows: every line, less TensorFlow's start-up noise
    unless ``show_all``; tfplan's own lines (task ``"tfplan"``) always.

    :meth:`keeps` answers per line; ``hint_due`` is True once, after the first hidden line,
    for the view to say once that lines were hidden and how to see them (:data:`HIDDEN_HINT`).
    """

    def __init__(self, show_all: bool = False) -> None:
        self.show_all = show_all
        self.hidden = 0
        self._hinted = False
        self._lock = threading.Lock()

    def keeps(self, task: str, line: str) -> bool:
        if self.show_all or task == "tfplan" or not is_noise(line):
            return True
        with self._lock:
            self.hidden += 1
        return False

    @property
    def hint_due(self) -> bool:
        """True the first time it is asked after a line was hidden, then never again."""
        with self._lock:
            if self.hidden and not self._hinted:
                self._hinted = True
                return True
            return False
