"""A Keras 3 model as the recipes' model: the recipes own the variables, Keras does the forward pass.

Why not Keras' own training: Keras 3 (bundled since TF 2.16) has no parameter-server training
(keras-team/keras#18624) and its ``fit`` fails under MultiWorkerMirroredStrategy
(keras-team/keras#20585). Its layers still build and run in TF1 graph mode, and
``Model.stateless_call(trainable, non_trainable, inputs)`` computes a forward pass from any values
given for the model's variables. So every algorithm trains a Keras model the way it trains the
built-in ones: it creates parameter sets (the shared set on the parameter servers, local copies on a
worker, the evaluator's set) and builds forward passes from any dict of them (variables, or tensors
such as EAMSGD's look-ahead point or multi_gpu's per-tower reads). ``tf_keras`` is not needed.

- The model's parameters are its trainable variables, named by their Keras path (``dense/kernel``);
  checkpoints store them as ``model/<path>``. Keras names layers from a per-process counter
  (``dense``, ``dense_1``, ...): the counter is reset before each build so that every process, and
  every graph in one process, gives the same names.
- TF1 graph mode: the first :meth:`create_params` in a graph (the shared set, under the
  ``replica_device_setter``) builds the model itself there: its variables, with Keras' own
  initialisers, are the parameters. Later sets (worker-local copies, which the windowed algorithms
  assign from the center before the first step) are zero-initialised variables of the same shapes.
- Non-trainable state (BatchNormalization's moving statistics, dropout's seed) stays with the model's
  own variables (on the parameter servers in graph mode): a training forward pass reads them and
  assigns the values Keras returns, so every replica updates one shared copy.
- TF2 (``create_variables``): the model is built eagerly outside any strategy scope, inside
  ``keras.StatelessScope`` (``prepare``), only to learn shapes and initializers: no weight gets a
  value there, so the coordinator never holds a table; the parameters are new ``tf.Variable``
  objects created in the caller's scope from those initializers (a strategy places or mirrors
  them, and runs each initializer where it creates the variable).
- A split variable's parts are initialised each on its own device, by its layer's initializer at
  the part's shape (recipes/part_init.py): no process computes a whole table's initial value.
"""

from __future__ import annotations

import collections
import inspect
from contextlib import AbstractContextManager
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from recipes.dynamic_layers import DynamicLayer, dynamic_call, dynamic_layers, tables_reading
from recipes.dynamic_table import DynamicTable, shard_rows
from recipes.errors import ModelError, UserCodeError
from recipes.part_init import layer_initializers, rows_initializer
from recipes.sparse_lookup import Piece, fed_by, sparse_call, sparse_capable, tables_in_use

__all__ = ["KerasModel", "ModelError"]

v1 = tf.compat.v1
Params = dict[str, Any]
_EAGER = 0  # TF2: the dynamic tables of create_variables (no graph of their own)


def _reset_keras_names() -> None:
    """Keras' layer-name counter starts again, so that this build names its layers as the first
    build of a fresh process does (private API: without it names still work within one build)."""
    try:
        from keras.src.backend.common import global_state

        global_state.set_global_attribute("object_name_uids", collections.defaultdict(int))
    except ImportError:  # pragma: no cover - another Keras layout
        pass


def _tf_variable(kv: Any) -> Any:
    """The ``tf.Variable`` behind a Keras variable (what savers, device setters and
    collections know)."""
    return getattr(kv, "value", kv)


def _deferred_initializer(kv: Any) -> Optional[Callable[..., Any]]:
    """The initializer of a Keras variable made inside ``keras.StatelessScope`` that has no
    value yet (Keras keeps it to make the value later); None for a variable with a value."""
    if getattr(kv, "_value", None) is not None:
        return None
    init = getattr(kv, "_initializer", None)
    return init if callable(init) else None


def _without_values(build: Callable[[], Any]) -> Any:
    """``build()`` inside ``keras.StatelessScope``: its variables get shapes and initializers
    but no value. Keras would make every value when the scope ends, or at the end of any later
    scope (``stateless_call`` opens one): they are left out of its list of variables to
    initialise, as nothing ever reads them (forward passes get their values)."""
    import keras
    from keras.src.backend.common import global_state

    waiting = list(global_state.get_global_attribute("uninitialized_variables", []) or [])
    with keras.StatelessScope(initialize_variables=False):
        built = build()
    global_state.set_global_attribute("uninitialized_variables", waiting)
    return built


def _ids_per_example(layer: Any) -> Optional[int]:
    """How many ids one example gives ``layer`` (every call of it summed: a table shared by
    two features counts both), from the shapes it was called with; None when not known."""
    shapes = []
    for node in getattr(layer, "_inbound_nodes", ()):  # a functional or Sequential model
        tensors = getattr(node, "input_tensors", ())
        if tensors:
            shapes.append(tuple(tensors[0].shape))
    if not shapes:  # a subclassed model: the shape it was built with
        built = (getattr(layer, "_build_shapes_dict", None) or {}).get("input_shape")
        shapes = [tuple(built)] if built is not None else []
    total = 0
    for shape in shapes:
        dims = shape[1:]
        if any(d is None for d in dims):
            return None
        total += int(np.prod(dims, dtype=np.int64)) if dims else 1
    return total or None


def _mark_slice(part: Any, rows: tuple[int, int], full_shape: Any, name: str) -> None:
    """Mark ``part`` as rows ``rows`` of the logical variable ``name`` of ``full_shape``: a
    Saver then writes the parts as slices of one tensor and restores any other split of it
    (:func:`recipes.checkpoint_names.sliced_names` groups them for a Saver). ``name`` is the op
    name the variable has unsplit, because TensorFlow's slot creator names a slice's slot
    ``<name>/<slot>``: an optimizer's slots are then saved under the same names split or not."""
    full = [int(d) for d in full_shape]
    lo, hi = rows
    info = tf.Variable.SaveSliceInfo(name, full, [lo] + [0] * (len(full) - 1), [hi - lo, *full[1:]])
    part._set_save_slice_info(info)


class KerasModel:
    """Parameter sets and forward passes for the Keras model ``factory(**kwargs)`` returns.

    ``sample``: a function returning one batch of features (a tensor or a dict of them, in the
    current graph or eagerly) used to build a model that is not built yet (a Sequential without an
    ``Input``, a subclassed model).

    ``partitions`` > 1 and ``partition_bytes``: a trainable variable larger than
    ``partition_bytes`` (an embedding table, say) is split along its first axis into
    ``partitions`` parts, ``<path>/part_<i>``: separate variables, which the device setter (or
    ParameterServerStrategy) puts on separate parameter servers. A forward pass joins them.
    In graph mode each part is marked as a slice of one logical variable (TensorFlow's
    ``SaveSliceInfo``, as its own partitioned variables are): a checkpoint holds the table once,
    as ``model/<path>``, in slices, and a run with another number of parts restores its rows
    from it.
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        kwargs: Optional[dict[str, Any]] = None,
        sample: Optional[Callable[[], Any]] = None,
        key: str = "model._target_",
        partitions: int = 1,
        partition_bytes: Optional[int] = None,
        target: Optional[str] = None,
        features: Optional[Sequence[str]] = None,
        dynamic: Sequence[str] = (),
        capacity: Optional[int] = None,
        min_count: int = 1,
        ttl_steps: int = 10_000,
    ) -> None:
        self._factory = factory
        # model.dynamic: Embedding layers whose ids are raw (recipes/dynamic_table.py)
        self._dynamic_names = tuple(dynamic)
        self._dynamic_options = (capacity, int(min_count), int(ttl_steps))
        self.dynamic: dict[str, DynamicLayer] = {}  # table path -> its layer
        self._dynamic_tables: dict[int, dict[str, DynamicTable]] = {}  # id(graph) -> tables
        self._features = tuple(features) if features is not None else None
        self.unused_features: tuple[str, ...] = ()  # features no input of the model takes
        # the features the model's inputs take, and whether it takes them as a dict (by name)
        # or a list (in its inputs' order); None: it takes what it is given
        self._takes: Optional[tuple[tuple[str, ...], bool]] = None
        self._target = target or f"{factory.__module__}.{factory.__qualname__}"
        self._kwargs = dict(kwargs or {})
        self._sample = sample
        self._key = key
        self._partitions = max(1, int(partitions))
        self._partition_bytes = partition_bytes
        self.parts: dict[str, list[tuple[int, int]]] = {}  # path -> row ranges of its parts
        self._graphs: dict[int, Any] = {}  # id(graph) -> the model built in it (graph mode)
        self._eager: Any = None
        self.keys: list[str] = []  # trainable parameters' names, in the model's order
        self.state_keys: list[str] = []  # non-trainable variables' names
        # the trainable tables of plain Embedding layers, read row by row in graph mode
        # (recipes/sparse_lookup.py), with their number of rows
        self.sparse_tables: dict[str, int] = {}
        # id(built model) -> its layers' initializers by variable path (:meth:`_part_value`)
        self._initializers: dict[int, dict[str, Any]] = {}

    # -- building -------------------------------------------------------------------------
    def _build(self) -> Any:
        import keras

        _reset_keras_names()
        try:
            inspect.signature(self._factory).bind(**self._kwargs)
        except TypeError as e:
            raise ModelError(
                f"{self._key}={self._target}: cannot be called with "
                f"{', '.join(self._kwargs) or 'no argument'} ({e}): check the model.* keys"
            ) from None
        except ValueError:
            pass  # no signature to read (a builtin, a C extension): just call it
        try:
            model = self._factory(**self._kwargs)
        except Exception as e:  # noqa: BLE001 - the user's own code raised: keep its traceback
            raise UserCodeError(self._key, self._target, e) from e
        if not isinstance(model, keras.Model):
            kind = type(model).__module__ + "." + type(model).__name__
            hint = (
                " (a tf_keras model: tfplan's algorithms train Keras 3 models; import keras, "
                "not tf_keras, and unset TF_USE_LEGACY_KERAS)"
                if "tf_keras" in kind
                else ""
            )
            raise ModelError(f"{self._key} returned {kind}, not a keras.Model{hint}")
        if not model.built or not model.weights:
            if self._sample is None:
                raise ModelError(
                    f"{self._key}: the model is not built and no input is known to build it; "
                    "give it a keras.Input"
                )
            model(self._sample(), training=False)
        names = [w.path for w in model.trainable_variables]
        state = [w.path for w in model.non_trainable_variables]
        if len(set(names + state)) != len(names + state):
            raise ModelError(f"{self._key}: two variables share a name ({names + state})")
        if not names:
            raise ModelError(f"{self._key}: the model has no trainable variable")
        if self.keys and (names, state) != (self.keys, self.state_keys):
            raise ModelError(f"{self._key}: two builds gave other variables; is it deterministic?")
        self.keys, self.state_keys = names, state
        self.dynamic = {}
        for found in dynamic_layers(model, self._dynamic_names, *self._dynamic_options):
            found.layer.call = dynamic_call(found.layer, found.path, found.key_dtype)
            self.dynamic[found.path] = found
        self.parts = self._split(model)
        self.sparse_tables = self._read_sparse(model)
        self.unused_features = self._check_inputs(model)
        return model

    def _read_sparse(self, model: Any) -> dict[str, int]:
        """Give each plain Embedding layer of ``model`` with a trainable table the lookup that
        reads only the batch's rows (active during :meth:`forward` in graph mode); their tables'
        paths and row counts. Other layers that read a table keep Keras' whole-table read."""
        tables = {}
        for layer in model._flatten_layers(include_self=False):  # noqa: SLF001 - no public walk
            if not sparse_capable(layer) or layer.embeddings.path not in self.keys:
                continue
            path = layer.embeddings.path
            if path in self.dynamic:
                continue
            layer.call = sparse_call(layer, path)
            tables[path] = int(layer.embeddings.shape[0])
        return tables

    def embedding_tables(self) -> list[dict[str, Any]]:
        """Every ``keras.layers.Embedding`` of the model built in the current graph whose table
        is trained: ``name`` (``model/<path>``, as the variables are listed), ``layer``,
        ``feature`` (the model input feeding it, when one does directly), ``rows``, ``width``,
        ``bytes``, ``rows_only`` (its lookups read only the batch's rows: recipes/
        sparse_lookup.py) and ``ids_per_example`` (None when its input shape is unknown)."""
        from keras.layers import Embedding

        model = self.template()
        tables = []
        for layer in model._flatten_layers(include_self=False):  # noqa: SLF001 - no public walk
            table = getattr(layer, "embeddings", None)
            if not isinstance(layer, Embedding) or table is None or table.path not in self.keys:
                continue
            rows, width = (int(d) for d in table.shape)
            dynamic = self.dynamic.get(table.path)
            if dynamic is not None:
                rows = dynamic.settings.capacity
            tables.append(
                {
                    "name": f"model/{table.path}",
                    "layer": layer.name,
                    "feature": fed_by(layer),
                    "rows": rows,
                    "width": width,
                    "bytes": rows * width * np.dtype(table.dtype).itemsize,
                    "rows_only": table.path in self.sparse_tables,
                    "ids_per_example": _ids_per_example(layer),
                    "dynamic": None
                    if dynamic is None
                    else {
                        "capacity": dynamic.settings.capacity,
                        "shards": self._partitions,
                        "rows_per_shard": shard_rows(dynamic.settings.capacity, self._partitions),
                        "ids": dynamic.key_dtype.name,
                        "min_count": dynamic.settings.min_count,
                        "ttl_steps": dynamic.settings.ttl_steps,
                    },
                }
            )
        return tables

    def _pieces_of_tables(self, params: Params) -> dict[str, list[Piece]]:
        """Each sparse table's parts in ``params`` with the rows each holds."""
        pieces: dict[str, list[Piece]] = {}
        for path, rows in self.sparse_tables.items():
            if path in self.parts:
                pieces[path] = [
                    (params[f"{path}/part_{i}"], lo, hi)
                    for i, (lo, hi) in enumerate(self.parts[path])
                ]
            else:
                pieces[path] = [(params[path], 0, rows)]
        return pieces

    def _check_inputs(self, model: Any) -> tuple[str, ...]:
        """The model's named inputs against the data's features (a dict of them): each input
        must name a feature, or Keras maps the features to the inputs by their order (silently
        wrong) or fails on a shape naming no key. Returns the features no input takes.

        Raises:
            ModelError: an input names no feature.
        """
        struct = getattr(model, "_inputs_struct", None)  # a functional model's inputs, as given
        if self._features is None or struct is None:
            return ()  # one feature tensor, or a model that names no inputs (subclassed)
        if isinstance(struct, dict):
            names = [str(k) for k in struct]
        else:
            names = [str(getattr(t, "name", "")) for t in tf.nest.flatten(struct)]
        have = set(self._features)
        for name in names:
            if name not in have:
                raise ModelError(
                    f"{self._key}={self._target}: the model's input {name!r} is not a feature "
                    f"of the data (its features: {', '.join(sorted(have))}): name each "
                    f"keras.Input after the feature it takes (keras.Input(..., name='...'))"
                )
        self._takes = (tuple(names), isinstance(struct, dict))
        return tuple(f for f in self._features if f not in set(names))

    def _select(self, features: Any) -> Any:
        """The features the model's inputs take, in the structure it was built with: Keras
        matches a dict with other keys by position, not by name."""
        if self._takes is None or not isinstance(features, dict):
            return features
        names, by_name = self._takes
        if by_name:
            return {name: features[name] for name in names}
        return [features[name] for name in names] if len(names) > 1 else features[names[0]]

    def _split(self, model: Any) -> dict[str, list[tuple[int, int]]]:
        """Which trainable variables are partitioned, and each part's rows."""
        if self._partitions < 2 or self._partition_bytes is None:
            return {}
        parts = {}
        for w in model.trainable_variables:
            if w.path in self.dynamic:
                continue
            shape = [int(d) for d in w.shape]
            size = tf.as_dtype(w.dtype).size
            for d in shape:
                size *= d
            if shape and size > self._partition_bytes and shape[0] >= self._partitions:
                n, rows = self._partitions, shape[0]
                bounds = [rows * i // n for i in range(n + 1)]
                parts[w.path] = list(zip(bounds[:-1], bounds[1:], strict=True))
        return parts

    def sparse_table_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The tables read row by row (:meth:`_read_sparse`) of the model built in the current
        graph: path -> (the whole table's shape, its dtype's name)."""
        model = self.template()
        return {
            w.path: (tuple(int(d) for d in w.shape), np.dtype(w.dtype).name)
            for w in model.trainable_variables
            if w.path in self.sparse_tables
        }

    def table_keys(self) -> frozenset[str]:
        """The parameter keys of the tables read row by row (:meth:`_read_sparse`; a split
        table's parts), in the model built in the current graph."""
        self.template()
        keys: set[str] = {k for path in self.dynamic for k in self._dynamic_keys(path)}
        for path in self.sparse_tables:
            if path in self.parts:
                keys.update(f"{path}/part_{i}" for i in range(len(self.parts[path])))
            else:
                keys.add(path)
        return frozenset(keys)

    def param_keys(self) -> list[str]:
        """The parameter sets' keys: the trainable variables' paths, a partitioned one as its
        parts ``<path>/part_<i>``."""
        keys = []
        for k in self.keys:
            if k in self.dynamic:
                keys += self._dynamic_keys(k)
            else:
                keys += (
                    [f"{k}/part_{i}" for i in range(len(self.parts[k]))] if k in self.parts else [k]
                )
        return keys

    def _dynamic_keys(self, path: str) -> list[str]:
        """The parameter keys of a dynamic table's shards, one per parameter server."""
        return [f"{path}/shard_{i}" for i in range(self._partitions)]

    def _pieces(self, w: Any) -> list[tuple[str, Optional[tuple[int, int]]]]:
        if w.path in self.dynamic:
            rows = shard_rows(self.dynamic[w.path].settings.capacity, self._partitions)
            return [(key, (0, rows)) for key in self._dynamic_keys(w.path)]
        if w.path not in self.parts:
            return [(w.path, None)]
        return [(f"{w.path}/part_{i}", rows) for i, rows in enumerate(self.parts[w.path])]

    def _graph_model(self) -> Optional[Any]:
        return self._graphs.get(id(v1.get_default_graph()))

    def template(self) -> Any:
        """The model built in the current graph (TF1 graph mode) or eagerly (TF2, also when
        asked from inside a ``tf.function``: the eager build of :meth:`prepare`)."""
        if v1.executing_eagerly_outside_functions():
            if self._eager is None:
                if not tf.executing_eagerly():
                    raise ModelError(
                        f"{self._key}: the model must be built before tracing (prepare())"
                    )
                self._eager = self._build()
            return self._eager
        model = self._graph_model()
        if model is None:
            model = self._graphs[id(v1.get_default_graph())] = self._build()
        return model

    # -- parameters -----------------------------------------------------------------------
    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        model = self.template()
        shapes = []
        for w in model.trainable_variables:
            shape = tuple(int(d) for d in w.shape)
            for key, rows in self._pieces(w):
                shapes.append((key, shape if rows is None else (rows[1] - rows[0], *shape[1:])))
        return shapes

    def create_params(
        self,
        collections: Optional[list[str]] = None,
        trainable: bool = True,
        skip: Collection[str] = (),
    ) -> Params:
        """Graph mode: a parameter set in the current device and variable scope. The first set of
        a graph is the model's own variables (built here); later ones are zero-initialised
        variables ``<scope>/model/<path>`` in ``collections``, all but the keys in ``skip``."""
        first = self._graph_model() is None
        model = self.template()
        if first and collections is None:
            return self._shared_params(model)
        params: Params = {}
        rows_of = {k: r for w in model.trainable_variables for k, r in self._pieces(w)}
        full_shapes = {w.path: w.shape for w in model.trainable_variables}
        with v1.variable_scope("model"):
            for key, shape in self.param_shapes():
                if key in skip:
                    continue
                params[key] = v1.get_variable(
                    key,
                    shape=shape,
                    dtype=tf.as_dtype(self._dtypes(model)[key]),
                    initializer=v1.zeros_initializer(),
                    collections=collections,
                    trainable=trainable,
                    use_resource=True,
                )
                rows = rows_of.get(key)
                if rows is not None and "/part_" in key:  # a dynamic table's shards: no slices
                    whole = params[key].op.name.rsplit("/part_", 1)[0]  # its name unsplit
                    _mark_slice(params[key], rows, full_shapes[key.rsplit("/part_", 1)[0]], whole)
        return params

    def _dtypes(self, model: Any) -> dict[str, Any]:
        return {key: w.dtype for w in model.trainable_variables for key, _ in self._pieces(w)}

    def _shared_params(self, model: Any) -> Params:
        """The first set of a graph: the model's own variables, except that a partitioned one
        is replaced by its parts (new variables, in creation order, each initialised on its own
        device by :meth:`_part_value`; the whole variable leaves the collections, so it is never
        initialised, saved or placed in memory)."""
        params: Params = {}
        graph = v1.get_default_graph()
        for w in model.trainable_variables:
            var = _tf_variable(w)
            if w.path in self.dynamic:
                params.update(self._create_dynamic(model, w))
            elif w.path in self.parts:
                params.update(self._part_params(model, w, var))
            else:
                params[w.path] = var
                continue
            for name in (v1.GraphKeys.GLOBAL_VARIABLES, v1.GraphKeys.TRAINABLE_VARIABLES):
                ref = graph.get_collection_ref(name)
                ref[:] = [v for v in ref if v is not var]
        return params

    def _create_dynamic(
        self,
        model: Any,
        w: Any,
        colocate: Optional[Callable[[Any], AbstractContextManager[Any]]] = None,
    ) -> Params:
        """A dynamic table in the current graph (TF2: eagerly, its variables beside their rows
        by ``colocate``), in place of ``w`` (its Keras variable, never initialised): its
        shards' rows by parameter key."""
        found = self.dynamic[w.path]
        table = DynamicTable(
            f"model/{w.path}",
            found.settings,
            found.width,
            w.dtype,
            found.key_dtype,
            self._partitions,
            getattr(found.layer, "embeddings_initializer", None),
            colocate,
        )
        key = _EAGER if v1.executing_eagerly_outside_functions() else id(v1.get_default_graph())
        self._dynamic_tables.setdefault(key, {})[w.path] = table
        return table.params(w.path)

    def table_maintenance(self) -> Optional[tuple[Any, Any]]:
        """The dynamic tables of the current graph's maintenance (build it after the
        optimizer: it resets the freed rows' slots): whether each shard is due (a
        ``[tables x shards]`` bool tensor, no lock taken), and the eviction itself
        (a ``[tables, shards, 2]`` tensor of rows evicted and resident); None without dynamic
        tables."""
        tables = self.dynamic_tables()
        if not tables:
            return None
        paths = sorted(tables)
        due = tf.concat([tables[p].maintenance_due() for p in paths], axis=0)
        return due, tf.stack([tables[p].maintenance() for p in paths])

    def dynamic_state(self) -> Params:
        """The dynamic tables' variables beside their rows in the current graph (ids, last
        seen steps, free rows, counters), by checkpoint name: what a reader of a checkpoint
        restores with the parameters to look ids up."""
        tables = self.dynamic_tables()
        return {v.op.name: v for path in sorted(tables) for v in tables[path].state_variables()}

    def dynamic_tables(self) -> dict[str, DynamicTable]:
        """The dynamic tables of the current graph (TF2: of :meth:`create_variables`, also
        inside a ``tf.function``), by path."""
        if v1.executing_eagerly_outside_functions():
            return dict(self._dynamic_tables.get(_EAGER, {}))
        return dict(self._dynamic_tables.get(id(v1.get_default_graph()), {}))

    def dynamic_paths(self) -> list[str]:
        """The dynamic tables' paths, in :meth:`table_maintenance`'s order."""
        return sorted(self.dynamic)

    def _part_params(self, model: Any, w: Any, var: Any) -> Params:
        """The parts of the split variable ``w`` (``var``), by parameter key."""
        params: Params = {}
        for key, rows in self._pieces(w):
            assert rows is not None  # a partitioned variable's pieces have row ranges
            params[key] = tf.Variable(
                self._part_value(model, w, rows), name=f"model/{key}", trainable=True
            )
            _mark_slice(params[key], rows, var.shape, var.op.name)
        return params

    def _part_value(self, model: Any, w: Any, rows: tuple[int, int]) -> Any:
        """The initial value of rows ``rows`` of ``w`` as a function that ``tf.Variable`` calls
        where it creates the part (on the part's parameter server, beside its variable): its
        layer's initializer at the part's shape (recipes/part_init.py), so no process computes
        the whole table. An initializer with no row-wise form: the rows of ``w``'s whole
        initial value, a tensor computed once, whole, where the graph's non-variable ops run
        (the chief's process under the device setter)."""
        full = [int(d) for d in w.shape]
        lo, hi = rows
        shape = [hi - lo, *full[1:]]
        if id(model) not in self._initializers:  # one walk of the layers per model
            self._initializers[id(model)] = layer_initializers(model)
        init = self._initializers[id(model)].get(w.path) or _deferred_initializer(w)
        index = self.parts[w.path].index(rows)
        part_init = None if init is None else rows_initializer(init, full, shape, index)
        dtype = w.dtype
        if part_init is not None:
            return lambda: tf.convert_to_tensor(part_init(shape, dtype=dtype))
        # computed whole where the graph is built, or eagerly here (as before item 1)
        whole_init = _deferred_initializer(w)
        if whole_init is not None:  # a stateless build (prepare): the variable has no value
            return lambda: tf.convert_to_tensor(whole_init(full, dtype=dtype))[lo:hi]
        whole = _tf_variable(w)
        return whole[lo:hi] if tf.executing_eagerly() else whole.initial_value[lo:hi]

    def _initial_value(self, w: Any) -> Any:
        """TF2: the initial value of a whole variable of the eager build: its initializer, run
        where the strategy creates the variable, when the build made no value (:meth:`prepare`);
        else its value."""
        init = _deferred_initializer(w)
        if init is None:
            return w.numpy()
        shape, dtype = [int(d) for d in w.shape], w.dtype
        return lambda: tf.convert_to_tensor(init(shape, dtype=dtype))

    def state_variables(self) -> Params:
        """The model's non-trainable variables (graph mode: of the current graph's model)."""
        model = self.template()
        return {w.path: _tf_variable(w) for w in model.non_trainable_variables}

    def prepare(self) -> None:
        """TF2: build the model eagerly now, outside any strategy's scope, inside
        ``keras.StatelessScope``: its variables carry shapes and initializers but no value (they
        must not be distributed, and the coordinator must not hold a table that the parameter
        servers serve). Call before entering the strategy's scope; :meth:`create_variables`
        then makes each variable where the strategy places it, from its initializer."""
        if self._eager is None:
            self._eager = _without_values(self._build)

    def create_variables(
        self, colocate: Optional[Callable[[Any], AbstractContextManager[Any]]] = None
    ) -> Params:
        """TF2: the parameters as new ``tf.Variable`` objects in the current (strategy) scope,
        holding the initial values of the eager build (:meth:`prepare`); a split variable's
        parts are initialised where the strategy places them (:meth:`_part_value`), not copied
        from the eager build. A dynamic table's shards: each shard's rows where the strategy
        puts the next variable (ParameterServerStrategy: the next ps, round robin), its other
        variables beside them by ``colocate`` (the strategy's ``colocate_vars_with``)."""
        model = self.template()
        if self.dynamic and colocate is None:
            raise ModelError(
                "model.dynamic: a dynamic table needs parameter servers: train it with "
                "algo=pss or a parameter-server algorithm (hogwild, downpour, ...)"
            )
        params: Params = {}
        self._dynamic_tables.pop(_EAGER, None)  # an earlier call's
        for w in model.trainable_variables:
            if w.path in self.dynamic:
                params.update(self._create_dynamic(model, w, colocate))
                continue
            for key, rows in self._pieces(w):
                value = self._initial_value(w) if rows is None else self._part_value(model, w, rows)
                params[key] = tf.Variable(value, name=f"model/{key}", trainable=True)
        return params

    def create_state_variables(self) -> Params:
        """TF2: the non-trainable state as new variables in the current scope."""
        model = self.template()
        # In a strategy's replica context an update needs an aggregation: the replicas' mean
        # for statistics (a batch norm's), the first replica's value for integers (a seed).
        return {
            w.path: tf.Variable(
                self._initial_value(w),
                name=f"model/{w.path}",
                trainable=False,
                aggregation=tf.VariableAggregation.MEAN
                if tf.as_dtype(w.dtype).is_floating
                else tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            for w in model.non_trainable_variables
        }

    # -- forward --------------------------------------------------------------------------
    def _reads_rows(self) -> bool:
        """Whether the lookups read only the batch's rows here (see :meth:`forward`)."""
        if not v1.executing_eagerly_outside_functions():
            return True  # TF1 graph mode
        if tf.executing_eagerly() or not tf.distribute.has_strategy():
            return False
        return isinstance(tf.distribute.get_strategy(), tf.distribute.ParameterServerStrategy)

    def _table_values(self, params: Params, stand_ins: Mapping[str, Any]) -> list[Any]:
        """The trainable values for ``stateless_call``, a split table's parts joined; a table
        in ``stand_ins`` is a stand-in of its shape instead, which reads nothing. Why: inside a
        ``tf.function`` a variable read that feeds anything must run (automatic control
        dependencies), so joining the parts would move every row to the worker at each step even
        though the lookups never use the join; a stand-in nothing uses is pruned."""
        values = []
        for k in self.keys:
            if k in self.dynamic:  # read through its table; this stand-in is never run
                shape = [int(d) for d in self.dynamic[k].layer.embeddings.shape]
                values.append(tf.zeros(shape, self.dynamic[k].layer.embeddings.dtype))
            elif k in stand_ins:
                rows = sum(hi - lo for _, lo, hi in stand_ins[k])
                first = stand_ins[k][0][0]
                values.append(tf.zeros([rows, *first.shape[1:]], first.dtype))
            elif k in self.parts:
                parts = [params[f"{k}/part_{i}"] for i in range(len(self.parts[k]))]
                values.append(tf.concat(parts, axis=0))
            else:
                values.append(params[k])
        return values

    def _dynamic_reading(
        self, params: Params, training: bool
    ) -> dict[str, tuple[DynamicTable, list[Any], bool]]:
        """What each dynamic table reads in a forward pass from ``params``."""
        if not self.dynamic:
            return {}
        tables = self.dynamic_tables()
        missing = sorted(set(self.dynamic) - set(tables))
        if missing:
            raise ModelError(
                f"model.dynamic: the table {missing[0]!r} exists only in TF1 graph mode with its "
                "parameter set made first (create_params)"
            )
        return {
            path: (table, [params[k] for k in self._dynamic_keys(path)], training)
            for path, table in tables.items()
        }

    def forward(
        self,
        params: Params,
        features: Any,
        training: bool,
        state: Optional[Params] = None,
    ) -> Any:
        """The model's outputs for ``features``, computed from ``params`` (variables or tensors,
        by name). ``state``: the non-trainable values to read and (when training) update; default
        the model's own. Training updates (moving statistics, the dropout seed) run with the
        outputs."""
        model = self.template()
        missing = [k for k in self.param_keys() if k not in params]
        if missing:
            raise ModelError(f"{self._key}: no value for {missing[:3]}")
        state_vars = self.state_variables() if state is None else state
        non_trainable = [state_vars[k] for k in self.state_keys]
        # The Embedding layers read only their batch's rows, where the table lives: in graph
        # mode (the TF1 algorithms: the whole tables given to stateless_call are never run, the
        # session prunes them) and in pss's functions (tables on the ps). Elsewhere (allreduce's
        # local replicas, eager evaluation) they read whole tables as before.
        pieces = self._pieces_of_tables(params) if self._reads_rows() else {}
        in_function = bool(pieces) and v1.executing_eagerly_outside_functions()
        trainable = self._table_values(params, stand_ins=pieces if in_function else {})
        dynamic = self._dynamic_reading(params, training)
        with tables_in_use(pieces), tables_reading(dynamic):
            outputs, new_state = model.stateless_call(
                trainable, non_trainable, self._select(features), training=training
            )
        if in_function and any(
            t.consumers() for k, t in zip(self.keys, trainable, strict=True) if k in pieces
        ):
            # something besides the lookups read a table whole (a layer using
            # ``embeddings`` itself): built again on the real values, which it then gets
            trainable = self._table_values(params, stand_ins={})
            with tables_in_use(pieces):
                outputs, new_state = model.stateless_call(
                    trainable, non_trainable, self._select(features), training=training
                )
        if not training or not non_trainable:
            return outputs
        updates = [
            var.assign(new)
            for var, new in zip(non_trainable, new_state, strict=True)
            if hasattr(var, "assign") and new is not var
        ]
        if tf.executing_eagerly():
            return outputs
        with tf.control_dependencies(updates):
            return tf.nest.map_structure(tf.identity, outputs)
