"""``data._target_``: the user's own function makes the ``tf.data.Dataset`` of each split.

The function is imported as every dotted ``_target_`` is (:func:`recipes.targets.import_target`),
then called with this worker's shard; what it returns is checked (a ``tf.data.Dataset`` of
batched ``(features, label)`` pairs) so that a mistake is one line naming ``data._target_``
rather than an error deep in the model or the strategy.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from recipes.config import DataConf
from recipes.errors import InputError, UserCodeError
from recipes.inputs.lazy import _tf
from recipes.inputs.specs import InputSpec
from recipes.targets import import_target


def _call_factory(data: DataConf, split: str, shard_index: int, num_shards: int, seed: int) -> Any:
    """The user's dataset of ``split`` for this shard, checked to be batched ``(features, label)``
    pairs.

    Raises:
        TargetError: ``data._target_`` names no function (:func:`recipes.targets.import_target`).
        UserCodeError: the user's module raised while it was imported.
        UserCodeError: the function raised.
        InputError: the function cannot be called so, or returned something else.
    """
    tf = _tf()
    fn = import_target(str(data.target), "data._target_")
    kwargs = dict(
        split=split,
        shard_index=shard_index,
        num_shards=num_shards,
        batch_size=data.batch_size,
        seed=seed,
        **dict(data.kwargs or {}),
    )
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as e:
        raise InputError(
            f"data._target_={data.target} cannot be called with {', '.join(kwargs)} ({e}): "
            "define make(split, shard_index, num_shards, batch_size, seed, **kwargs)"
        ) from None
    except ValueError:
        pass  # no signature (a builtin): just call it
    try:
        ds = fn(**kwargs)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's own function raised: keep its traceback
        raise UserCodeError(
            "data._target_", str(data.target), e, f"(split={split!r}) raised"
        ) from e
    if not isinstance(ds, tf.data.Dataset):
        raise InputError(
            f"data._target_={data.target}(split={split!r}) returned a {type(ds).__name__}, "
            "not a tf.data.Dataset: return batched (features, label) pairs"
        )
    spec = ds.element_spec
    if not isinstance(spec, (tuple, list)) or len(spec) != 2:
        raise InputError(
            f"data._target_={data.target}(split={split!r}) yields {_spec_text(spec)}, not "
            "(features, label) pairs: map it to (features, label)"
        )
    feats, label = spec
    if getattr(label, "shape", None) is None or not hasattr(label, "dtype"):
        raise InputError(
            f"data._target_={data.target}: the label must be one tensor, got {_spec_text(label)}"
        )
    if label.shape.rank == 0:
        raise InputError(
            f"data._target_={data.target}(split={split!r}) yields unbatched examples (the label "
            "is a scalar): end the pipeline with .batch(batch_size)"
        )
    return ds


def _spec_text(spec: Any) -> str:
    return re.sub(r"\s+", " ", str(spec))[:200]


def _shape_wo_batch(spec: Any) -> tuple[Any, ...]:
    shape = spec.shape
    if shape.rank is None:
        return ()
    return tuple(shape.as_list()[1:])


def _factory_spec(data: DataConf) -> InputSpec:
    tf = _tf()

    def build() -> InputSpec:
        ds = _call_factory(data, "train", 0, 1, data.seed)
        feats, label = ds.element_spec
        if isinstance(feats, dict):
            features = {str(n): (_shape_wo_batch(s), s.dtype.name) for n, s in feats.items()}
            single = False
        elif hasattr(feats, "dtype"):
            features = {"x": (_shape_wo_batch(feats), feats.dtype.name)}
            single = True
        else:
            raise InputError(
                f"data._target_={data.target}: features must be a tensor or a dict of "
                f"tensors, got {_spec_text(feats)}"
            )
        return InputSpec(
            features=features,
            label=data.label,
            label_shape=_shape_wo_batch(label),
            label_dtype=label.dtype.name,
            single=single,
        )

    if tf.executing_eagerly():
        return build()
    with tf.Graph().as_default():  # keep the probe's ops out of the caller's graph
        return build()
