"""What a TensorFlow error raised while training means, for the TF1 replicas and the TF2
strategies alike: the input's fault as a one-line :class:`~recipes.errors.InputError`, or the
first telling line of TensorFlow's many."""

from __future__ import annotations

import re

import tensorflow as tf

from recipes.config import RunConfig
from recipes.errors import InputError
from recipes.inputs import explain_known_error
from recipes.sparse_lookup import out_of_range_error

__all__ = ["first_line", "input_failure"]


def input_failure(e: Exception, cfg: RunConfig, gs: int) -> Exception:
    """A TensorFlow error while training: the input's fault (a record that does not parse, a
    factory's dataset that ended, an id outside its embedding table) as a one-line InputError,
    else the error itself."""
    if isinstance(e, (tf.errors.OutOfRangeError, StopIteration)):
        return InputError(
            f"the training data ended at step={gs}: a data._target_ dataset must repeat, or "
            "yield at least trainer.max_steps batches"
        )
    out_of_range = out_of_range_error(getattr(e, "message", None) or str(e))
    if out_of_range:
        return InputError(out_of_range)
    return explain_known_error(e, cfg.data) or e


def first_line(e: BaseException) -> str:
    """The first telling line of an error message (TF's run to dozens of lines and start with
    generic ones such as "Graph execution error:"), at most 200 characters."""
    generic = (
        "Graph execution error",
        "Detected at node",
        "<stack traces",
        "File ",
        "Node: ",
        "From /job:",
    )
    for line in str(e).splitlines():
        # a status code before the text ("RESOURCE_EXHAUSTED: From /job:worker/...:") hides
        # whether the rest is generic
        line = re.sub(r"^[A-Z][A-Z_]+:\s*", "", line.strip())
        framing = not any(c.isalnum() for c in line)  # "=====" around TF's framed messages
        if line and not framing and not line.startswith(generic) and "root error(s)" not in line:
            return line[:200]
    return type(e).__name__
