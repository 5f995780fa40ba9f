"""Bytes per step to and from the parameter servers, counted on the wire: each ps on a host of its own.

    .venv/bin/python bench/bench_table_traffic.py [--algos pss,hogwild] [--steps 100,300]
        [--vocab-scales 0.001,0.01] [--out docs/bench_table_traffic.md]

examples/ctr (26 Embedding tables of width 16, one id per field per example, Zipf-distributed;
its dense part made small: no cross layer, one hidden layer of 16) on three network-namespace hosts over SSH (tests/testbed.py, the test
bed of the SSH tests): ps/0 alone on the first, ps/1 alone on the second (``cpu_slots: 1``), the
chief and both workers on the third (for ``pss`` its coordinator is the chief). The tables split
over both ps (``model.partition_bytes``). The root namespace's end of each ps host's veth counts
every byte the host sends and receives (``/sys/class/net/<veth>/statistics``); a ps host runs
nothing else but its sshd and tfplan's seed and watcher.

Per algorithm and vocabulary scale, two applies of the same config that differ only in
``trainer.max_steps`` (A and B steps); B's bytes minus A's, divided by B - A, are one step's,
with everything both runs do once (start, the tables' initialisation, the final checkpoint and
evaluation, the watcher) cancelled. TCP/IP headers come off by the packet counts (66 B a packet:
Ethernet 14, IPv4 20, TCP 32 with timestamps): payload per step, each way, both ps summed. Then:

- the rows' part: the same at a batch of one example (one id per field: 26 rows), whose step
  moves the same tensors (every dense variable whole, its gradient, every table's lookup and
  update, each with its own framing) but the fewest rows, taken off the full batch's step. What
  is left is the extra rows' bytes, and divided by the extra rows (U - 1 summed over the
  fields, U the distinct ids of a batch: the mean over batches of the training data, counted
  here), a row's cost each way, against 4 D + 8 bytes (D floats and its 8-byte id: issue 34's
  bound, goal <= 1.1x);
- the full batch's step against the same bound for all its rows (sum over the tables of
  U x (4 D + 8)), which its framing and the dense part add to, and the tables whole, for
  contrast (what every step moved before reads and writes were sparse).

The vocabulary scales change only the tables' rows (the same ids: the data is written at the
smallest scale): a step's bytes should not change with them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from _example_runs import click_run  # noqa: E402
from apply_helpers import kill_groups, recorded_groups  # noqa: E402
from apply_helpers import tfplan as run_cli  # noqa: E402
from scale_helpers import conf_with  # noqa: E402
from test_apply_ssh import _host  # noqa: E402
from testbed import NetnsTestbed  # noqa: E402

HEADER_BYTES = 66  # Ethernet 14 + IPv4 20 + TCP 32 (with timestamps), per packet
BATCH = 64
EMBED = 16
EXAMPLES = 20_000
TOPOLOGY = {"pss": ["cluster.chief=separate"]}  # its coordinator is a chief of its own
GOAL = 1.1


def counters(veth: str) -> dict[str, int]:
    """The root-side veth's counters: ``tx`` is what went to the host, ``rx`` what came back."""
    stats = Path("/sys/class/net", veth, "statistics")
    return {
        name: int((stats / name).read_text())
        for name in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")
    }


def payload(before: dict[str, int], after: dict[str, int]) -> tuple[int, int]:
    """(to the host, from it): TCP payload bytes between two readings."""
    to = after["tx_bytes"] - before["tx_bytes"]
    to -= HEADER_BYTES * (after["tx_packets"] - before["tx_packets"])
    back = after["rx_bytes"] - before["rx_bytes"]
    back -= HEADER_BYTES * (after["rx_packets"] - before["rx_packets"])
    return to, back


def distinct_ids_per_batch(project: Path, batches: int = 200) -> dict[str, float]:
    """Per field ``c1`` .. ``c26``: the mean number of distinct ids in a batch of BATCH
    training examples, over ``batches`` shuffled batches of the shards."""
    import numpy as np
    import tensorflow as tf

    spec = {f"c{k}": tf.io.FixedLenFeature([], tf.int64) for k in range(1, 27)}
    files = sorted(str(p) for p in (project / "data").glob("train-*.tfrecord"))
    data = (
        tf.data.TFRecordDataset(files).shuffle(EXAMPLES, seed=1).batch(BATCH, drop_remainder=True)
    )
    counts: dict[str, list[int]] = {name: [] for name in spec}
    for batch in data.map(lambda r: tf.io.parse_example(r, spec)).take(batches):
        for name, ids in batch.items():
            counts[name].append(len(np.unique(ids.numpy())))
    return {name: float(np.mean(c)) for name, c in counts.items()}


class Bed:
    """The three namespace hosts and a conf/ whose ``cluster=scale`` places the ps alone."""

    def __init__(self, tmp: Path) -> None:
        (tmp / "bed").mkdir()
        self.tmp = tmp
        self.testbed = NetnsTestbed(tmp / "bed", count=3, tag="t")

    def __enter__(self) -> Bed:
        self.testbed.setup()
        targets = self.testbed.targets()
        hosts = [_host(t, cpu_slots=n) for t, n in zip(targets, (1, 1, 4), strict=True)]
        self.env = conf_with(
            self.tmp,
            {
                "hosts": hosts,
                "ps": 2,
                "workers": 2,
                "port_base": 3100,
                "port_range": 10,
                "ssh_known_hosts": str(self.testbed.known_hosts),
            },
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.testbed.teardown()

    def ps_veths(self) -> list[str]:
        return self.testbed.veths[:2]


def overrides(
    bed: Bed, algo: str, scale: float, steps: int, run: str, batch: int = BATCH
) -> list[str]:
    return [
        "cluster=scale",
        f"experiment.id={run}",
        f"cluster.workdir={bed.tmp / 'work' / run}",
        f"cluster.output_dir={bed.testbed.shared_dir / run}",
        f"algo={algo}",
        *TOPOLOGY.get(algo, []),
        "model._target_=ctr.models.build",
        f"model.vocab_scale={scale}",
        # a small dense part (no cross layer, one hidden layer of 16): the DCN's own 2 MB of
        # dense layers, read and written whole every step, would bury the tables' rows in their
        # own framing overhead (2 % of 2 MB is more than every row of a batch)
        "model.cross_layers=0",
        "model.units=[16]",
        "model.partition_bytes=200000",
        *click_run(batch, steps),
        "lifecycle.ps_grace_secs=2",
    ]


def tfplan(project: Path, env: dict[str, str], *args: str) -> None:
    """The CLI in ``project``, to its end (an error with its output if it failed); the whole
    run's ``trainer.max_steps``, whatever cap the caller's environment sets."""
    run_cli(project, *args, timeout=1800, check=True, env={**env, "TFPLAN_MAX_STEPS_CAP": ""})


def one_apply(
    bed: Bed, project: Path, algo: str, scale: float, steps: int, run: str, batch: int
) -> list[int]:
    """[to the ps, from the ps] payload bytes of one whole apply, both ps hosts summed."""
    before = [counters(v) for v in bed.ps_veths()]
    try:
        args = overrides(bed, algo, scale, steps, run, batch)
        tfplan(project, bed.env, "apply", "--auto-approve", *args)
    finally:
        kill_groups(recorded_groups(project))
    after = [counters(v) for v in bed.ps_veths()]
    moved = [payload(b, a) for b, a in zip(before, after, strict=True)]
    return [sum(m[0] for m in moved), sum(m[1] for m in moved)]


def sizes(bed: Bed, project: Path, algo: str, scale: float) -> dict[str, Any]:
    """The plan's variables: dense bytes, and per table rows, width and bytes."""
    tfplan(project, bed.env, "plan", *overrides(bed, algo, scale, 10, "sizes"))
    sharding = json.loads((project / ".tfplan" / "plan.json").read_text())["sharding"]
    tables = sharding["tables"]

    def in_a_table(name: str) -> bool:
        return any(name == t["name"] or name.startswith(t["name"] + "/part_") for t in tables)

    dense = sum(v["bytes"] for v in sharding["variables"] if not in_a_table(v["name"]))
    return {"dense": dense, "tables": tables, "whole": sum(t["bytes"] for t in tables)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="pss,hogwild")
    parser.add_argument("--steps", default="100,300", help="A,B: the two runs' max_steps")
    parser.add_argument("--vocab-scales", default="0.001,0.01")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--no-batch-one",
        action="store_true",
        help="skip the batch-1 runs (no row's cost: a quick check of the rest)",
    )
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_table_traffic.md"))
    args = parser.parse_args()
    algos = args.algos.split(",")
    steps_a, steps_b = (int(s) for s in args.steps.split(","))
    scales = [float(s) for s in args.vocab_scales.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-traffic-") as tmp:
        project = Path(tmp) / "ctr"
        shutil.copytree(REPO / "examples" / "ctr", project)
        subprocess.run(
            [
                sys.executable,
                "make_data.py",
                "data",
                str(EXAMPLES),
                "--vocab-scale",
                str(min(scales)),
            ],
            cwd=project,
            check=True,
            capture_output=True,
        )
        u = distinct_ids_per_batch(project)
        bound = sum(n * (4 * EMBED + 8) for n in u.values())
        with Bed(Path(tmp)) as bed:
            for algo in algos:
                for scale in scales:
                    known = sizes(bed, project, algo, scale)
                    batches = (BATCH,) if args.no_batch_one else (BATCH, 1)
                    step: dict[int, list[list[float]]] = {b: [] for b in batches}
                    for r in range(args.repeats):
                        for batch in batches:
                            tag = f"{algo}-{scale:g}-{batch}-{r}".replace(".", "_")
                            a = one_apply(bed, project, algo, scale, steps_a, f"a-{tag}", batch)
                            b = one_apply(bed, project, algo, scale, steps_b, f"b-{tag}", batch)
                            pair = zip(a, b, strict=True)
                            step[batch].append([(y - x) / (steps_b - steps_a) for x, y in pair])
                    row = {
                        "algo": algo,
                        "scale": scale,
                        "to_ps": statistics.median(p[0] for p in step[BATCH]),
                        "from_ps": statistics.median(p[1] for p in step[BATCH]),
                        "to_ps_1": statistics.median(p[0] for p in step.get(1, [[0, 0]])),
                        "from_ps_1": statistics.median(p[1] for p in step.get(1, [[0, 0]])),
                        "batch_one": 1 in step,
                        "dense": known["dense"],
                        "whole": known["whole"],
                        "rows": sum(t["rows"] for t in known["tables"]),
                        "bound": bound,
                        "extra_rows": sum(u.values()) - len(u),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    write_report(args, rows, u, bound, steps_a, steps_b)


def write_report(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    u: dict[str, float],
    bound: float,
    steps_a: int,
    steps_b: int,
) -> None:
    cmd = " ".join(["bench/bench_table_traffic.py", *sys.argv[1:]])
    lines = [
        "# Benchmark: bytes per step to and from the parameter servers, on the wire",
        "",
        f"`.venv/bin/python {cmd}` on {platform.node()} ({os.cpu_count()} cores). examples/ctr "
        f"({EXAMPLES:,} examples written at vocabulary scale {min(r['scale'] for r in rows):g}; "
        f"26 tables of width {EMBED}, split over 2 ps; batch {BATCH}), each ps alone on a "
        "network-namespace host, the chief and workers on a third, over SSH. A step's bytes: "
        f"(run of {steps_b:,} steps - run of {steps_a:,}) / {steps_b - steps_a:,}, TCP payload "
        f"(headers off by packet counts), both ps summed, medians of {args.repeats} pair(s). "
        f"Tables' bound: sum of U x (4 x {EMBED} + 8) over the 26 tables, U the mean distinct ids "
        f"of a batch (counted in the data: {sum(u.values()):,.0f} over the 26 fields, "
        f"{min(u.values()):.1f} to {max(u.values()):.1f}) = {bound:,.0f} B each way.",
        "",
        "| algorithm | vocabulary scale | table rows | tables whole | dense variables | a step "
        f"to / from the ps (batch {BATCH}) | batch 1 | a row to / from the ps | / (4 D + 8) | "
        f"batch {BATCH}'s step / its rows' bound | goal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    per_row = 4 * EMBED + 8
    for r in rows:
        step = f"{r['to_ps']:,.0f} / {r['from_ps']:,.0f} B"
        of_bound = f"{max(r['to_ps'], r['from_ps']) / r['bound']:.2f}x"
        head = (
            f"| {r['algo']} | {r['scale']:g} | {r['rows']:,} | {r['whole']:,} B | {r['dense']:,} B"
        )
        if not r["batch_one"]:
            lines.append(f"{head} | {step} | - | - | - | {of_bound} | - |")
            continue
        to_row = (r["to_ps"] - r["to_ps_1"]) / r["extra_rows"]
        from_row = (r["from_ps"] - r["from_ps_1"]) / r["extra_rows"]
        worst = max(to_row, from_row) / per_row
        lines.append(
            f"{head} | {step} | {r['to_ps_1']:,.0f} / {r['from_ps_1']:,.0f} B | "
            f"{to_row:.1f} / {from_row:.1f} B | {worst:.2f}x | {of_bound} | "
            f"{'pass' if worst <= GOAL else 'FAIL'} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
