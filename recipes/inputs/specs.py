"""What the datasets yield, and the configured features it is made from.

:class:`InputSpec` is what the model side builds its inputs from; ``_Feat`` is one feature (or
the label) as a source module resolves it, from ``data.features`` and what the files hold. The
``data.features`` checks that need no file (dtype names, sizes) live here, so that every source
says the same thing about the same mistake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from recipes.config import DataConf, FeatureConf
from recipes.errors import InputError

DTYPES = ("float32", "float64", "int32", "int64", "string")
_ALIASES = {
    "float": "float32",
    "double": "float64",
    "int": "int64",
    "str": "string",
    "bytes": "string",
    "object": "string",
}


@dataclass(frozen=True)
class InputSpec:
    """What the model side needs to build its inputs."""

    features: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape without batch, dtype)
    label: str
    label_shape: tuple[int, ...]  # () for a scalar label
    label_dtype: str
    single: bool  # exactly one feature: datasets yield that tensor itself, not a dict


@dataclass(frozen=True)
class _Feat:
    name: str
    dtype: str
    shape: tuple[int, ...]
    default: Any = None
    key: str = ""  # the data.* key that configures it, for messages


def _conf_features(data: DataConf) -> dict[str, FeatureConf]:
    raw = data.features or {}
    if isinstance(raw, (list, tuple)):
        raw = {str(n): None for n in raw}
    out: dict[str, FeatureConf] = {}
    for name, f in raw.items():
        if f is None:
            out[str(name)] = FeatureConf()
        elif isinstance(f, FeatureConf):
            out[str(name)] = f
        elif isinstance(f, str):
            out[str(name)] = FeatureConf(dtype=f)
        elif isinstance(f, dict):
            shape = f.get("shape")
            if isinstance(shape, int):
                shape = (shape,)
            out[str(name)] = FeatureConf(
                dtype=f.get("dtype"),
                shape=None if shape is None else tuple(shape),
                default=f.get("default"),
            )
        else:
            raise InputError(
                f"data.features.{name} must be a mapping {{dtype, shape, default}}, "
                f"got {type(f).__name__}"
            )
    return out


def _dtype(name: str, dtype: Optional[str], allowed: Sequence[str] = DTYPES) -> Optional[str]:
    if dtype is None:
        return None
    d = _ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if d not in allowed:
        raise InputError(f"data.features.{name}.dtype={dtype}: use one of {', '.join(allowed)}")
    return d


def _shape(name: str, shape: Optional[Sequence[int]]) -> Optional[tuple[int, ...]]:
    if shape is None:
        return None
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise InputError(
            f"data.features.{name}.shape={shape!r}: give a list of sizes, e.g. [8]"
        ) from None
    if any(d < 0 for d in dims):
        raise InputError(
            f"data.features.{name}.shape={list(dims)}: sizes must be known (>= 0); "
            "variable-length features are not supported, pad them to a fixed length"
        )
    return dims


def _finish_spec(feats: dict[str, _Feat], label: _Feat) -> InputSpec:
    if not feats:
        raise InputError(
            f"data.features: no feature besides the label {label.name!r}: list the features"
        )
    return InputSpec(
        features={n: (f.shape, f.dtype) for n, f in feats.items()},
        label=label.name,
        label_shape=label.shape,
        label_dtype=label.dtype,
        single=len(feats) == 1,
    )


def _structure(feats: Sequence[str], label: str) -> Callable[..., Any]:
    """Maps a tuple of columns in ``(*feats, label)`` order to ``(features, label)``."""
    names = list(feats)

    def to_pair(*cols: Any) -> Any:
        if len(names) == 1:
            return cols[0], cols[-1]
        return dict(zip(names, cols[:-1], strict=True)), cols[-1]

    return to_pair


def _from_dict(feats: Sequence[str], label: str) -> Callable[[dict[str, Any]], Any]:
    names = list(feats)

    def to_pair(parsed: dict[str, Any]) -> Any:
        if len(names) == 1:
            return parsed[names[0]], parsed[label]
        return {n: parsed[n] for n in names}, parsed[label]

    return to_pair
