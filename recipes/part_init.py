"""Initial values for a row range of a Keras variable, made without its whole initial value.

A split table's parts (``<path>/part_<i>``, recipes/keras_model.py) are created on their own
parameter servers. Slicing the whole variable's initial value would compute every row once
somewhere (on one ps, or in the process that builds the graph), which is exactly what a table
larger than one process cannot afford. Instead each part runs its layer's own Keras initializer
at the part's shape, on the part's device:

- initializers whose values do not depend on the shape (``RandomUniform``, ``RandomNormal``,
  ``TruncatedNormal``, ``Zeros``, ``Ones``, a scalar ``Constant``) are called at the part's shape;
- the ``VarianceScaling`` family (``GlorotUniform``, ``HeNormal``, ...) derives its spread from
  the variable's fans: the part's initializer gets the scale that gives the whole shape's
  variance at the part's shape, so the parts together are drawn from the same distribution as
  the unsplit variable;
- a random initializer gets one seed per part (the same seed would give every part the same
  rows): a new random seed when the user gave none, else one derived from theirs and the part's
  index (reproducible);
- any other initializer (``Orthogonal``, ``Identity``, the user's own) has no row-wise form:
  the part is then sliced from the whole initial value as before (:func:`rows_initializer`
  returns None), which computes the whole once.

The initializer is the layer's attribute ``<variable name>_initializer`` (``embeddings_initializer``,
``kernel_initializer``, ``bias_initializer``: Keras' own layers' convention); a variable whose
layer has none falls back to the slice too.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

__all__ = ["layer_initializers", "rows_initializer"]

# Initializers whose values at one shape are distributed as any sub-block of a larger shape.
_ROW_WISE = ("RandomUniform", "RandomNormal", "TruncatedNormal", "Zeros", "Ones")
_SEED_STRIDE = 1_000_003  # a user's seed s gives part i the seed s * stride + i (mod 2**31)


def layer_initializers(model: Any) -> dict[str, Any]:
    """The Keras initializer of each of ``model``'s trainable variables whose layer keeps it as
    ``<name>_initializer``, by the variable's path."""
    import keras

    found: dict[str, Any] = {}
    for layer in model._flatten_layers(include_self=False):  # noqa: SLF001 - no public walk
        for w in getattr(layer, "_trainable_variables", ()):
            init = getattr(layer, f"{w.name}_initializer", None)
            if isinstance(init, keras.initializers.Initializer):
                found[w.path] = init
    return found


def _fans(shape: Sequence[int]) -> tuple[int, int]:
    """(fan_in, fan_out) as Keras' ``VarianceScaling`` counts them."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = 1
    for d in shape[:-2]:
        receptive *= d
    return shape[-2] * receptive, shape[-1] * receptive


def _fan(shape: Sequence[int], mode: str) -> float:
    fan_in, fan_out = _fans(shape)
    return {"fan_in": fan_in, "fan_out": fan_out}.get(mode, (fan_in + fan_out) / 2)


def _part_seed(seed: Any, index: int) -> Optional[int]:
    """None (a new random seed) unless the user gave an integer seed."""
    return (seed * _SEED_STRIDE + index) % 2**31 if isinstance(seed, int) else None


def rows_initializer(
    init: Any, full_shape: Sequence[int], part_shape: Sequence[int], index: int
) -> Optional[Callable[..., Any]]:
    """An initializer (``f(shape, dtype)``) for part ``index`` of a variable of ``full_shape``
    whose initializer is ``init``, called with ``part_shape``; None when ``init`` has no
    row-wise form (the part is then sliced from the whole initial value)."""
    import keras

    kind = type(init).__name__
    config = init.get_config()
    seed = _part_seed(config.get("seed"), index)
    if isinstance(init, keras.initializers.VarianceScaling):
        if config.get("input_axes") is not None or config.get("output_axes") is not None:
            return None  # fans over chosen axes (EinsumDense): not counted here
        ratio = _fan(part_shape, init.mode) / _fan(full_shape, init.mode)
        scaled: Callable[..., Any] = keras.initializers.VarianceScaling(
            scale=init.scale * ratio, mode=init.mode, distribution=init.distribution, seed=seed
        )
        return scaled
    if kind in _ROW_WISE and type(init).__module__.startswith("keras"):
        if "seed" in config:
            config["seed"] = seed
        same: Callable[..., Any] = type(init).from_config(config)
        return same
    if kind == "Constant" and type(init).__module__.startswith("keras"):
        value = config.get("value")
        return init if isinstance(value, (int, float)) else None
    return None
