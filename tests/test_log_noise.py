"""TensorFlow's start-up noise (tfplan/engine/lognoise.py): which lines are noise, on lines
TensorFlow really prints, and what is never noise; the filter every view of the logs uses
(LogPrinter for apply, logs and watch; a sweep's --verbose stream); the key and the flag; and
end to end, with a real TensorFlow program, that apply's stream, `logs -f` and `logs` show the
same lines, the noise hidden, and `--all-lines` shows the logs whole as they stay on disk.
"""

from __future__ import annotations

import copy
import io
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from apply_helpers import (
    CONF,
    BackgroundTfplan,
    base_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
    wait_until,
)
from rich.console import Console

from tfplan.cli.main import build_parser, parse
from tfplan.cli.output import LogPrinter
from tfplan.config.compose import compose_config, to_config
from tfplan.config.schema import Config
from tfplan.engine.lognoise import (
    HIDDEN_HINT,
    NOISE,
    NoiseFilter,
    is_noise,
    noise_of,
    shows_tf_noise,
)
from tfplan.engine.plans import make_plan
from tfplan.planning.context import PlanContext
from tfplan.sweeps.sweep import SweepOutput

CTX = PlanContext(cwd="/home/user/project", local_python="/usr/bin/python3", tf_version="2.21.0")

# Printed by this project's TensorFlow (tensorflow-cpu 2.21.0) on importing it with
# TF_CPP_MIN_LOG_LEVEL=0 and TF_ENABLE_ONEDNN_OPTS=1, copied from the task logs.
CAPTURED = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795504595.569574   29861 port.cc:153] oneDNN custom operations are on. You may "
    "see slightly different numerical results due to floating-point round-off errors from "
    "different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795504595.607634   29861 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow "
    "with the appropriate compiler flags.",
]

# What CUDA builds of TensorFlow (the `tensorflow` package) print on a machine without a GPU,
# and older releases' wording: TensorFlow's own messages from its sources (cudart_stub.cc,
# cuda_dnn.cc, cuda_fft.cc, cuda_blas.cc, computation_placer.cc, cuda_driver.cc /
# cuda_platform.cc, tf2tensorrt/utils/py_utils.cc, cpu_feature_guard.cc, util/port.cc), in the
# two prefixes TensorFlow logs with: its own (TF <= 2.16) and absl's (TF >= 2.17).
CUDA_BUILDS = [
    "2024-06-28 00:03:52.493638: I tensorflow/tsl/cuda/cudart_stub.cc:28] Could not find cuda "
    "drivers on your machine, GPU will not be used.",
    "2024-05-02 10:11:12.131415: I external/local_tsl/tsl/cuda/cudart_stub.cc:32] Could not find "
    "cuda drivers on your machine, GPU will not be used.",
    "2023-10-09 13:36:23.355516: E tensorflow/compiler/xla/stream_executor/cuda/cuda_dnn.cc:9342] "
    "Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one "
    "has already been registered",
    "2025-02-09 09:37:32.334667: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:607] "
    "Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one "
    "has already been registered",
    "E0000 00:00:1751448150.991431   10148 cuda_blas.cc:1407] Unable to register cuBLAS factory: "
    "Attempting to register factory for plugin cuBLAS when one has already been registered",
    "W0000 00:00:1751448151.003754   10148 computation_placer.cc:177] computation placer already "
    "registered. Please check linkage and avoid linking the same target more than once.",
    "2024-06-28 00:03:53.230172: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT "
    "Warning: Could not find TensorRT",
    "2020-10-08 23:28:14.726991: E tensorflow/stream_executor/cuda/cuda_driver.cc:313] failed "
    "call to cuInit: UNKNOWN ERROR (303)",
    "2024-11-17 16:55:57.478907: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:152] "
    "failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: CUDA_ERROR_NO_DEVICE: no "
    "CUDA-capable device is detected",
    "E0000 00:00:1776197057.753711 3038566 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "2023-05-01 12:17:26.167599: I tensorflow/core/util/port.cc:110] oneDNN custom operations are "
    "on. You may see slightly different numerical results due to floating-point round-off errors "
    "from different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "2023-05-01 12:17:26.189953: I tensorflow/core/platform/cpu_feature_guard.cc:182] This "
    "TensorFlow binary is optimized to use available CPU instructions in performance-critical "
    "operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI FMA, in other operations, "
    "rebuild TensorFlow with the appropriate compiler flags.",
    "2021-05-01 10:00:00.000001: I tensorflow/core/platform/cpu_feature_guard.cc:142] This "
    "TensorFlow binary is optimized with oneAPI Deep Neural Network Library (oneDNN) to use the "
    "following CPU instructions in performance-critical operations:  AVX2 FMA",
    "To enable them in other operations, rebuild TensorFlow with the appropriate compiler flags.",
    "2019-09-18 17:49:26.342297: I tensorflow/core/platform/cpu_feature_guard.cc:142] Your CPU "
    "supports instructions that this TensorFlow binary was not compiled to use: AVX2 FMA",
]

# Never noise: a program's own output (stdout and stderr, the noise's words in it included),
# errors, TensorFlow's fatal lines, and every other TensorFlow message.
NEVER_NOISE = [
    "",
    "worker/0 importing TensorFlow",
    "step=1 loss=0.5",
    "Traceback (most recent call last):",
    'ValueError: expected "Could not find cuda drivers on your machine, GPU will not be used."',
    "Could not find cuda drivers on your machine, GPU will not be used.",  # unprefixed: a print
    "worker says: WARNING: All log messages before absl::InitializeLog() is called are written "
    "to STDERR",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow "
    "with the appropriate compiler flags. Then rerun.",
    # fatal: the process is about to die, whatever the message
    "2019-01-01 00:00:00.000000: F tensorflow/core/platform/cpu_feature_guard.cc:37] The "
    "TensorFlow library was compiled to use AVX instructions, but these aren't available on your "
    "machine.",
    "F0000 00:00:1795504144.178888    1098 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    # a GPU that is there but does not work is not start-up noise
    "2020-08-11 07:28:29.379866: E tensorflow/stream_executor/cuda/cuda_driver.cc:318] failed "
    "call to cuInit: CUDA_ERROR_UNKNOWN: unknown error",
    "E0000 00:00:1781701928.366541   47780 cuda_executor.cc:1737] INTERNAL: CUDA Runtime error: "
    "Failed call to cudaGetRuntimeVersion: Error loading CUDA libraries. GPU will not be used.: "
    "Error loading CUDA libraries. GPU will not be used.",
    "2024-11-17 16:55:58.027508: W external/local_xla/xla/tsl/framework/cpu_allocator_impl.cc:83] "
    "Allocation of 169344000 exceeds 10% of free system memory.",
    "2024-11-01 10:50:29.061816: E tensorflow/core/util/util.cc:131] oneDNN supports DT_INT64 only "
    "on platforms with AVX-512. Falling back to the default Eigen-based implementation if present.",
    "2024-11-01 10:50:29.061816: E tensorflow/core/framework/op_kernel.cc:1838] OP_REQUIRES "
    "failed at save_restore_v2_ops.cc:150 : NOT_FOUND: /out/model.ckpt-1; No such file",
]


@pytest.mark.parametrize("line", CAPTURED + CUDA_BUILDS)
def test_tensorflows_start_up_lines_are_noise(line: str) -> None:
    assert is_noise(line)
    assert is_noise(line + "\r") and is_noise("  " + line + "  ")  # CRLF logs, stray spaces


@pytest.mark.parametrize("line", NEVER_NOISE)
def test_other_lines_errors_and_fatal_ones_are_never_noise(line: str) -> None:
    assert not is_noise(line)


def test_every_pattern_is_met_by_a_real_line() -> None:
    """No pattern is dead data: each is the one a line of the lists above is."""
    met = {noise.name for line in CAPTURED + CUDA_BUILDS if (noise := noise_of(line))}
    assert met == {n.name for n in NOISE}


# ---- the filter, the printer, the sweep's stream ---------------------------------------------
def test_the_filter_keeps_tfplans_lines_and_everything_when_asked_and_hints_once() -> None:
    noise = NoiseFilter()
    assert noise.keeps("worker/0", "step=1") and not noise.hint_due
    assert not noise.keeps("worker/0", CAPTURED[0]) and not noise.keeps("ps/0", CAPTURED[2])
    assert noise.keeps("tfplan", CAPTURED[0])  # tfplan's own lines are never filtered
    assert noise.hidden == 2 and noise.hint_due and not noise.hint_due
    everything = NoiseFilter(show_all=True)
    assert all(everything.keeps("worker/0", line) for line in CAPTURED + CUDA_BUILDS)
    assert everything.hidden == 0 and not everything.hint_due


def _printer(show_all: bool = False) -> tuple[LogPrinter, io.StringIO]:
    buffer = io.StringIO()
    return LogPrinter(Console(file=buffer, width=100), show_all), buffer


def test_the_printer_leaves_out_the_noise_and_says_so_once() -> None:
    printer, buffer = _printer()
    for line in ["worker/0 importing", *CAPTURED, "worker/0 ready", *CUDA_BUILDS]:
        printer.emit("worker/0", line)
    assert buffer.getvalue().splitlines() == [
        "worker/0     | worker/0 importing",
        f"tfplan       | {HIDDEN_HINT}",
        "worker/0     | worker/0 ready",
    ]
    everything, buffer = _printer(show_all=True)
    for line in CAPTURED:
        everything.emit("worker/0", line)
    assert buffer.getvalue().splitlines() == [f"worker/0     | {line}" for line in CAPTURED]


def test_a_log_read_whole_counts_the_last_lines_among_those_shown() -> None:
    printer, buffer = _printer()
    printer.emit_log("ps/0", ["one", "two", *CAPTURED], last=2)
    assert buffer.getvalue().splitlines() == [
        f"tfplan       | {HIDDEN_HINT}",
        "ps/0         | one",
        "ps/0         | two",
    ]


def test_a_verbose_sweep_leaves_out_the_noise_unless_asked() -> None:
    printed: list[str] = []
    output = SweepOutput(printed.append, verbose=True)
    first, second, shown = output.emit(1), output.emit(2), output.emit(3, show_all=True)
    for emit in (first, second, shown):
        emit("worker/0", CAPTURED[0])
        emit("worker/0", "step=1")
    assert printed == [
        f"#1 tfplan | {HIDDEN_HINT}",  # once per sweep
        "#1 worker/0 | step=1",
        "#2 worker/0 | step=1",
        f"#3 worker/0 | {CAPTURED[0]}",
        "#3 worker/0 | step=1",
    ]


# ---- the key and the flag ----------------------------------------------------------------------
@cache
def _composed(overrides: tuple[str, ...]) -> Config:
    return to_config(compose_config(list(overrides), CONF))


@pytest.mark.parametrize(
    ("overrides", "shown"), [((), False), (("recipe.show_tf_noise=true",), True)]
)
def test_the_key_travels_in_the_plan_and_so_in_the_state(
    overrides: tuple[str, ...], shown: bool
) -> None:
    plan = make_plan(copy.deepcopy(_composed(("cluster=local", *overrides))), None, CTX)
    assert shows_tf_noise(plan.source_config) is shown
    # a plan or state written before the key existed: hidden
    assert shows_tf_noise({}) is False and shows_tf_noise({"config": {"recipe": {}}}) is False


@pytest.mark.parametrize("verb", [["apply", "a=1"], ["logs", "worker/0"], ["watch"]])
def test_apply_logs_and_watch_take_all_lines(verb: list[str]) -> None:
    given = [*verb, "--all-lines"]
    assert parse(build_parser(given), given).all_lines is True
    assert parse(build_parser(verb), verb).all_lines is False


# ---- end to end ----------------------------------------------------------------------------------
# A program of the user's own that imports TensorFlow, which prints its start-up noise (the
# environment asks for all of it), writes to stderr itself, and waits for the test's gate file.
PROGRAM = r"""
import json, os, pathlib, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}/{task['index']}"
print(f"{name} importing TensorFlow", flush=True)
import tensorflow as tf
print(f"{name} sum={int(tf.constant(1) + 1)}", flush=True)
print(f"{name} warning of its own on stderr", file=sys.stderr, flush=True)
print(f"{name} waiting", flush=True)
gate = pathlib.Path(sys.argv[1])
while not gate.exists():
    time.sleep(0.05)
print("step=1 loss=0.5", flush=True)
"""


def _task_lines(lines: list[str], task: str = "worker/0") -> list[str]:
    prefix = f"{task:<12} | "
    return [line[len(prefix) :] for line in lines if line.startswith(prefix)]


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


@pytest.mark.cluster
def test_apply_logs_f_watch_and_logs_show_the_same_lines_all_lines_the_whole_log(
    ws: Path,
) -> None:
    program = ws / "program.py"
    program.write_text(PROGRAM)
    gate = ws / "gate"
    apply = BackgroundTfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, free_port_base()),
        "cluster=local_allreduce",
        "algo=allreduce",
        "cluster.workers=1",
        "recipe=command",
        f"recipe.command='{sys.executable} {program} {gate}'",
        "+recipe.env.TF_CPP_MIN_LOG_LEVEL=0",
        "+recipe.env.TF_ENABLE_ONEDNN_OPTS=1",
        # a cold start: TensorFlow's start-up noise is printed by the import, in the task's own
        # log (a task forked from the warm seed imported nothing; the seed's log has the noise)
        "cluster.warm=false",
    )
    try:
        wait_until(
            lambda: apply.saw("Apply complete!") or apply.proc.poll() is not None,
            120,
            "the task started",
        )
        assert apply.saw("Apply complete!"), "\n".join(apply.lines)
        follow = BackgroundTfplan(ws, "logs", "-f")
        watch = BackgroundTfplan(ws, "watch")  # apply supervises: watch follows the tasks' logs
        # all follow the task from its first line: once all saw it wait, it may go on
        waiting = "worker/0     | worker/0 waiting"
        views = (apply, follow, watch)
        wait_until(
            lambda: (
                all(v.saw(waiting) for v in views) or any(v.proc.poll() is not None for v in views)
            ),
            240,
            "TensorFlow imported, in apply's stream, logs -f and watch",
        )
    finally:
        gate.touch()
    applied, followed, watched = apply.finish(120), follow.finish(60), watch.finish(60)
    for view in views:
        assert view.proc.returncode == 0, "\n".join(view.lines)
    assert watch.saw("is supervised by pid")
    shown = tfplan(ws, "logs", check=True).stdout.splitlines()
    whole = tfplan(ws, "logs", "--all-lines", check=True).stdout.splitlines()

    # the log on disk is whole: TensorFlow's start-up noise is there
    log = Path(state_of(ws)["tasks"][0]["log_path"]).read_text().splitlines()
    noise = [line for line in log if is_noise(line)]
    assert noise, log
    assert _task_lines(whole) == log and f"tfplan       | {HIDDEN_HINT}" not in whole
    # every view shows the same lines: the log less the noise, and says once that it hid some
    expected = [line for line in log if not is_noise(line)]
    assert expected == [
        "worker/0 importing TensorFlow",
        "worker/0 sum=2",
        "worker/0 warning of its own on stderr",
        "worker/0 waiting",
        "step=1 loss=0.5",
    ]
    for view in (applied, followed, watched, shown):
        assert _task_lines(view) == expected, "\n".join(view)
        assert view.count(f"tfplan       | {HIDDEN_HINT}") == 1, "\n".join(view)
