"""Pure: the model's variables, computed from the config without TensorFlow, and how they spread
over parameter servers.

Names and shapes follow ``recipes/models.py``; creation order matters because
``replica_device_setter``'s default strategy assigns variables round-robin in creation order.
"""

from __future__ import annotations

from tfplan.config.schema import DataConfig, ModelConfig
from tfplan.planning.plan import ShardingPreview, ShardPlacement, VariableSpec

__all__ = ["model_variables", "preview_of", "preview_sharding", "round_robin", "greedy_bytes"]

_FLOAT32 = 4
_INT64 = 8


def _var(name: str, *shape: int, itemsize: int = _FLOAT32) -> VariableSpec:
    size = 1
    for dim in shape:
        size *= dim
    return VariableSpec(name=name, shape=tuple(shape), bytes=size * itemsize)


def model_variables(model: ModelConfig, data: DataConfig) -> tuple[VariableSpec, ...]:
    """The global variables of the model, in creation order, global_step first.

    Names and shapes mirror ``recipes/models.py`` (``model/conv<i>/{w,b}``, then
    ``model/dense<i>/{w,b}``), so the preview matches what replica_device_setter places.
    """
    variables = [_var("global_step", itemsize=_INT64)]
    features = data.image_size * data.image_size * data.channels
    if model.name == "cnn":
        side, channels = data.image_size, data.channels
        for i, out in enumerate(model.conv_channels):
            variables += [
                _var(f"model/conv{i}/w", 3, 3, channels, out),
                _var(f"model/conv{i}/b", out),
            ]
            side, channels = (side + 1) // 2, out  # 2x2 max-pool, SAME padding
        widths = [side * side * channels, model.dense]
    elif model.name == "mlp":
        widths = [features, *model.hidden]
    else:
        widths = [features]
    widths.append(data.num_classes)
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        variables += [
            _var(f"model/dense{i}/w", fan_in, fan_out),
            _var(f"model/dense{i}/b", fan_out),
        ]
    return tuple(variables)


def round_robin(variables: tuple[VariableSpec, ...], num_ps: int) -> ShardPlacement:
    """replica_device_setter's default: the k-th variable created goes to ps k mod n."""
    assignment = {v.name: i % num_ps for i, v in enumerate(variables)}
    return _placement("round_robin", variables, assignment, num_ps)


def greedy_bytes(variables: tuple[VariableSpec, ...], num_ps: int) -> ShardPlacement:
    """TF's GreedyLoadBalancingStrategy with byte_size_load_fn: each variable, in creation
    order, to the least loaded ps (ties to the lowest index)."""
    loads = [0] * num_ps
    assignment: dict[str, int] = {}
    for variable in variables:
        target = min(range(num_ps), key=lambda k: (loads[k], k))
        assignment[variable.name] = target
        loads[target] += variable.bytes
    return _placement("greedy_bytes", variables, assignment, num_ps)


def _placement(
    strategy: str, variables: tuple[VariableSpec, ...], assignment: dict[str, int], num_ps: int
) -> ShardPlacement:
    per_ps = [0] * num_ps
    for variable in variables:
        per_ps[assignment[variable.name]] += variable.bytes
    return ShardPlacement(strategy=strategy, assignment=assignment, bytes_per_ps=tuple(per_ps))


def preview_sharding(model: ModelConfig, data: DataConfig, num_ps: int) -> ShardingPreview:
    """Both strategies side by side, so the plan can show which balances the bytes better.
    A user's model (``model._target_``) has no shapes in its config: an empty preview, which
    the engine fills from an inspection build (:func:`preview_of`)."""
    if model._target_:
        return ShardingPreview(variables=(), placements=(), source="not inspected")
    return preview_of(model_variables(model, data), num_ps)


def preview_of(
    variables: tuple[VariableSpec, ...],
    num_ps: int,
    source: str = "",
    devices: dict[str, int] | None = None,
) -> ShardingPreview:
    """The preview of known variables (creation order, ``global_step`` first) over ``num_ps``;
    ``devices``: where the device setter put each one when that is known (an inspection build:
    its round-robin also counts variables the listing leaves out)."""
    if num_ps <= 0:
        return ShardingPreview(variables=variables, placements=(), source=source)
    used = round_robin(variables, num_ps)
    if devices and all(v.name in devices for v in variables):
        used = _placement("round_robin", variables, dict(devices), num_ps)
    return ShardingPreview(
        variables=variables,
        placements=(used, greedy_bytes(variables, num_ps)),
        source=source,
    )
