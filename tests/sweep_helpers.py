"""Helpers for the sweep, experiment and report tests: a fake training program that writes what
the built-in recipes write (result.json, eval/metrics.jsonl), and sweep overrides."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Any TF_CONFIG program can be launched (recipe=command). This one: ps serves until stopped; the
# chief prints steps, appends one held-out accuracy per step to eval/metrics.jsonl (and prints it
# as the evaluator does: `eval step=N accuracy=X`, what a sweep prunes on), then writes
# result.json (accuracy from acc=, or, with acc=lr, a function of algo.lr read from run.yaml) and
# exits with exit=; the other workers exit 0 after worker_secs. With barrier=DIR parties=N the
# chief first signs in under DIR and makes no step before N chiefs have: N points then run at the
# same time as an order of events, on any machine speed. With hold_lr=X the chief of the point
# whose algo.lr is X stops after its first step and waits to be stopped (or fails after 120 s):
# a point the sweep must prune is then pruned before its end as an order of events too.
RESULT_TASK = r"""
import json, os, sys, time
import yaml
spec = json.loads(os.environ["TF_CONFIG"])
role, index = spec["task"]["type"], spec["task"]["index"]
args = dict(a.split("=", 1) for a in sys.argv[1:])
if role == "ps":
    while True:
        time.sleep(0.2)
if not (role == "chief" or (role == "worker" and index == 0 and "chief" not in spec["cluster"])):
    time.sleep(float(args.get("worker_secs", "0.3")))
    sys.exit(0)
run = yaml.safe_load(open(os.environ["TFPLAN_RUN_CONFIG"]))
out = os.environ["TFPLAN_OUTPUT_DIR"]
os.makedirs(os.path.join(out, "eval"), exist_ok=True)
barrier = args.get("barrier")
if barrier:
    os.makedirs(barrier, exist_ok=True)
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(barrier)) < int(args.get("parties", "2")):
        if time.monotonic() > deadline:
            sys.exit(9)
        time.sleep(0.02)
lr = float(run["algo"]["lr"])
acc = 1.0 - abs(lr - 0.05) if args.get("acc", "lr") == "lr" else float(args["acc"])
steps = int(args.get("steps", "4"))
for step in range(1, steps + 1):
    print(f"step={step} loss={1.0 / step:.3f}", flush=True)
    time.sleep(float(args.get("step_secs", "0.1")))
    with open(os.path.join(out, "eval", "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"global_step": step, "accuracy": round(acc * step / steps, 6),
                            "loss": 1.0 / step, "time": time.time()}) + "\n")
    print(f"eval step={step} accuracy={acc * step / steps:.6f}", flush=True)
    if "hold_lr" in args and lr == float(args["hold_lr"]):  # waits to be pruned (120 s at most)
        time.sleep(120)
        sys.exit(3)
if args.get("exit", "0") != "0":
    sys.exit(int(args["exit"]))
result = {"status": "succeeded", "global_step": steps, "loss": round(0.5 / steps, 6),
          "accuracy": round(acc, 6), "examples_per_sec": 1000.0 + steps, "wall_time_secs": 0.5}
with open(os.path.join(out, "result.json.tmp"), "w") as f:
    json.dump(result, f)
os.replace(os.path.join(out, "result.json.tmp"), os.path.join(out, "result.json"))
"""


def result_task(tmp: Path, tensorflow: bool = False) -> Path:
    """The result task's script; ``tensorflow``: as a TensorFlow program (its first line imports
    TensorFlow: a warm seed forks it, where the import is done already), else it starts cold."""
    from apply_helpers import TENSORFLOW_PROGRAM

    script = tmp / ("result_tf_task.py" if tensorflow else "result_task.py")
    script.write_text((TENSORFLOW_PROGRAM if tensorflow else "") + RESULT_TASK)
    return script


def command(script: Path, **args: str) -> str:
    """A recipe.command value, quoted for Hydra's override grammar."""
    extra = " ".join(f"{k}={v}" for k, v in args.items())
    return f"'{sys.executable} {script} {extra}'".replace(" '", "'")


def sweep_overrides(tmp: Path, port_base: int, sweep: str = "s") -> list[str]:
    return [
        f"experiment.id={sweep}",
        f"cluster.port_base={port_base}",
        "cluster.port_range=10",
        f"cluster.workdir={tmp}/work",
        f"cluster.output_dir={tmp}/out",
        "lifecycle.ps_grace_secs=1",
        "lifecycle.stop_grace_secs=2",
        f"lifecycle.snapshot_dir={tmp}/shm",  # a stopped ps leaves its snapshots (apply_helpers)
    ]


def sweep_record(sweep_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((sweep_dir / "sweep.json").read_text())
    return data
