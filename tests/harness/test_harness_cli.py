"""The harness's commands through the real entry point: profile, linkbench, run, validate, and no torch."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from validation_oracle import check_report_arithmetic

ROOT = Path(__file__).resolve().parents[2]
NO_TORCH = "import sys; sys.modules['torch'] = None; from pipesim.cli import main; main(sys.argv[1:])"


def pipesim(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


@pytest.mark.parametrize("args", [
    ["profile", "--microbatch-size", "2", "--out", "p.json"],
    ["linkbench", "--out", "t.json"],
    ["run", "--profile", "p.json", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--out", "t.json"],
    ["validate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--microbatch-size", "2"],
])
def test_without_torch_the_harness_commands_say_how_to_install_it(args: list[str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "pip install torch==2.13.0" in done.stderr and "pip install -e .[harness]" in done.stderr


def test_without_torch_the_rest_of_the_cli_works() -> None:
    done = subprocess.run([sys.executable, "-c", NO_TORCH, "schedule", "--schedule", "gpipe", "--stages", "2",
                           "--microbatches", "2"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0 and "0F0" in done.stdout


torch_needed = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="needs torch (pip install torch==2.13.0, then pip install -e .[harness])")


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("harness") / "profile.json"
    done = pipesim("profile", "--model", "mlp", "--depth", "3", "--width", "16", "--microbatch-size", "4",
                   "--warmup", "1", "--repeats", "3", "--processes", "1", "--out", str(path))
    assert done.returncode == 0, done.stderr
    return path


@torch_needed
def test_profile_writes_every_layer_with_times_and_exact_sizes(profile_path: Path) -> None:
    from pipesim.spec.files import load_profile

    profile = load_profile(profile_path)
    assert [layer.name for layer in profile.layers] == ["linear0", "block1", "block2", "loss"]
    activation = 4 * 16 * 4  # microbatch 4, width 16, float32
    assert [layer.activation_bytes for layer in profile.layers] == [activation] * 3 + [4]
    # linear0 keeps its input; a block keeps its ReLU's output; the loss keeps its input and target.
    assert [layer.stashed_bytes for layer in profile.layers] == [activation] * 3 + [2 * activation]
    assert [layer.param_bytes for layer in profile.layers] == [(16 * 16 + 16) * 4] * 3 + [0]
    for layer in profile.layers:  # net of the executor's own cost: tiny layers may round to 0
        assert layer.forward_s >= 0 and layer.backward_s >= 0 and layer.update_s is not None
        assert layer.forward_std_s is not None and layer.backward_std_s is not None
    # the runtime's cost per op, measured by a two-rank run of null layers: each kind is clamped at
    # 0 (under heavy load a null layer's own time can exceed its span), but a forward and a backward
    # always cost the runtime something (a receive, an isend, the records)
    overheads = (profile.forward_overhead_s, profile.backward_overhead_s, profile.update_overhead_s)
    assert all(value is not None and 0 <= value < 0.1 for value in overheads), overheads
    assert (profile.forward_overhead_s or 0) + (profile.backward_overhead_s or 0) > 0, overheads
    assert profile.microbatch_size == 4 and profile.dtype == "float32" and profile.device.startswith("cpu")
    assert profile.source.startswith("pipesim.harness model=")


@torch_needed
def test_linkbench_writes_a_fitted_topology(tmp_path: Path) -> None:
    from pipesim.spec.files import load_topology

    done = pipesim("linkbench", "--ranks", "2", "--max-bytes", "64KB", "--repeats", "5", "--out",
                   str(tmp_path / "topology.json"))
    assert done.returncode == 0, done.stderr
    topology = load_topology(tmp_path / "topology.json")
    assert topology.num_devices == 2
    assert topology.latency_s >= 0 and topology.bandwidth_bytes_per_s > 0
    assert "64000 B" in done.stdout and "latency" in done.stdout


@torch_needed
def test_run_writes_a_trace_whose_metrics_match_the_json(profile_path: Path, tmp_path: Path) -> None:
    from pipesim.engine.trace import Trace
    from pipesim.metrics import compute_metrics

    out = tmp_path / "trace.json"
    done = pipesim("run", "--profile", str(profile_path), "--schedule", "2bw", "--stages", "2", "--microbatches", "2",
                   "--minibatches", "3", "--json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    trace = Trace.from_json(out.read_text())
    assert data == json.loads(json.dumps(compute_metrics(trace).to_dict()))
    assert data["engine"] == "torch" and data["num_minibatches"] == 3
    assert all(stage["weight_versions_max"] == 2 for stage in data["stages"])


@torch_needed
@pytest.mark.parametrize(("args", "message"), [
    (("--model", ""), "model='': must be mlp, transformer, MODULE:CALLABLE or FILE.py:CALLABLE"),
    (("--model", "mlp", "--input-shape", "3,32"),
     "input_shape='3,32': applies to a user model only; mlp takes its shape from its sizes"),
    (("--model", "os:getcwd"), "input_shape=None: must be given for a user model, e.g. 3,32,32"),
    (("--warmup", "-1"), "warmup=-1: must be >= 0"),
    (("--repeats", "0"), "repeats=0: must be >= 1"),
    (("--threads", "0"), "threads=0: must be >= 1"),
    (("--processes", "1000000000000"), "processes=1000000000000: must be from 1 to 1,024"),
    (("--depth", "0"), "depth=0: must be an integer >= 1"),
    (("--depth", "1000000000000"), "depth=1000000000000: must be an integer from 1 to 100,000"),
    (("--model", "transformer", "--width", "10", "--heads", "3"), "heads=3: must divide width (10)"),
    (("--model", "/nonexistent/mymodels.py:build", "--input-shape", "16"),
     "model='/nonexistent/mymodels.py:build': file /nonexistent/mymodels.py does not exist"),
])
def test_profile_refuses_bad_options_before_any_process_starts(args: tuple[str, ...], message: str,
                                                              tmp_path: Path) -> None:
    """Named in one line with exit 2 (a bad name, size or thread count was a failed run, exit 1,
    and 10**12 layers hung; a bad warmup was reported as repeats; an input shape for a built-in
    model was ignored)."""
    done = pipesim("profile", "--microbatch-size", "2", *args, "--out", str(tmp_path / "p.json"), timeout=60)
    assert (done.returncode, done.stderr, done.stdout) == (2, f"pipesim: error: {message}\n", "")
    assert list(tmp_path.iterdir()) == []


@torch_needed
@pytest.mark.parametrize(("model", "message"), [
    ("{bad", "source='pipesim.harness model={bad': must name the model pipesim profile measured after "
             "'pipesim.harness model=': Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ('{"name": "mlp"}', "source='pipesim.harness model={\"name\": \"mlp\"}': must name the model pipesim profile "
                        "measured after 'pipesim.harness model=': lacks 'depth'"),
    ("[1]", "source='pipesim.harness model=[1]': must name the model pipesim profile measured after "
            "'pipesim.harness model=': holds a JSON list, not an object"),
])
@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_profile_whose_source_names_no_model_is_refused_in_one_line(command: str, model: str, message: str,
                                                                     tmp_path: Path) -> None:
    """A harness source that is not the model's JSON object was a traceback (exit 1)."""
    from pipesim.spec.files import load_profile, save_model

    path = tmp_path / "profile.json"
    save_model(load_profile(ROOT / "traces" / "vgg16.json").model_copy(
        update={"source": "pipesim.harness model=" + model}), path)
    out = ("--out", str(tmp_path / "t.json")) if command == "run" else ()
    done = pipesim(command, "--profile", str(path), "--schedule", "1f1b", "--stages", "2", "--microbatches", "2",
                   *out, timeout=60)
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: {path}: {message}\n")
    assert not (tmp_path / "t.json").exists()


@torch_needed
@pytest.mark.parametrize(("command", "args", "message"), [
    ("run", ("--op-timeout", "0"), "op_timeout=0.0: must be > 0 seconds"),
    ("run", ("--stages", "0"), "num_stages=0: must be >= 1"),
    ("run", ("--stages", "-1"), "num_stages=-1: must be >= 1"),
    ("run", ("--op-timeout", "nan"), "op_timeout=nan: must be > 0 seconds"),
    ("validate", ("--op-timeout", "-1"), "op_timeout=-1.0: must be > 0 seconds"),
    ("validate", ("--ranks", "1000000000000"), "ranks=1000000000000: must be from 1 to 1,024"),
    # Options of a profile validate measures itself were dropped without a word beside --profile.
    ("validate", ("--reprofile",), "reprofile=True: applies where validate measures the profile; --profile gives it"),
    ("validate", ("--profile-repeats", "5"),
     "profile_repeats=5: applies where validate measures the profile; --profile gives it"),
    ("validate", ("--microbatch-size", "3"),
     "microbatch_size=3: must equal the profile's (128): a profile was measured at its size"),
    ("run", ("--run-dir", "{file}"), "run_dir='{file}': must be a folder, but it is a file"),
    ("run", ("--weights-out", "{file}"), "weights_out='{file}': must be a folder, but it is a file"),
    ("run", ("--minibatches", "1000000000000"),
     "num_ops=10000000000000: the run would need about 4367902.9 GiB (analytic engine) or 4526227.7 GiB (des), more "
     "than the limit of 8,800,000 ops allows; use fewer stages, microbatches or minibatches, or raise --max-ops"),
    ("run", ("--run-dir", "{file}/sub"), "run_dir='{file}/sub': cannot be written: {file} is a file, not a folder"),
])
def test_run_and_validate_refuse_a_bad_timeout_or_run_folder_before_any_rank_starts(
        command: str, args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    """A zero timeout was a run failed at its first op (exit 1), NaN was taken, a run folder that
    is a file was a FileExistsError traceback (a weights folder, a run failed at its end), and
    10**12 minibatches a MemoryError traceback; the file is kept."""
    from pipesim.harness.config import ModelSpec
    from pipesim.spec.files import load_profile, save_model

    profile = tmp_path / "profile.json"
    save_model(load_profile(ROOT / "traces" / "vgg16.json").model_copy(
        update={"source": "pipesim.harness model=" + json.dumps(ModelSpec().to_dict())}), profile)
    (tmp_path / "file").write_text("keep")
    out = ("--out", str(tmp_path / "t.json")) if command == "run" else ()
    filled = [arg.format(file=tmp_path / "file") for arg in args]
    done = pipesim(command, "--profile", str(profile), "--schedule", "1f1b", "--stages", "2", "--microbatches", "2",
                   *filled, *out, timeout=60)
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: {message.format(file=tmp_path / 'file')}\n")
    assert (tmp_path / "file").read_text() == "keep" and not (tmp_path / "t.json").exists()


@torch_needed
def test_run_rejects_a_partition_that_does_not_tile_the_layers(profile_path: Path, tmp_path: Path) -> None:
    done = pipesim("run", "--profile", str(profile_path), "--schedule", "1f1b", "--stages", "2", "--microbatches",
                   "2", "--partition", "0:2,2:3", "--out", str(tmp_path / "t.json"))
    assert done.returncode == 2 and "partition" in done.stderr and done.stderr.count("\n") == 1


@torch_needed
def test_validate_reports_predicted_measured_and_versions(tmp_path: Path) -> None:
    done = pipesim("validate", "--model", "mlp", "--depth", "3", "--width", "16", "--microbatch-size", "4",
                   "--schedule", "1f1b,pipedream", "--stages", "2", "--microbatches", "2", "--minibatches", "3",
                   "--repeats", "1", "--profile-repeats", "3", "--json")
    assert done.returncode == 0, done.stderr
    reports = json.loads(done.stdout)
    assert [r["schedule"] for r in reports] == ["1f1b", "pipedream"]
    for report in reports:
        for key in ("schedule", "num_stages", "num_microbatches", "predicted", "measured", "iteration_time_error",
                    "versions_match"):
            assert key in report
        assert report["predicted"]["iteration_time_s"] > 0 and report["measured"]["iteration_time_s"] > 0
        assert report["versions_match"] is True and report["version_ops_compared"] > 0
        assert report["peak_memory_error"] == [0.0, 0.0]
        check_report_arithmetic(report)
        # By default the op times come from a separate calibration run; the layer profile's own
        # prediction is reported beside it, and the run's per-op wall and CPU times are kept.
        assert report["op_times"] == "calibration run"
        assert report["layer_profile"]["iteration_time_s_runs"][0] > 0
        times = report["op_times_runs"][0]
        assert set(times["measured"]) == set(times["predicted"]) == {"0F", "0B", "0U", "1F", "1B", "1U"}
        assert all(value > 0 for value in times["measured_cpu"].values())
        # The text report gives what docs/harness.md says it does: each rank's CPU share, and per stage
        # and kind the mean op time predicted and measured; one run has no noise floor.
        from pipesim.cli.validate import print_report

        with contextlib.redirect_stdout(io.StringIO()) as text:
            print_report(report)
        lines = text.getvalue()
        shares = ", ".join(f"{statistics.median(run[rank] for run in report['measured']['cpu_share_runs']):.2f}"
                           for rank in range(2))
        assert f"CPU share per rank (median over runs; below 1: the OS gave its core to others): {shares}" in lines
        assert f"0F {times['predicted']['0F'] * 1e3:.3f}/{times['measured']['0F'] * 1e3:.3f}" in lines
        assert "one run: no noise floor" in lines and "noise floor 0.0%" not in lines
        # The op breakdown: the same ops per stage and kind, their spans' parts, and the error as a sum.
        rows = report["op_breakdown_runs"][0]
        assert [(row["stage"], row["kind"]) for row in rows] == [(0, "F"), (0, "B"), (0, "U"), (1, "F"), (1, "B"),
                                                                 (1, "U")]
        for row in rows:
            assert row["measured_s"] == pytest.approx(times["measured"][f"{row['stage']}{row['kind']}"])
            assert row["receive_s"] + row["work_s"] + row["send_s"] == pytest.approx(row["measured_s"])
            assert min(row["receive_s"], row["work_s"], row["send_s"], row["wait_s"]) >= 0
        parts = report["error_contributions_runs"][0]
        assert sum(parts.values()) == pytest.approx(report["iteration_time_errors_runs"][0], abs=1e-9)
        # The calibration ran with the validated run's m=2 and K=3: two ops of each F and B per stage
        # in its one steady-state minibatch.
        calibration = report["calibration_breakdown_runs"][0]
        assert {row["count"] for row in calibration if row["kind"] in "FB"} == {2}


@torch_needed
def test_validate_with_the_layer_profile_alone_reports_no_calibration(tmp_path: Path) -> None:
    done = pipesim("validate", "--model", "mlp", "--depth", "3", "--width", "16", "--microbatch-size", "4",
                   "--schedule", "gpipe", "--stages", "2", "--microbatches", "2", "--minibatches", "3",
                   "--repeats", "1", "--profile-repeats", "3", "--op-times", "layers", "--json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)  # a list, one schedule or several
    assert report["op_times"] == "layer profile" and "layer_profile" not in report


@torch_needed
def test_validate_calibrates_several_stages_per_rank_on_as_many_processes() -> None:
    done = pipesim("validate", "--model", "mlp", "--depth", "3", "--width", "16", "--microbatch-size", "4",
                   "--schedule", "interleaved-1f1b", "--stages", "4", "--ranks", "2", "--microbatches", "4",
                   "--minibatches", "3", "--repeats", "1", "--profile-repeats", "3", "--calibration-microbatches", "2",
                   "--calibration-minibatches", "3", "--json")
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)
    assert report["op_times"] == "calibration run" and report["versions_match"] is True
    assert report["layer_profile"]["iteration_time_s_runs"][0] > 0


@torch_needed
def test_the_worker_runs_under_torchrun(tmp_path: Path) -> None:
    from pipesim.engine.trace import Trace
    from pipesim.harness.config import ModelSpec, RunConfig
    from pipesim.harness.launch import free_port

    trace_path = tmp_path / "trace.json"
    config = RunConfig(model=ModelSpec("mlp", depth=3, width=8), schedule="1f1b", num_stages=2, num_microbatches=2,
                       num_minibatches=2, microbatch_size=2, partition=((0, 2), (2, 4)), trace_out=str(trace_path))
    (tmp_path / "config.json").write_text(config.to_json())
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m",
                           "pipesim.harness.rank.worker", str(tmp_path / "config.json")], capture_output=True, text=True,
                          cwd=ROOT, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    trace = Trace.from_json(trace_path.read_text())
    assert sum(1 for span in trace.iter_spans() if span.stream == "compute") == 2 * (2 * 2 * 2 + 2)


@torch_needed
@pytest.mark.parametrize(("flag", "value"), [("--repeats", "0"), ("--repeats", "-3")])
def test_linkbench_refuses_no_repeats_before_any_rank_starts(flag: str, value: str, tmp_path: Path) -> None:
    """Zero repeats was numpy's warnings, LAPACK's lines and a LinAlgError traceback from the fit."""
    done = pipesim("linkbench", "--ranks", "2", flag, value, "--out", str(tmp_path / "t.json"))
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: repeats={value}: must be >= 1\n")
    assert not (tmp_path / "t.json").exists()


@torch_needed
@pytest.mark.parametrize(("args", "message"), [
    (("--ranks", "3"), "num_ranks=3: 1f1b runs one stage per rank; num_ranks must equal num_stages (2)"),
    (("--minibatches", "0"), "num_minibatches=0: must be an integer >= 1"),
])
def test_validate_refuses_a_schedule_it_cannot_form_before_measuring_anything(args: tuple[str, ...],
                                                                               message: str) -> None:
    """Checked after the profile and the link timing it was, in pydantic's words for fields the user
    never typed (``stages_per_rank=0: Input should be ...``)."""
    done = pipesim("validate", "--model", "mlp", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4",
                   "--repeats", "1", *args, timeout=60)
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: {message}\n")
