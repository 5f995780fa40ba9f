"""The matcher of known failures (pure): gating by exit status and kernel record, the last match,
placeholders. The entries themselves are proved against real failures in
tests/test_known_failures.py."""

from __future__ import annotations

import pytest

from tfplan.diagnosis import catalogue
from tfplan.diagnosis.catalogue import CATALOGUE, KnownFailure, register
from tfplan.diagnosis.explain import (
    Evidence,
    OomKill,
    bytes_text,
    error_line,
    explain,
    last_lines,
)
from tfplan.diagnosis.frames import error_frames, is_own_file, last_error, project_path


def evidence(output: str = "", exit_code: int | None = 1, **extra: object) -> Evidence:
    return Evidence("worker/1", "h2", exit_code, output, "/out", **extra)  # type: ignore[arg-type]


def test_an_out_of_memory_kill_needs_both_the_exit_status_and_the_kernel_record() -> None:
    oom = OomKill(pid=7, name="python", rss_bytes=3 * 2**30, at=0.0)
    assert explain(evidence(exit_code=137)) is None
    assert explain(evidence(exit_code=1, oom=oom)) is None
    found = explain(evidence(exit_code=137, oom=oom))
    assert found is not None and found.id == "oom-killed"
    assert found.cause == "killed by the out-of-memory killer on host h2 at RSS 3.0 GiB"
    unknown = OomKill(pid=0, name="tensorflow", rss_bytes=0, at=0.0)  # a kubelet's OOMKilled
    found = explain(evidence(exit_code=137, oom=unknown))
    assert found is not None and found.cause == "killed by the out-of-memory killer on host h2"


def test_a_task_that_ended_well_is_explained_only_when_it_never_joined_the_cluster() -> None:
    assert explain(evidence("loss became NaN near step=3", exit_code=0)) is None
    assert explain(evidence(exit_code=0)) is None
    found = explain(evidence(exit_code=0, never_listened=True))
    assert found is not None and found.id == "tf-config-ignored"
    assert explain(evidence(exit_code=1, never_listened=True)) is None


def test_the_last_match_fills_the_placeholders() -> None:
    output = "loss became NaN near step=12: lower\nloss became NaN near step=40: lower\n"
    found = explain(evidence(output, exit_code=3))
    assert found is not None and found.cause == "the loss became NaN at step 40"
    assert "algo.lr" in found.fix


def test_a_fix_keeps_literal_braces_and_a_missing_group_is_a_question_mark() -> None:
    found = explain(evidence("x.py: error: the following arguments are required: --job_name"))
    assert found is not None
    assert found.cause == "the program needs --job_name, which recipe.command does not pass"
    assert "{job_name}" in found.fix and "{task_index}" in found.fix


def test_an_unknown_failure_is_not_explained_and_keeps_its_last_lines() -> None:
    output = "starting\n\nTraceback (most recent call last):\nValueError: my own bug\n\n"
    assert explain(evidence(output)) is None
    assert last_lines(output, 2) == ["Traceback (most recent call last):", "ValueError: my own bug"]


def test_preflight_entries_never_match_a_run() -> None:
    gpus = next(e for e in CATALOGUE if e.id == "gpus-missing")
    assert gpus.where == "preflight" and explain(evidence(""), [gpus]) is None


def test_an_extension_registers_its_own_entry_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalogue, "CATALOGUE", list(CATALOGUE))
    mine = KnownFailure(
        id="my-lib-license",
        title="the license server is down",
        patterns=(r"license server (?P<server>\S+) unreachable",),
        cause="{task} could not reach the license server {server}",
        fix="start it",
        reproduce="stop the server",
    )
    catalogue.register(mine, first=True)
    found = explain(evidence("license server lic1:27000 unreachable"), catalogue.CATALOGUE)
    assert (
        found is not None
        and found.cause == "worker/1 could not reach the license server lic1:27000"
    )
    with pytest.raises(ValueError, match="already registered"):
        catalogue.register(mine)
    assert register is catalogue.register


def test_the_error_line_is_quoted_not_a_frame_or_a_hint_after_it() -> None:
    user_code = (
        "step=0 loss=2.3\n"
        "error: model._target_=pkg.models.build raised KeyError: 'hidden_units' at pkg/models.py:7\n"
        "  pkg/models.py:7 in build: units = cfg['hidden_units']\n"
        "  (TFPLAN_DEBUG=1 shows the whole traceback)\n"
    )
    assert error_line(user_code) == (
        "error: model._target_=pkg.models.build raised KeyError: 'hidden_units' at pkg/models.py:7"
    )
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/x/tensorflow/python/framework/ops.py", line 1221, in from_node_def\n'
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: No space left on device\n"
        '  File "/x/tensorflow/python/framework/ops.py", line 1221, in from_node_def\n'
    )
    assert error_line(traceback) == (
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: No space left on device"
    )
    assert error_line("step=1 loss=0.5\nbye\n") is None


# --- the user's own frames (tfplan/diagnosis/frames.py) ----------------------------------------

RECIPE_ERROR = (
    "step=0 loss=2.3\n"
    "error: model._target_=pkg.models.build raised KeyError: 'hidden_units' at "
    "/w/_code/pkg/models.py:7 in build: units = cfg['hidden_units']\n"
    "  /w/_code/pkg/layers.py:3 in dense: return make(cfg)\n"
    "  /w/_code/pkg/models.py:7 in build: units = cfg['hidden_units']\n"
    "  (TFPLAN_DEBUG=1 shows the whole traceback)\n"
)

PROGRAM_TRACEBACK = """\
step=1 loss=0.5
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/home/me/proj/train.py", line 30, in <module>
    main()
  File "/home/me/proj/train.py", line 12, in main
    model = build(cfg)
            ^^^^^^^^^^
  File "/home/me/proj/models.py", line 4, in build
    units = cfg["x"]
            ~~~^^^^^
  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads
    return _default_decoder.decode(s)
  File "/venv/lib/python3.11/site-packages/keras/src/layers/core/dense.py", line 88, in build
    raise KeyError(name)
  File "/usr/lib/python3/dist-packages/numpy/core/x.py", line 1, in f
  File "/w/_code/recipes/train.py", line 80, in _run
KeyError: 'x'
"""


def test_the_recipes_frames_are_the_ones_under_the_error_line_without_the_hint() -> None:
    assert error_frames(RECIPE_ERROR) == [
        "/w/_code/pkg/layers.py:3 in dense: return make(cfg)",
        "/w/_code/pkg/models.py:7 in build: units = cfg['hidden_units']",
    ]
    found = last_error(RECIPE_ERROR)
    assert found is not None and found.form == "error" and found.line.startswith("error: model.")
    assert error_frames(RECIPE_ERROR, limit=1) == [
        "/w/_code/pkg/models.py:7 in build: units = cfg['hidden_units']"
    ]


def test_a_traceback_keeps_only_the_users_files_innermost_last() -> None:
    """Never the standard library, an installed package, frozen code or tfplan's recipes; the
    source line without 3.11's carets; the innermost three."""
    assert error_frames(PROGRAM_TRACEBACK) == [
        "/home/me/proj/train.py:30 in <module>: main()",
        "/home/me/proj/train.py:12 in main: model = build(cfg)",
        '/home/me/proj/models.py:4 in build: units = cfg["x"]',
    ]
    found = last_error(PROGRAM_TRACEBACK)
    assert found is not None and found.form == "traceback" and found.line == "KeyError: 'x'"


def test_the_last_error_counts_a_chained_exception_its_outermost_traceback() -> None:
    chained = (
        PROGRAM_TRACEBACK
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + "Traceback (most recent call last):\n"
        + '  File "/home/me/proj/train.py", line 14, in main\n'
        + "    raise ValueError('bad config') from None\n"
        + "ValueError: bad config\n"
    )
    assert error_frames(chained) == [
        "/home/me/proj/train.py:14 in main: raise ValueError('bad config') from None"
    ]
    # a recipes' error line after a traceback is the last error, and the other way round
    assert error_frames(PROGRAM_TRACEBACK + RECIPE_ERROR)[-1].startswith("/w/_code/pkg/models.py")
    assert error_frames(RECIPE_ERROR + PROGRAM_TRACEBACK)[-1].startswith("/home/me/proj/models.py")
    syntax = 'Traceback (most recent call last):\n  File "/p/t.py", line 3\n    x = (\n        ^\n'
    assert error_frames(syntax + "SyntaxError: '(' was never closed\n") == ["/p/t.py:3: x = ("]


def test_no_frames_of_the_users_code_in_a_tensorflow_failure_or_a_plain_log() -> None:
    tensorflow_only = (
        "error: ResourceExhaustedError: Graph execution error:\n\n"
        "Detected at node 'save/SaveV2' defined at (most recent call last):\n"
        '    File "/w/_code/recipes/train.py", line 180, in <module>\n'
        "Original stack trace for 'save/SaveV2':\n"
        '  File "/w/_code/recipes/runtime.py", line 192, in chief_saver\n'
        '  File "/v/lib/python3.11/site-packages/tensorflow/python/training/saver.py", line 9\n'
    )
    assert error_frames(tensorflow_only) == []
    assert error_frames("step=1 loss=0.5\nbye\n") == []
    assert last_error("step=1\n") is None
    assert not is_own_file("<frozen runpy>") and not is_own_file("/usr/lib/python3.11/os.py")
    assert is_own_file("/home/me/lib/project/models.py")
    assert project_path("/w/_code/pkg/models.py:7") == "pkg/models.py:7"
    assert project_path("/home/me/proj/models.py:4") == "/home/me/proj/models.py:4"


def test_the_users_code_is_explained_with_its_error_and_where_to_fix_it() -> None:
    found = explain(evidence(RECIPE_ERROR))
    assert found is not None and found.id == "user-code"
    assert found.cause.startswith("model._target_=pkg.models.build raised KeyError: 'hidden_units'")
    assert "fix pkg/models.py:7 in your project" in found.fix and "TFPLAN_DEBUG=1" in found.fix
    found = explain(evidence(PROGRAM_TRACEBACK))
    assert found is not None and found.id == "user-traceback"
    assert found.cause == "KeyError: 'x' at /home/me/proj/models.py:4 in build: units = cfg[\"x\"]"
    assert "/home/me/proj/models.py:4" in found.fix and "tfplan logs worker/1" in found.fix
    # an error without frames of the user's code stays as it was: unknown
    assert explain(evidence("error: ResourceExhaustedError: Graph execution error:\n")) is None


def test_a_specific_entry_wins_over_the_users_code_even_one_registered_after_it() -> None:
    estimator = PROGRAM_TRACEBACK.replace(
        "KeyError: 'x'", "AttributeError: module 'tensorflow' has no attribute 'estimator'"
    )
    found = explain(evidence(estimator))
    assert found is not None and found.id == "estimator-removed"
    mine = KnownFailure(
        id="mine", title="t", cause="c", fix="f", reproduce="r", patterns=(r"KeyError: 'x'",)
    )
    found = explain(evidence(PROGRAM_TRACEBACK), [*CATALOGUE, mine])
    assert found is not None and found.id == "mine"


# --- a full disk ------------------------------------------------------------------------------


def test_a_full_disk_names_the_output_folder_the_fix_and_asks_for_its_free_space() -> None:
    checkpoint = (
        "error: ResourceExhaustedError: Graph execution error:\n"
        "/out/model.ckpt-0.data-00000-of-00001.tempstate8184; No space left on device\n"
        "\t [[{{node save/SaveV2}}]]\n"
    )
    found = explain(evidence(checkpoint))
    assert found is not None and found.id == "disk-full"
    assert found.cause == "worker/1 could not write to /out: its disk is full"
    assert found.free_space_of == "/out"
    assert "cluster.output_dir" in found.fix and "trainer.keep_checkpoints" in found.fix
    found = explain(evidence(checkpoint, free_bytes=3 * 2**10))
    assert found is not None and found.free_space_of is None
    assert found.cause == "worker/1 could not write to /out: its disk is full (3 KiB free now)"


def test_a_full_disk_elsewhere_names_that_folder() -> None:
    python = "OSError: [Errno 28] No space left on device: '/scratch/me/cache/x.bin'\n"
    found = explain(evidence(python, free_bytes=0))
    assert found is not None and found.id == "disk-full"
    assert (
        found.cause
        == "worker/1 could not write to /scratch/me/cache: its disk is full (0 bytes free now)"
    )
    flush = "Failed to flush 3 records to /logs/events.out: No space left on device\n"
    found = explain(evidence(flush))
    assert found is not None and found.free_space_of == "/logs"
    found = explain(evidence("OSError: [Errno 28] No space left on device\n"))
    assert found is not None and found.free_space_of == "/out"
    assert bytes_text(5 * 2**30) == "5.0 GiB" and bytes_text(512) == "512 bytes"


def test_a_table_resumed_with_another_shape_names_the_variable_both_shapes_and_the_fix() -> None:
    """What TensorFlow's restore of a split table says when the model's table has other rows
    than the checkpoint's (the slices' spec carries the model's full shape)."""
    output = (
        "tensorflow.python.framework.errors_impl.InvalidArgumentError: Restoring from checkpoint "
        "failed. [...] tensor_name = model/item_embedding/embeddings; shape in shape_and_slice "
        "spec [60000,16] does not match the shape stored in checkpoint: [50000,16]\n"
    )
    found = explain(evidence(output))
    assert found is not None and found.id == "checkpoint-shape"
    assert found.cause == (
        "the checkpoints in /out hold model/item_embedding/embeddings as [50000,16], but the "
        "model's is [60000,16] (a table's rows or a layer's width changed since they were "
        "written)"
    )
    assert "new experiment.id" in found.fix and "input_dim" in found.fix
