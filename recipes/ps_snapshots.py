"""In-memory snapshots: each parameter server's variables saved from that ps, every second or so,
into its own host's shared memory, so that a ps that dies comes back with seconds of training lost
instead of everything since the last checkpoint.

How (TF1 replicas; the chief drives it):
- one ``Saver`` per ps, over the global variables placed on that ps (the model's rows, the
  optimizer's slots, the global step where it lives), built under ``tf.device(<that ps>)``: its
  ``SaveV2`` and ``RestoreV2`` run on the ps and read and write that ps's own file system. No
  variable is gathered into the chief, whatever the table's size;
- the files go to ``<folder>/tfplan-snapshots-<job>/ps<k>/<slot>/snapshot`` on the ps's host
  (``folder``: ``lifecycle.snapshot_dir``, by default ``/dev/shm``, memory that outlives the ps
  process; ``<job>``: a digest of the output folder, so that two jobs never share one). Two slots
  taken in turn: a snapshot being written never destroys the last complete one;
- with two or more ps (``lifecycle.snapshot_copies``), a copy of each ps's snapshot on the next
  ps's host, ``ps<k+1>/<slot>/copy-of-ps<k>``: a second ``Saver`` over ps ``k``'s variables
  placed on ps ``k+1`` (its ``SaveV2`` pulls them over the network and writes there), so a ps
  whose whole host is lost comes back from it (chain replication, as in the Parameter Server
  paper's server ranges);
- a ps holding tables writes a full snapshot, then deltas beside it in the same slot: only the
  rows of its tables changed since its last snapshot, every other variable whole
  (recipes/snapshot_deltas.py); the next full one goes to the other slot;
- beside each, a ``.meta`` file (the ps, the chief's run, the snapshot's number, the global step,
  when, the job's number of ps, the deltas after the full snapshot): emptied before a full
  snapshot's files are written, written once they are complete. A chief
  that took no snapshot of a ps that comes back empty (the cluster restarted whole, re-planned
  around a lost host) reads them on each ps's host and its peer's, and restores from the newest
  snapshot every restarted ps has, when it is newer than the last checkpoint (a later step,
  taken after the checkpoint was written);
- :class:`SnapshotHook` starts one snapshot of every ps (one ``session.run``, the ps saving in
  parallel) every ``lifecycle.snapshot_secs`` on a thread of its own: a training step never
  waits for it. The chief remembers, per ps, the last snapshot that completed and the global
  step read in the same run;
- when a ps comes back empty (restarted, or its standby took over), the chief's session creator
  (recipes/runtime.py) restores that ps alone: from its snapshot when it is at least as new as the
  last checkpoint, else from the checkpoint; the other ps keep their live values. A snapshot that
  cannot be read (gone with its host, another shape) falls back to the checkpoint, in one line;
- a ps makes its folder as it starts and removes it as it ends its job. One stopped (SIGTERM: a
  teardown, a re-planned cluster) or killed leaves it, for the job's next chief or the ps's
  restart; tfplan removes what is left when it gives the hosts back.

What a snapshot costs training is bounded: the chief's hooked runs see the global step, so the
hook measures the job's step rate while snapshots run and between them; the interval widens until
the steps the snapshots cost are at most :data:`OVERHEAD_BUDGET` of the training
(``interval >= COST_FACTOR x slowdown x duration / OVERHEAD_BUDGET``: :data:`COST_FACTOR` for
what a snapshot costs after it, measured; and never under :data:`MIN_GAP_FACTOR` times a
snapshot's duration), said once. A small model's snapshot (milliseconds, training hardly
slower meanwhile) keeps ``lifecycle.snapshot_secs``; a large table's, which slows every ps while
its rows are written and copied, is taken less often (a synchronous job's rounds wait for each
snapshot: its slowdown is the whole pause).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

import tensorflow as tf

from recipes.failures import first_line
from recipes.snapshot_deltas import Chain, RowDeltas, delta_prefix, deltas_pattern
from recipes.snapshot_paths import RECOVERIES_FILE, TABLE_BYTES, snapshot_folder
from recipes.streamed_saver import streamed_saver

__all__ = [
    "PsSnapshots",
    "Snapshot",
    "SnapshotFolder",
    "SnapshotHook",
    "snapshot_folder",
]

v1 = tf.compat.v1
SLOTS = ("a", "b")
OVERHEAD_BUDGET = 0.05  # the share of training's steps the snapshots may cost
# A margin on the slowdown read while snapshots run, which misses what they cost around them
# (a job's first snapshot sets up its graphs on every ps; the ps' freshly written memory): on
# the CTR model (HOGWILD!, 2 cores, jobs of 30 s) 0.89x without it (22 snapshots a job), 0.94x
# with it (7-12), docs/bench_snapshots.md. Its price: the interval, and what a lost ps loses,
# twice as long where snapshots cost anything.
COST_FACTOR = 2.0
MIN_GAP_FACTOR = 2.0  # a snapshot taking d seconds is taken at most every MIN_GAP_FACTOR * d
SAVE_TIMEOUT_MS = 60_000  # a snapshot not written in this long counts as failed
ROUND_WAIT_SECS = 30.0  # for a synchronous round being applied to end before a snapshot
CANCELLED_IN_A_ROW = 2  # snapshots cancelled in a row on an open session: a failure, said


@dataclass(frozen=True)
class SnapshotFolder:
    """A ps's own snapshot folder, on its host: made as it starts (``SaveV2`` makes no folder),
    kept by a kill (the ps's restart reads the last snapshot from it), removed as the ps ends
    its job or is stopped (SIGTERM)."""

    folder: str
    output_dir: str
    ps_index: int

    @property
    def path(self) -> str:
        return snapshot_folder(self.folder, self.output_dir, self.ps_index)

    def prepare(self, log: Callable[[str], None] = print) -> None:
        try:
            for slot in SLOTS:
                os.makedirs(os.path.join(self.path, slot), exist_ok=True)
        except OSError as e:  # the chief's first snapshot says it too, once
            log(f"ps/{self.ps_index}: no snapshot folder {self.path}: {e.strerror}")

    def remove(self) -> None:
        """What a ps does as it ends: its snapshots are of no use once it is gone for good."""
        shutil.rmtree(self.path, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(self.path))  # the job's folder, once its last ps is gone
        except OSError:
            pass


@dataclass(frozen=True)
class Snapshot:
    """One complete snapshot of one ps, and where it can be read: ``places`` in the order tried,
    each ``(ps, prefix)``: the files' prefix on the host of that ps (the ps's own, then the copy
    on its peer's host)."""

    places: tuple[tuple[int, str], ...]
    step: int  # the global step read in the run that wrote it
    taken: float  # time.time() when it completed
    deltas: int = 0  # the chain's deltas after its base (recipes/snapshot_deltas.py)

    @property
    def prefix(self) -> str:
        return self.places[0][1]

    def describe(self) -> str:
        age = max(0.0, time.time() - self.taken)
        return f"snapshot of step {self.step:,} ({age:.1f} s old)"


@dataclass(frozen=True)
class _Meta:
    """What a snapshot's ``.meta`` file beside its files says: written once the files are
    complete, emptied before they are written again, so a reader never takes a half-written
    snapshot for a whole one."""

    ps: int
    run: str  # the chief that took it
    generation: int  # its count of snapshots taken (every ps's of one run share it)
    step: int
    taken: float
    ps_count: int  # the job's number of ps (another splits its variables otherwise)
    deltas: int = 0  # the deltas after the base in this slot (recipes/snapshot_deltas.py)

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @staticmethod
    def decode(data: bytes) -> Optional[_Meta]:
        try:
            raw = json.loads(data.decode())
            return _Meta(
                int(raw["ps"]),
                str(raw["run"]),
                int(raw["generation"]),
                int(raw["step"]),
                float(raw["taken"]),
                int(raw["ps_count"]),
                int(raw.get("deltas", 0)),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None  # emptied (being written) or not ours


class _HostFiles:
    """Small file ops placed on one ps (so on its host's files): two writes (its own snapshot's
    ``.meta`` and that of the copy it holds), a read, a listing, and the emptying of every file
    that matches some patterns (a slot's old deltas, before a full snapshot is written there)."""

    def __init__(self, ps: int) -> None:
        with v1.device(f"/job:ps/task:{ps}"):
            self.names = [v1.placeholder(tf.string, [], name=f"meta_name_ps{ps}_{i}") for i in "ab"]
            self.datas = [v1.placeholder(tf.string, [], name=f"meta_data_ps{ps}_{i}") for i in "ab"]
            self.writes = [
                tf.io.write_file(n, d) for n, d in zip(self.names, self.datas, strict=True)
            ]
            self.name = v1.placeholder(tf.string, [], name=f"meta_read_ps{ps}")
            self.read = tf.io.read_file(self.name)
            self.pattern = v1.placeholder(tf.string, [], name=f"meta_pattern_ps{ps}")
            self.listing = tf.io.matching_files(self.pattern)
            self.patterns = v1.placeholder(tf.string, [None], name=f"empty_patterns_ps{ps}")
            self.empty = _empty_matching(self.patterns)


def _empty_matching(patterns: Any) -> Any:
    """An op that empties every file matching ``patterns`` (TensorFlow has no op that removes
    a file: an empty one takes no memory)."""
    names = tf.io.matching_files(patterns)

    def empty_one(i: Any) -> Any:
        with tf.control_dependencies([tf.io.write_file(names[i], "")]):
            return i + 1

    return tf.while_loop(lambda i: i < tf.size(names), empty_one, [tf.constant(0)])


def _ps_index(device: str) -> Optional[int]:
    spec = tf.DeviceSpec.from_string(device or "")
    return spec.task if spec.job == "ps" and spec.task is not None else None


class PsSnapshots:
    """The snapshot and restore ops of every ps, and the chief's record of the last snapshot of
    each. Build it in the chief's graph before the graph is finalised.

    With ``copies`` (and at least two ps) each ps's snapshot is also written on the next ps's
    host (``ps{k+1}/<slot>/copy-of-ps{k}``: a ``Saver`` over ps ``k``'s variables placed on ps
    ``k+1``, whose ``SaveV2`` pulls them over the network and writes there): a ps whose whole host
    is lost comes back from the copy. ``addresses`` (each ps's ``host:port``) only name the hosts
    in what the chief logs."""

    def __init__(
        self,
        checkpoint_names: dict[str, Any],
        global_step: Any,
        n_ps: int,
        folder: str,
        output_dir: str,
        copies: bool = True,
        addresses: Optional[list[str]] = None,
        together: bool = False,
        on_ps: bool = False,
        table_bytes: Optional[int] = TABLE_BYTES,
    ) -> None:
        # a synchronous algorithm's: every ps goes back to one snapshot when one comes back
        # (the global step then counts exactly the rounds every ps holds)
        self.together = together
        self._global_step = global_step
        self._n_ps = n_ps
        self._folder, self._output_dir = folder, output_dir
        self._addresses = list(addresses or [])
        self._run = uuid.uuid4().hex[:12]
        # ps -> slot -> [(the ps whose host holds it, prefix)]: its own first, then its copy
        self._places: dict[int, dict[str, list[tuple[int, str]]]] = {}
        # (ps whose variables, ps whose host) -> the saver whose ops run there
        self._savers: dict[tuple[int, int], Any] = {}
        self._checkpoint_savers: dict[int, Any] = {}
        self._variables: dict[int, list[Any]] = {}
        self._names: dict[str, int] = {}  # variable op name -> its ps
        self._shapes: dict[int, list[Any]] = {}  # ps -> its variables' shapes, as now held
        self._files: dict[int, _HostFiles] = {}
        self._last: dict[int, Snapshot] = {}
        self._generation = 0  # snapshots taken (every ps's of one take share it)
        # ps -> its chain of a full snapshot and deltas (recipes/snapshot_deltas.py)
        self._deltas: dict[int, RowDeltas] = {}
        self._chains: dict[int, Chain] = {}
        self.delta_count = 0  # snapshots of a ps that were deltas
        self.durations: list[float] = []  # seconds of each snapshot taken (its three runs)
        self.seen: Optional[int] = None  # the last global step the chief's hooked runs read
        # each ps restore: {"ps", "source", "step", "lost_steps"} (result.json's ps_recoveries)
        self.recoveries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        for var in v1.global_variables():
            k = _ps_index(var.device)
            if k is not None and k < n_ps:
                self._variables.setdefault(k, []).append(var)
                self._names[var.op.name] = k
        self._peers = {
            k: (k + 1) % n_ps for k in self._variables if copies and n_ps > 1
        }  # ps -> the ps on whose host its copy lives
        for k, variables in sorted(self._variables.items()):
            var_list = {v.op.name: v for v in variables}
            self._places[k] = {s: [(k, self._prefix(k, s, k))] for s in SLOTS}
            hosts = [k] + ([self._peers[k]] if k in self._peers else [])
            for host in hosts:
                with v1.device(f"/job:ps/task:{host}"):
                    if host == k:  # the op, not tf.shape: that folds a static shape into a constant
                        self._shapes[k] = [_held_shape(v) for v in variables]
                    self._savers[(k, host)] = v1.train.Saver(
                        var_list=var_list,
                        sharded=False,
                        allow_empty=True,
                        name=f"snapshot_ps{k}" + ("" if host == k else f"_on_ps{host}"),
                    )
                if host != k:
                    for s in SLOTS:
                        self._places[k][s].append((host, self._prefix(k, s, host)))
            self._deltas[k] = RowDeltas(k, variables, hosts, table_bytes)
            # the fallback: this ps's share of the checkpoint (its names, its slices), read where
            # the chief's own saver reads it: on the ps where it sees the output folder
            # (``on_ps``), else on the chief, streamed a chunk at a time
            share = _share_of(checkpoint_names, k)
            if on_ps or not share:
                with v1.device(f"/job:ps/task:{k}" if on_ps else None):
                    self._checkpoint_savers[k] = v1.train.Saver(
                        var_list=share, sharded=False, allow_empty=True, name=f"checkpoint_ps{k}"
                    )
            else:
                self._checkpoint_savers[k] = streamed_saver(share, name=f"checkpoint_ps{k}")
        for k in sorted({h for (_, h) in self._savers}):
            self._files[k] = _HostFiles(k)

    def _prefix(self, k: int, slot: str, host: int) -> str:
        """Where the snapshot of ps ``k`` in ``slot`` lies on the host of ps ``host``."""
        base = snapshot_folder(self._folder, self._output_dir, host)
        return os.path.join(base, slot, "snapshot" if host == k else f"copy-of-ps{k}")

    @property
    def global_step(self) -> Any:
        return self._global_step

    @property
    def where(self) -> str:
        """The snapshots' folder, as every ps names it on its own host."""
        return os.path.dirname(snapshot_folder(self._folder, self._output_dir, 0))

    @property
    def all_ps(self) -> list[int]:
        """Every ps that holds variables."""
        return sorted(self._variables)

    @property
    def copies(self) -> dict[int, int]:
        """ps -> the ps on whose host its copy is written (none with one ps or copies off)."""
        return dict(self._peers)

    def last(self, k: int) -> Optional[Snapshot]:
        with self._lock:
            return self._last.get(k)

    def _host(self, ps: int) -> str:
        """The host of ps ``ps`` as the cluster names it (without the port), if known."""
        address = self._addresses[ps] if ps < len(self._addresses) else ""
        return address.rsplit(":", 1)[0]

    def _meta_feeds(
        self, slots: dict[int, str], data: Callable[[int], bytes]
    ) -> tuple[list[Any], dict[Any, Any]]:
        """The writes of the ``.meta`` of each ps ``k`` in ``slots[k]`` (``data(k)`` each), and
        their feeds."""
        ops: list[Any] = []
        feeds: dict[Any, Any] = {}
        used: dict[int, int] = {}
        for k, slot in slots.items():
            for host, prefix in self._places[k][slot]:
                files, i = self._files[host], used.get(host, 0)
                used[host] = i + 1
                feeds[files.names[i]] = prefix + ".meta"
                feeds[files.datas[i]] = data(k)
                ops.append(files.writes[i])
        return ops, feeds

    def take(self, session: Any) -> tuple[int, float]:
        """Write one snapshot of every ps (the ps write in parallel, each on its own host, and
        each copy on its peer's host); returns the global step read in the same run and how
        long it took. A ps with tables whose chain goes on gets a delta (only the rows changed
        since its last snapshot, recipes/snapshot_deltas.py); any other a full snapshot, into
        the slot its last one is not in. Three runs: the full snapshots' slots emptied (their
        ``.meta`` files and old deltas) and their rows' fingerprints kept, every file written,
        then the ``.meta`` files saying what they hold.

        Raises:
            tf.errors.OpError: a ps is unreachable or cannot write (the earlier snapshots stay;
                every ps's next snapshot is a full one).
        """
        with self._lock:
            chains = dict(self._chains)
            generation = self._generation
        full: dict[int, str] = {}  # ps -> the slot its full snapshot goes to
        extend: dict[int, Chain] = {}  # ps -> its chain, which this snapshot's delta extends
        for k in self._places:
            chain = chains.get(k)
            if chain is not None and not self._deltas[k].ends(chain):
                extend[k] = chain
            else:
                at = (chain.slot + 1) % len(SLOTS) if chain else generation % len(SLOTS)
                full[k] = SLOTS[at]
        try:
            return self._take(session, generation, full, extend)
        except BaseException as e:
            # whatever was half written (a delta's fingerprints kept, its .meta not; the
            # session closed under it by a recovery): every ps starts a chain again, or the
            # rows changed before those fingerprints would be missing from the next delta
            with self._lock:
                self._chains = {k: c.ended() for k, c in self._chains.items()}
            if extend and isinstance(e, tf.errors.FailedPreconditionError):
                # a ps restarted under the chain (its kept fingerprints gone with it): full ones
                return self.take(session)
            raise

    def _take(
        self, session: Any, generation: int, full: dict[int, str], extend: dict[int, Chain]
    ) -> tuple[int, float]:
        options = v1.RunOptions(timeout_in_ms=SAVE_TIMEOUT_MS)
        began = time.monotonic()
        self._prepare_full(session, full, options)
        feeds, saves = self._full_saves(full)
        counted = sorted(extend)
        for k in counted:
            deltas, chain = self._deltas[k], extend[k]
            for host, prefix in self._places[k][SLOTS[chain.slot]]:
                name, save = deltas.saves[host]
                feeds[name] = delta_prefix(prefix, chain.deltas + 1)
                saves.append(save)
            saves.append(deltas.keep_prints)
            feeds[deltas.room] = deltas.room_left(chain)
        out = session.run(
            [
                saves,
                [(self._deltas[k].fits, self._deltas[k].need) for k in counted],
                self._global_step,
            ],
            feeds,
            options=options,
        )
        step, now = int(out[-1]), time.time()
        chains = {k: Chain(SLOTS.index(slot)) for k, slot in full.items()}
        # a delta that did not fit its chain's room wrote no row: that ps's chain ends here,
        # with a full snapshot in this same one (every ps's of one snapshot share its number)
        over: dict[int, str] = {}
        for k, (fits, need) in zip(counted, out[1], strict=True):
            chain = extend[k]
            if fits:
                chains[k] = Chain(chain.slot, chain.deltas + 1, chain.delta_bytes + int(need))
            else:
                over[k] = SLOTS[(chain.slot + 1) % len(SLOTS)]
                chains[k] = Chain(SLOTS.index(over[k]))
        if over:
            self._prepare_full(session, over, options)
            feeds, saves = self._full_saves(over)
            session.run(saves, feeds, options=options)
            now = time.time()
        slots = {k: SLOTS[c.slot] for k, c in chains.items()}
        said, feeds = self._meta_feeds(
            slots,
            lambda k: _Meta(
                k, self._run, generation, step, now, self._n_ps, chains[k].deltas
            ).encode(),
        )
        session.run(said, feeds, options=options)
        with self._lock:
            for k, chain in chains.items():
                places = tuple(self._places[k][slots[k]])
                self._last[k] = Snapshot(places, step, now, chain.deltas)
            self._chains.update(chains)
            self._generation = generation + 1
            self.delta_count += len(extend) - len(over)
            self.durations.append(time.monotonic() - began)
        return step, self.durations[-1]

    def _prepare_full(self, session: Any, full: dict[int, str], options: Any) -> None:
        """Before full snapshots of ps ``full`` (ps -> slot): that slot's ``.meta`` files and
        old deltas emptied (own and copy), and the rows' fingerprints of each table kept (they
        are what the next delta compares with: read before the rows are written)."""
        if not full:
            return
        ops, feeds = self._meta_feeds(full, lambda k: b"")
        patterns: dict[int, list[str]] = {}
        for k, slot in full.items():
            for host, prefix in self._places[k][slot]:
                patterns.setdefault(host, []).append(deltas_pattern(prefix))
            if self._deltas[k].active:
                ops.append(self._deltas[k].set_prints)
        for host, names in patterns.items():
            ops.append(self._files[host].empty)
            feeds[self._files[host].patterns] = names
        session.run(ops, feeds, options=options)

    def _full_saves(self, full: dict[int, str]) -> tuple[dict[Any, Any], list[Any]]:
        """The save ops of full snapshots of ps ``full`` (ps -> slot), own and copy, and
        their feeds."""
        feeds: dict[Any, Any] = {}
        saves: list[Any] = []
        for (k, host), saver in self._savers.items():
            if k in full:
                feeds[saver.saver_def.filename_tensor_name] = dict(self._places[k][full[k]])[host]
                saves.append(saver.saver_def.save_tensor_name)
        return feeds, saves

    def summary(self) -> dict[str, Any]:
        """result.json's ``snapshots``: how many were taken, how long the first took (it pays
        the setup of its runs' graphs: 1.6 s against 0.17 s for the next ones, seen on the CTR
        example), how long the others took (median, longest: the work each ps did beside
        training; no step waits for it), with copies or not."""
        with self._lock:
            took = list(self.durations)
        rest = sorted(took[1:])
        return {
            "taken": len(took),
            "first_secs": round(took[0], 4) if took else None,
            "median_secs": round(statistics.median(rest), 4) if rest else None,
            "max_secs": round(rest[-1], 4) if rest else None,
            "copies": bool(self._peers),
            # snapshots of a ps that held only the rows changed since its last one
            "deltas": self.delta_count,
            # a synchronous algorithm's: taken between two rounds, which waited for each (so the
            # durations are the pauses training took)
            "between_rounds": self.together,
        }

    def found(self, session: Any, ks: list[int]) -> dict[int, Snapshot]:
        """The snapshots of ps ``ks`` that an earlier chief of this job left (this one has no
        record of them: the whole cluster restarted, e.g. re-planned around a lost host), read
        from their ``.meta`` files on each ps's host and its peer's: ps -> the newest snapshot
        readable from a saver of this graph. When every ps has one of the same run and
        generation (one snapshot of the whole job), the newest such is taken for all."""
        metas: dict[int, dict[tuple[str, int], list[tuple[int, str, _Meta]]]] = {}
        root = os.path.dirname(snapshot_folder(self._folder, self._output_dir, 0))
        for host in sorted({h for (k, h) in self._savers if k in ks}):
            files = self._files[host]
            try:
                names = session.run(files.listing, {files.pattern: f"{root}/ps*/*/*.meta"})
            except tf.errors.OpError:
                continue
            for raw in names:
                name = raw.decode()
                try:
                    meta = _Meta.decode(session.run(files.read, {files.name: name}))
                except tf.errors.OpError:
                    continue
                prefix = name[: -len(".meta")]
                if meta is None or meta.ps not in ks or meta.ps_count != self._n_ps:
                    continue
                if (host, prefix) not in self._places[meta.ps].get(prefix_slot(prefix), []):
                    continue  # another number of ps wrote it: no saver of this graph reads it
                key = (meta.run, meta.generation)
                metas.setdefault(meta.ps, {}).setdefault(key, []).append((host, prefix, meta))

        def snapshot(entries: list[tuple[int, str, _Meta]]) -> Snapshot:
            # its own host first, then the copy
            ordered = sorted(entries, key=lambda e: e[0] != e[2].ps)
            meta = ordered[0][2]
            return Snapshot(
                tuple((h, p) for h, p, _ in ordered), meta.step, meta.taken, meta.deltas
            )

        common = set.intersection(*(set(metas.get(k, {})) for k in ks)) if ks else set()
        if common:
            best = max(common, key=lambda key: metas[ks[0]][key][0][2].step)
            return {k: snapshot(metas[k][best]) for k in ks}
        return {
            k: snapshot(max(by_key.values(), key=lambda e: e[0][2].step))
            for k, by_key in metas.items()
        }

    def _wrong_shapes(self, session: Any, k: int) -> str:
        """The variables of ps ``k`` whose shape now differs from the graph's, as text."""
        variables = self._variables[k]
        now = session.run(self._shapes[k])
        return ", ".join(
            f"{v.op.name}: {[int(n) for n in got]} not {v.shape.as_list()}"
            for v, got in zip(variables, now, strict=True)
            if v.shape.is_fully_defined() and list(got) != v.shape.as_list()
        )

    def ps_of(self, uninitialized: list[Any]) -> list[int]:
        """The ps whose variables ``report_uninitialized_variables`` named (a restarted ps)."""
        names = {n.decode() if isinstance(n, bytes) else str(n) for n in uninitialized}
        return sorted({self._names[n] for n in names if n in self._names})

    def restore(
        self,
        session: Any,
        k: int,
        checkpoint: Optional[str],
        log: Callable[[str], None],
        snap: Optional[Snapshot] = None,
        use_snapshot: bool = True,
    ) -> str:
        """Bring ps ``k``'s variables back: from its last snapshot (``snap``, else this chief's
        record) when that is at least as new as ``checkpoint``, its own host's files first,
        then the copy on its peer's host; else (or without ``use_snapshot``) from
        ``checkpoint``, else from their initializers. Returns what was used, as said in the
        log: ``snapshot of step ...`` when a snapshot was.

        Raises:
            tf.errors.UnavailableError, tf.errors.AbortedError: a ps went away, or refused a
                re-sent request, while its snapshot was read: not a reason to take the older
                checkpoint; the caller creates its session again, and restores again.
        """
        snap = (snap or self.last(k)) if use_snapshot else None
        self._end_chain(k)  # its values replaced: its next snapshot is a full one
        ckpt_step = _checkpoint_step(checkpoint)
        if snap is not None and (ckpt_step is None or snap.step >= ckpt_step):
            for i, (host, prefix) in enumerate(snap.places):
                saver = self._savers[(k, host)]
                copy = (
                    ""
                    if host == k
                    else f", the copy on ps/{host}'s host {self._host(host)}".strip()
                )
                try:
                    session.run(
                        saver.saver_def.restore_op_name,
                        {saver.saver_def.filename_tensor_name: prefix},
                    )
                    if snap.deltas:  # the chain's deltas, in order, over its base
                        where, apply = self._deltas[k].restores[host]
                        for n in range(1, snap.deltas + 1):
                            session.run(apply, {where: delta_prefix(prefix, n)})
                    # A resource variable takes the restored tensor's shape, whatever it was:
                    # a snapshot of another shape is refused here, and the checkpoint used
                    wrong = self._wrong_shapes(session, k)
                    if wrong:
                        raise tf.errors.InvalidArgumentError(None, None, f"another shape: {wrong}")
                except (tf.errors.UnavailableError, tf.errors.AbortedError):
                    # not the files: a ps gone again, or a request gRPC re-sent and the ps
                    # refused ("received twice", seen under load). The session's creation is
                    # retried (MonitoredSession's own loop), and this restore with it; falling
                    # back to the checkpoint here lost every step since (seen in CI: step 0)
                    raise
                except tf.errors.OpError as e:
                    # the copy has the same shape: not tried for that
                    shape = isinstance(e, tf.errors.InvalidArgumentError) and str(e).startswith(
                        "another shape"
                    )
                    last = shape or i == len(snap.places) - 1
                    what = (
                        "its snapshot"
                        if host == k
                        else f"the copy of its snapshot on ps/{host}'s host {self._host(host)}"
                    )
                    log(
                        f"ps/{k}: {what.strip()} cannot be read ({type(e).__name__}: "
                        f"{first_line(e)}); "
                        + ("using the checkpoint" if last else "trying its copy")
                    )
                    if last:
                        break
                    continue
                said = snap.describe()
                # (the snapshot's own read of the step may be the newer)
                seen = None if self.seen is None else max(self.seen, snap.step)
                lost = _lost(seen, snap.step)
                log(
                    f"ps/{k} restored from its {said}{copy}{lost}"
                    + _behind(ckpt_step, "checkpoint")
                )
                self._recovered(
                    k,
                    "snapshot",
                    snap.step,
                    seen,
                    None if host == k else self._host(host) or f"ps/{host}'s host",
                    snap.deltas,
                )
                return said + copy
        if checkpoint:
            saver = self._checkpoint_savers[k]
            session.run(
                saver.saver_def.restore_op_name,
                {saver.saver_def.filename_tensor_name: checkpoint},
            )
            said = f"checkpoint of step {ckpt_step:,}" if ckpt_step is not None else checkpoint
            log(f"ps/{k} restored from its {said}")
            self._recovered(k, "checkpoint", ckpt_step, self.seen)
            return said
        session.run(v1.variables_initializer(self._variables[k]))
        log(f"ps/{k} initialised (no snapshot, no checkpoint)")
        self._recovered(k, "initial values", 0, self.seen)
        return "initial values"

    def restored_whole(
        self, came_back: list[int], checkpoint: Optional[str], log: Callable[[str], None]
    ) -> None:
        """Record that ``came_back`` (the ps that came back empty while this chief trained) were
        restored with every ps from ``checkpoint`` (or their initial values): no snapshot of
        them was found newer than it (e.g. a ps killed before its first snapshot). A job's first
        start (this chief saw no step yet) is not a recovery and is not recorded."""
        for k in self.all_ps:  # every ps's values replaced: full snapshots next
            self._end_chain(k)
        if self.seen is None:
            return
        step = _checkpoint_step(checkpoint) if checkpoint else 0
        source = "checkpoint" if checkpoint else "initial values"
        for k in came_back:
            said = f"checkpoint of step {step:,}" if checkpoint and step is not None else source
            log(
                f"ps/{k} restored from its {said} (no newer snapshot of it){_lost(self.seen, step)}"
            )
            self._recovered(k, source, step, self.seen)

    def _end_chain(self, k: int) -> None:
        with self._lock:
            if k in self._chains:
                self._chains[k] = self._chains[k].ended()

    def _recovered(
        self,
        k: int,
        source: str,
        step: Optional[int],
        seen: Optional[int],
        copy_on: Optional[str] = None,
        deltas: int = 0,
    ) -> None:
        lost = None if seen is None or step is None else max(0, seen - step)
        record = {"ps": k, "source": source, "step": step, "lost_steps": lost, "at": time.time()}
        if copy_on:  # the copy on another ps's host (its own host's files were gone)
            record["copy_on"] = copy_on
        if deltas:  # a full snapshot and this many deltas of its changed rows were read
            record["deltas"] = deltas
        self.recoveries.append(record)
        try:  # one write of one short line: appended whole (O_APPEND)
            with open(os.path.join(self._output_dir, RECOVERIES_FILE), "a") as out:
                out.write(json.dumps(record) + "\n")
        except OSError:
            pass  # the stream said it, and result.json will


def prefix_slot(prefix: str) -> str:
    """The slot (``a``/``b``) a snapshot's prefix lies in: ``.../ps<k>/<slot>/<name>``."""
    return os.path.basename(os.path.dirname(prefix))


def _held_shape(var: Any) -> Any:
    handle = getattr(var, "handle", None)
    if handle is not None and handle.dtype == tf.resource:
        return tf.raw_ops.VariableShape(input=handle, out_type=tf.int64)
    return tf.shape(var, out_type=tf.int64, optimize=False)  # a reference variable


def _lost(seen: Optional[int], step: Optional[int]) -> str:
    """``: N steps lost (the chief saw step S)`` for a restore to ``step``; "" if either is unknown."""
    if seen is None or step is None:
        return ""
    return f": {max(0, seen - step):,} steps lost (the chief saw step {seen:,})"


def _behind(step: Optional[int], what: str) -> str:
    return f"; the last {what} was at step {step:,}" if step is not None else ""


def _checkpoint_step(checkpoint: Optional[str]) -> Optional[int]:
    if not checkpoint:
        return None
    tail = checkpoint.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _share_of(checkpoint_names: dict[str, Any], k: int) -> dict[str, Any]:
    """The checkpoint's names whose variables (or slices) live on ps ``k``."""
    share: dict[str, Any] = {}
    for name, value in checkpoint_names.items():
        if isinstance(value, (list, tuple)):
            parts = [v for v in value if _ps_index(v.device) == k]
            if parts:
                share[name] = parts
        elif _ps_index(value.device) == k:
            share[name] = value
    return share


class SnapshotHook(v1.train.SessionRunHook):  # type: ignore[name-defined]
    """The chief's: one snapshot of every ps every ``every_secs``, on a thread of its own (a step
    never waits for it); at most one in flight. A failure other than a lost ps (a full or
    read-only folder) is said once; restarts then fall back to the checkpoints."""

    def __init__(
        self,
        snapshots: PsSnapshots,
        every_secs: float,
        log: Callable[[str], None] = print,
        rounds: Any = None,
    ) -> None:
        # a synchronous optimizer's RoundGate (recipes/sync_rounds.py): each snapshot is taken
        # between two rounds, which wait for it
        self._rounds = rounds
        self._snapshots = snapshots
        self._every = every_secs
        self._interval = every_secs
        self._log = log
        self._thread: Optional[threading.Thread] = None
        self._next = 0.0  # when the next snapshot is due
        self._began = 0.0  # when the last one was launched
        self._said: set[str] = set()
        self.taken = 0
        # the job's global steps and seconds while a snapshot ran and while none did: what a
        # snapshot slows training by
        self._during = [0.0, 0.0]
        self._between = [0.0, 0.0]
        self._last: Optional[tuple[float, int, bool]] = None  # (time, step, a snapshot running)
        self._ended: Optional[float] = None  # when the last snapshot's thread ended
        # snapshots cancelled in a row while the session stayed open: a failing SaveV2 on a ps
        # (a full folder) can reach the chief as the CancelledError of another partition's op
        self._cancelled = 0
        self._ending = False

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._next = time.monotonic() + self._interval

    def before_run(self, run_context: Any) -> Any:
        # the step every hooked run fetches anyway (StopAtStepHook): what a restore lost
        return v1.train.SessionRunArgs(self._snapshots.global_step)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        step = self._snapshots.seen = int(run_values.results)
        now = time.monotonic()
        running = self._thread is not None and self._thread.is_alive()
        self._count(now, step)
        if now < self._next or running:
            self._last = (now, step, running)
            return
        self._began = now
        self._thread = threading.Thread(
            target=self._take, args=(run_context.session,), name="ps-snapshots", daemon=True
        )
        self._thread.start()
        self._last = (now, step, True)

    def _count(self, now: float, step: int) -> None:
        """Add the time and steps since the last hooked run to the side they were on: a
        snapshot that ended meanwhile splits the time at its end, and the run's steps count
        after it. Why not pro rata: a run that waited on a ps busy writing (a synchronous round
        held back, a large table's step queued behind the save) made its steps after the end,
        and a pro-rata share read the slowdown low (0.88x measured where 0.95x was the aim);
        counted after, one run per snapshot reads it high, on the safe side (a snapshot of
        0.1 s between runs of 0.05 s: 0.4 for 0.05), which widens only what was near its
        bound anyway."""
        if self._last is None:
            return
        then, before, running = self._last
        steps = max(0, step - before)
        ended = self._ended
        if not running:
            self._between[0] += steps
            self._between[1] += now - then
        elif ended is None or not then <= ended < now:  # still running
            self._during[0] += steps
            self._during[1] += now - then
        else:
            self._during[1] += ended - then
            self._between[0] += steps
            self._between[1] += now - ended

    def _widened(self, secs: float, slower: Optional[float]) -> float:
        """The interval after a snapshot of ``secs`` (training ``slower`` meanwhile, the
        :meth:`slowdown`): ``lifecycle.snapshot_secs``, widened so that the steps the snapshots
        cost stay within :data:`OVERHEAD_BUDGET`."""
        return max(
            self._every,
            MIN_GAP_FACTOR * secs,
            COST_FACTOR * (slower or 0.0) * secs / OVERHEAD_BUDGET,
        )

    def slowdown(self) -> Optional[float]:
        """How much slower the job trained while a snapshot ran than while none did (0: not
        at all, 1: it stood still); None until both were seen."""
        (steps_in, secs_in), (steps_out, secs_out) = self._during, self._between
        if secs_in <= 0 or secs_out <= 0 or steps_out <= 0:
            return None
        return min(1.0, max(0.0, 1.0 - (steps_in / secs_in) / (steps_out / secs_out)))

    def _take(self, session: Any) -> None:
        try:
            self._take_one(session)
        finally:
            self._ended = time.monotonic()
            # the next one from this one's start by the interval this one set: the run that
            # started it could only use the interval before it (seen on a large table: a first
            # snapshot of 9.8 s followed at once by a second of 7.3 s, training 90% slower for
            # both, then a third 12 s later although the interval was 263 s by then)
            self._next = self._began + self._interval

    def _take_one(self, session: Any) -> None:
        try:
            if self._rounds is None:
                step, secs = self._snapshots.take(session)
            else:
                with self._rounds.between(ROUND_WAIT_SECS) as clear:
                    if not clear:
                        return  # a round waiting for a replica that is gone: the next time
                    step, secs = self._snapshots.take(session)
        except RuntimeError:  # "Attempted to use a closed Session": a recovery replaced it
            return
        except tf.errors.OpError as e:
            if isinstance(e, (tf.errors.UnavailableError, tf.errors.AbortedError)):
                return  # a ps went away: the restore will use the last complete snapshot
            if isinstance(e, tf.errors.CancelledError):
                self._cancelled += 1
                if self._ending or _closed(session) or self._cancelled < CANCELLED_IN_A_ROW:
                    return  # the session closed under it (the end, or a recovery)
            kind = type(e).__name__
            if kind not in self._said:
                self._said.add(kind)
                self._log(
                    f"snapshots: {kind}: {first_line(e)}; a restarted ps comes back from the "
                    "last checkpoint instead"
                )
            return
        self._cancelled = 0
        self.taken += 1
        if self.taken == 1:
            also = " and a copy on the next ps's host" if self._snapshots.copies else ""
            if self._rounds is not None:
                also += ", between two rounds (the rounds wait for it)"
            self._log(
                f"snapshots: every {self._every:g}s, each ps into {self._snapshots.where} on its "
                f"own host{also}; the first at step {step:,}"
            )
            # it paid the setup of its runs' graphs too, so neither its duration nor the rate
            # while it ran is what the next ones cost: only not back to back (a large table's
            # first snapshot, seconds long, is not followed by another a second later)
            self._interval = max(self._every, MIN_GAP_FACTOR * secs)
            return
        slower = self.slowdown()
        self._interval = self._widened(secs, slower)
        if self._interval > 1.5 * self._every and "widened" not in self._said:
            self._said.add("widened")
            # (the rate while they ran, said once it rests on a second of them at least)
            cost = (
                f" and training ran {slower:.0%} slower meanwhile"
                if slower is not None and self._during[1] >= 1.0
                else ""
            )
            self._log(
                f"snapshots: one took {secs:.2f}s{cost}; taking one every "
                f"{self._interval:.1f}s instead of {self._every:g}s (lifecycle.snapshot_secs), "
                f"so that they cost at most {OVERHEAD_BUDGET:.0%} of training"
            )

    def end(self, session: Any) -> None:
        self._ending = True
        if self._thread is not None:
            self._thread.join(timeout=SAVE_TIMEOUT_MS / 1000)


def _closed(session: Any) -> bool:
    """Whether ``session`` (a hook's raw session) was closed (a recovery or the end)."""
    return bool(getattr(session, "_closed", False))
