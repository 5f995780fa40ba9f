"""The lazy TensorFlow import and the two ways the input modules keep AutoGraph out.

Every module of :mod:`recipes.inputs` takes TensorFlow from :func:`_tf`, at call time: the
planner imports the package (:func:`recipes.inputs.check_static`, the sharding) on a machine that
may have no TensorFlow, and must not pay for its import where it has one.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


def _plain_python(fn: _F) -> _F:
    """Mark ``fn`` as TensorFlow's ``do_not_convert`` does (without importing TensorFlow): a
    ``tf.function`` that calls it (ParameterServerStrategy's dataset_fn) runs it as plain Python
    instead of having AutoGraph rewrite this module on every trace."""
    fn.autograph_info__ = frozenset()  # type: ignore[attr-defined]
    return fn


def _tf() -> Any:
    import tensorflow as tf  # lazy: plan-time checks must not pay for the import

    return tf


def _plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` for ``Dataset.map`` as it is written, not converted by AutoGraph: these functions
    are tensor ops only (no Python control flow on tensors), and conversion was most of the
    tracing time of every input pipeline (measured: about a quarter of a second per process at
    start and again for the final scores; what a short sweep point waits for)."""
    plain: Callable[..., Any] = _tf().autograph.experimental.do_not_convert(fn)
    return plain
