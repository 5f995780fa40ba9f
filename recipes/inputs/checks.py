"""The checks of the data config: :func:`check_static` at plan time (no TensorFlow),
:func:`check` on a task (one batch of each split), and :func:`explain_error` for what
TensorFlow raises while reading.

Every message is one line naming the ``data.*`` key to fix: a data mistake then costs a failed
plan, or a task that stops at once, rather than a stack trace from inside a running pipeline.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Sequence

from recipes.config import DataConf
from recipes.errors import InputError
from recipes.inputs.arrays import graph_feeds
from recipes.inputs.csv_files import _csv_field_name, _csv_plan
from recipes.inputs.files import resolve_files, source_kind
from recipes.inputs.lazy import _plain_python, _tf
from recipes.inputs.npz import _npz_table
from recipes.inputs.peek import _check_compression
from recipes.inputs.pipelines import _check_batch, _train, eval_dataset, input_spec
from recipes.inputs.specs import InputSpec
from recipes.inputs.tfrecord import _tfrecord_feats
from recipes.targets import find_target

_TF_TYPES = {"float": "float32", "int64": "int64", "string": "string", "double": "float64"}


@_plain_python
def check_static(data: DataConf, *, search_path: Sequence[str] = ()) -> None:
    """The checks that need no TensorFlow (plan time): the source exists, globs match, files
    exist, CSV headers hold the columns, npz files hold the arrays, the first TFRecord holds the
    label and the configured features (dtype and size), the factory's module can be found.
    :func:`check` does the rest.

    ``search_path`` is where the user's code will be found besides ``sys.path``: the planner
    passes ``recipe.code_dir``, which tfplan ships to the tasks but which is not on its own path.

    Raises:
        InputError: what is wrong, in one line naming the key.
        TargetError: ``data._target_`` is not a dotted path, or its module cannot be found.
    """
    kind = source_kind(data)
    _check_batch(data)
    if data.shard not in ("auto", "file", "record", "none"):
        raise InputError(f"data.shard={data.shard!r}: use auto, file, record or none")
    if kind == "memory":
        return
    if kind == "factory":
        find_target(str(data.target), "data._target_", search_path)
        return
    _check_compression(data)
    for key, value in (("data.train", data.train), ("data.eval", data.eval)):
        if key == "data.eval" and not value:
            continue
        files = resolve_files(value, key)
        if kind == "csv":
            _csv_plan(data, files, key)
        elif kind == "npz":
            _npz_table(data, files, key)
        elif kind == "tfrecord":  # the label and features against the first record's
            _tfrecord_feats(data, files, key)


@_plain_python
def explain_error(error: BaseException, data: DataConf) -> InputError:
    """A TensorFlow error raised while reading the data, as one line naming the key to fix."""
    known = explain_known_error(error, data)
    if known is not None:
        return known
    key = "data._target_" if data.target else "data.train"
    msg = " ".join(str(getattr(error, "message", None) or error).split())[:300]
    return InputError(f"{key}: reading the data failed: {type(error).__name__}: {msg}")


def explain_known_error(error: BaseException, data: DataConf) -> Optional[InputError]:
    """As :func:`explain_error` for the errors known to come from the data (a record that does
    not parse, a missing feature, a corrupted file); None for any other error (a model's own,
    say), which must not be blamed on the data."""
    if isinstance(error, InputError):
        return error
    msg = getattr(error, "message", None) or str(error)
    msg = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", msg)
    msg = re.sub(r"\s*\[\[.*", "", msg, flags=re.S)
    msg = re.sub(r"\s*\[Op:\w+\].*", "", msg, flags=re.S)
    msg = " ".join(msg.split())
    label = data.label

    def key_of(name: str) -> str:
        return f"data.features.{name}"

    m = re.search(
        r"Key: (\S+?), Index: \d+\.\s*Number of (\w+) values != expected\.\s*Values size: (\d+) but output shape: (\[[^\]]*\])",
        msg,
    )
    if m:
        name, _, size, shape = m.groups()
        return InputError(
            f"{key_of(name)}.shape={shape.replace(' ', '')}: a record holds {size} values for "
            f"{name!r}: set {key_of(name)}.shape=[{size}] (or another shape of {size} values)"
        )
    m = re.search(
        r"Key: (\S+?), Index: \d+\.\s*Data types don't match\. Data type: (\w+) but expected type: (\w+)",
        msg,
    )
    if m:
        name, have, want = m.groups()
        have, want = _TF_TYPES.get(have, have), _TF_TYPES.get(want, want)
        return InputError(
            f"{key_of(name)}.dtype={want}: a record holds {have} values for {name!r}: set "
            f"{key_of(name)}.dtype={have}"
        )
    m = re.search(r"Feature: (\S+) \(data type: \w+\) is required but could not be found", msg)
    if m:
        name = m.group(1)
        if name == label:
            return InputError(
                f"data.label={label!r}: a record has no feature {name!r}: set data.label to a feature every record has"
            )
        return InputError(
            f"data.features.{name}: a record has no feature {name!r}: give "
            f"data.features.{name}.default, or fix the name"
        )
    m = re.search(r"Field (\d+) (?:in record \d* ?)?is not a valid (\w+): (.*)", msg) or re.search(
        r"Field (\d+) is required but missing in record", msg
    )
    if m:
        name = _csv_field_name(data, int(m.group(1)))
        k = key_of(name) if name else "data.features"
        if "required" in m.group(0):
            return InputError(f"{k}: a record has an empty field {name!r}: give {k}.default")
        want = _TF_TYPES.get(m.group(2), m.group(2))
        fix = "string" if want.startswith("float") else "float32 (or string)"
        return InputError(
            f"{k}.dtype={want}: a record holds {m.group(3)!r} in column {name!r}, which does "
            f"not parse as {want}: set {k}.dtype={fix}"
        )
    m = re.search(r"Expect (\d+) fields but have (\d+) in record", msg)
    if m:
        return InputError(
            f"data.columns: a record has {m.group(2)} fields where {m.group(1)} were expected: "
            f"check data.field_delim={data.field_delim!r} and the files' rows"
        )
    key = "data._target_" if data.target else "data.train"
    if "corrupted record" in msg or "DataLoss" in type(error).__name__:
        return InputError(
            f"{key}: a file is not TFRecord data or is corrupted ({msg}): check the files and "
            f"data.compression={data.compression}"
        )
    return None


def _one_batch(make: Callable[[], Any]) -> Any:
    tf = _tf()
    if tf.executing_eagerly():
        return next(iter(make()))
    with tf.Graph().as_default():
        iterator = tf.compat.v1.data.make_initializable_iterator(make())
        element = iterator.get_next()
        with tf.compat.v1.Session() as sess:
            sess.run(iterator.initializer, graph_feeds() or None)
            return sess.run(element)


@_plain_python
def check(data: DataConf) -> InputSpec:
    """Read one training batch and one evaluation batch (eagerly, or in a private graph under
    TF1) and return the input spec; what goes wrong is a one-line :class:`InputError`.

    Raises:
        InputError: naming the data.* key and the fix.
    """
    tf = _tf()
    spec = input_spec(data)
    for split, make in (
        ("train", lambda: _train(data, 0, 1, data.seed, shuffle=False)),
        ("eval", lambda: eval_dataset(data, max_examples=data.batch_size)),
    ):
        try:
            feats, _ = _one_batch(make)
        except StopIteration:
            raise InputError(_empty(data, split)) from None
        except tf.errors.OutOfRangeError:
            raise InputError(_empty(data, split)) from None
        except tf.errors.OpError as e:
            raise explain_error(e, data) from None
        if spec.single == isinstance(feats, dict):
            raise InputError(
                f"data._target_={data.target}: split={split!r} yields "
                f"{'a dict of' if isinstance(feats, dict) else 'one'} feature tensor(s) but "
                "split='train' does not: return the same structure for both"
            )
    return spec


def _empty(data: DataConf, split: str) -> str:
    if data.target:
        return f"data._target_={data.target}(split={split!r}) yields no batch"
    key = "data.eval" if split == "eval" and data.eval else "data.train"
    return f"{key}: the files hold no record"
