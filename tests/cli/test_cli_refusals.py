"""simulate and schedule refuse bad options up front with one line and exit 2, naming the option;
a refused command changes nothing on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import VGG, pipesim
from test_cli_outputs import in_process

VGG_RUN = ("--profile", VGG, "--stages", "4", "--microbatches", "8", "--schedule", "1f1b")
UNIFORM = "layers=8,forward_ms=1,backward_ms=2,activation_bytes=1000,param_bytes=4000"
SPREAD = "must be finite, from 0 to 100 (a coefficient of variation)"
MODEL_ONLY = "applies to --model only (it builds the profile); --profile and --uniform give their own times"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--samples", "3", "--seed", "-1"), "seed=-1: must be an integer >= 0"),
        (("--jitter", "0.1", "--seed", "-1"), "seed=-1: must be an integer >= 0"),
        (("--jitter", "inf", "--engine", "des"), f"jitter=inf: {SPREAD}"),
        (("--jitter", "nan"), f"jitter=nan: {SPREAD}"),
        (("--jitter", "1e308", "--engine", "des"), f"jitter=1e+308: {SPREAD}"),
        (("--jitter", "-0.5"), f"jitter=-0.5: {SPREAD}"),
        (("--samples", "3", "--cv", "1e308"), f"cv=1e+308: {SPREAD}"),
        (("--samples", "3", "--cv", "inf", "--distribution", "lognormal"), f"cv=inf: {SPREAD}"),
        (("--seq-len", "7"), f"seq_len=7: {MODEL_ONLY}"),
        (("--efficiency", "0.3"), f"efficiency=0.3: {MODEL_ONLY}"),
        (("--calibrate", "measured.json"), f"calibrate='measured.json': {MODEL_ONLY}"),
        (("--sequence-parallel",), f"sequence_parallel=True: {MODEL_ONLY}"),
        (("--bandwidth", ""), "bandwidth='': must not be empty"),
        (("--latency", " "), "latency=' ': must not be empty"),
        (("--partition", ""), "partition='': must not be empty"),
        (("--topology", ""), "topology='': must not be empty"),
        (("--stages", "0"), "stages=0: must be >= 1"),
        (("--global-batch", "0"), "global_batch=0: must be >= 1"),
        (("--stages", "-1"), "stages=-1: must be >= 1"),
        (("--samples", "0"), "samples=0: must be an integer from 1 to 100,000"),
        (("--samples", str(10**12)), "samples=1000000000000: must be an integer from 1 to 100,000"),
        (("--cv", "0.1"), "cv=0.1: applies to --samples runs only; give --samples N"),
        (("--distribution", "lognormal"), "distribution='lognormal': applies to --samples runs only; give --samples N"),
        (("--fb-overlap", "0.5"), "fb_overlap=0.5: applies to dualpipev only, not 1f1b"),
        (("--fb-chunks", "torch"), "fb_chunks='torch': applies to dualpipev only, not 1f1b"),
        (("--zb-memory-limit", "3"), "zb_memory_limit=3.0: applies to zb-auto only, not 1f1b"),
        (("--pipemare-model", "paper"), "pipemare_model='paper': applies to pipemare only, not 1f1b"),
        (("--schedule", "1f1b,gpipe", "--pipemare-update", "microbatch"),
         "pipemare_update='microbatch': applies to pipemare only, not 1f1b, gpipe"),
        (("--recompute", "--recompute-stages", "none"),
         "recompute_stages='none': give either --recompute (full on every stage) or --recompute-stages, not both"),
        (("--speeds", "1,1,1,1_0"), "speeds='1_0': must be a comma-separated list of numbers"),
        (("--partition", "0:10,10:20,20:30,30:\u0664\u0661"),
         "partition='30:\u0664\u0661': each stage must be START:END layer indices, e.g. 0:4,4:8"),
        (("--latency", "1e308s"), "makespan_s=inf: overflows a float: the run's op times, latencies or transfers "
                                  "add up past 1.8e308 s; give smaller times or sizes, or faster speeds"),
        (("--optimizer-state", "1e308"), "peak_memory_bytes=inf: overflows a float: the run's byte counts add up "
                                          "past 1.8e308 B; give smaller sizes or a smaller optimizer-state multiplier"),
        (("--shared-nics",), "shared_nics=True: needs --bandwidth: links without one are free, so flows have no "
                             "bandwidth to share"),
        (("--stages", str(10**12)), "num_stages=1000000000000: must be <= the number of layers (41)"),
    ],
)
def test_simulate_refuses_bad_options(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    done = in_process("simulate", *VGG_RUN, *args, "--out", str(tmp_path / "out"))
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: {message}\n")
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


def test_a_makespan_past_the_trace_clock_is_refused_with_its_value(tmp_path: Path) -> None:
    # Two stages, one microbatch: the activation crosses the link once and its gradient once, each
    # after 1e300 s of latency; the op times (milliseconds) vanish beside them in a float sum.
    done = in_process("simulate", "--profile", VGG, "--stages", "2", "--microbatches", "1", "--schedule", "1f1b",
                      "--latency", "1e300s", "--out", str(tmp_path / "out"))
    makespan_s = 1e300 + 1e300
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: makespan_s={makespan_s!r}: must be at most "
                                                 "9.22e+12 s (292,000 years, what a trace's microsecond clock holds); "
                                                 "give smaller times or sizes, or faster speeds\n")
    assert list(tmp_path.iterdir()) == []


def test_overflowing_spread_is_named_without_runtime_warnings() -> None:
    done = pipesim("simulate", *VGG_RUN, "--samples", "3", "--cv", "1e308", "--distribution", "gamma")
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: cv=1e+308: {SPREAD}\n")


@pytest.mark.parametrize(
    ("uniform", "message"),
    [
        ("layers=8,forward_ms=1,backward_ms=2,forward_ms=5",
         "uniform='layers=8,forward_ms=1,backward_ms=2,forward_ms=5': forward_ms is given twice"),
        ("layers=\u0668,forward_ms=1,backward_ms=2", "uniform.layers='\u0668': must be a number"),
        ("layers=8,forward_ms=1_0,backward_ms=2", "uniform.forward_ms='1_0': must be a number"),
        ("layers=100000001,forward_ms=1,backward_ms=2",
         "uniform.layers='100000001': must be an integer from 1 to 100,000"),
        ("layers=0,forward_ms=1,backward_ms=2", "uniform.layers='0': must be an integer from 1 to 100,000"),
        ("layers=8,forward_ms=-1,backward_ms=2", "uniform.forward_ms='-1': must be >= 0"),
        ("layers=8,forward_ms=1,backward_ms=2,activation_bytes=-0.5", "uniform.activation_bytes='-0.5': must be >= 0"),
        ("layers=8,forward_ms=1,backward_ms=2,param_bytes=-1", "uniform.param_bytes='-1': must be >= 0"),
    ],
)
def test_uniform_profiles_are_bounded_and_keys_given_once(uniform: str, message: str) -> None:
    done = in_process("simulate", "--uniform", uniform, "--stages", "2", "--microbatches", "4", "--schedule", "gpipe")
    assert (done.returncode, done.stderr) == (2, f"pipesim: error: {message}\n")


def test_a_plan_without_a_partition_balances_compute_and_prints_it(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "pipesim.plan/1", "schedule": "1f1b", "num_stages": 2,
                                "num_microbatches": 4}))
    args = ("simulate", "--uniform", UNIFORM, "--plan", str(plan))
    table = in_process(*args)
    assert table.returncode == 0, table.stderr
    assert [line.split()[4] for line in table.stdout.splitlines() if line.split()[:2] in (["0", "│"], ["1", "│"])
            and line.count("│") > 8] == ["0:4", "4:8"]
    assert json.loads(in_process(*args, "--json").stdout)["partition"] == [[0, 4], [4, 8]]


def test_a_plan_with_more_stages_than_layers_is_refused_before_its_devices_are_built(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "pipesim.plan/1", "schedule": "1f1b", "num_stages": 10**12,
                                "num_microbatches": 4}))
    done = in_process("simulate", "--uniform", UNIFORM, "--plan", str(plan))
    assert (done.returncode, done.stderr) == (
        2, f"pipesim: error: {plan}: num_stages=1000000000000: must be <= the number of layers (8)\n")


@pytest.mark.parametrize("args", [("--stages", "4"), ("--stages-per-rank", "2"), ("--minibatches", "3")])
def test_a_schedule_csv_refuses_the_counts_it_sets(args: tuple[str, ...], tmp_path: Path) -> None:
    schedule = tmp_path / "s.csv"
    schedule.write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    done = in_process("simulate", "--uniform", UNIFORM, "--schedule-csv", str(schedule), *args)
    assert (done.returncode, done.stderr) == (
        2, f"pipesim: error: schedule_csv={str(schedule)!r}: sets the stages, ranks and minibatches; drop "
           "--stages/--ranks/--stages-per-rank/--minibatches\n")


def test_schedule_refuses_runs_over_max_ops() -> None:
    done = in_process("schedule", "--schedule", "gpipe", "--stages", "8", "--microbatches", "16",
                      "--minibatches", "100000000")
    assert done.returncode == 2 and done.stderr.startswith(
        "pipesim: error: num_ops=26400000000: the run would need about ") and done.stderr.count("\n") == 1
    assert "more than the limit of 8,800,000 ops allows" in done.stderr
    small = ("schedule", "--schedule", "gpipe", "--stages", "2", "--microbatches", "2")
    assert in_process(*small, "--max-ops", "10").returncode == 0
    over = in_process(*small, "--max-ops", "9")
    assert over.returncode == 2 and over.stderr.startswith("pipesim: error: num_ops=10: ")


def test_simulate_checks_every_output_file_before_writing_any(tmp_path: Path) -> None:
    out = tmp_path / "o2"
    args = ("simulate", "--uniform", UNIFORM, "--stages", "2", "--microbatches", "4", "--out", str(out))
    assert in_process(*args, "--schedule", "gpipe").returncode == 0
    (out / "trace.perfetto.json").unlink()
    (out / "trace.perfetto.json" / "x").mkdir(parents=True)
    before = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
    done = in_process(*args, "--schedule", "1f1b")
    assert (done.returncode, done.stderr) == (
        2, f"pipesim: error: out='{out}': cannot write trace.perfetto.json: it is a folder\n")
    assert {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()} == before
    compared = tmp_path / "o3"
    compared.mkdir()
    (compared / "1f1b").write_text("keep")
    done = in_process(*args[:-1], str(compared), "--schedule", "gpipe,1f1b")
    assert (done.returncode, done.stderr) == (
        2, f"pipesim: error: out='{compared}': cannot write 1f1b/metrics.json: 1f1b is a file, not a folder\n")
    assert sorted(path.name for path in compared.iterdir()) == ["1f1b"]


@pytest.mark.parametrize("args", [
    ("simulate", "--model", "llama3-8b", "--stages", "2", "--microbatches", "2", "--schedule", "1f1b", "--memory", ""),
    ("plan", "--profile", VGG, "--devices", "4", "--memory", ""),
    ("search", "--model", "llama3-8b", "--gpus", "8", "--memory", ""),
    ("report", VGG, "--memory", "", "--out", "r.html"),
])
def test_an_empty_memory_budget_is_refused_by_every_command(args: tuple[str, ...]) -> None:
    done = in_process(*args)
    assert (done.returncode, done.stderr) == (2, "pipesim: error: memory='': must not be empty\n")


def test_run_refuses_an_empty_partition() -> None:
    done = in_process("run", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--partition", "",
                      "--out", "x.json")
    assert (done.returncode, done.stderr) == (2, "pipesim: error: partition='': must not be empty\n")


def test_samples_without_a_spread_to_draw_from_say_so() -> None:
    """The shipped profiles measured no spread: every sample would be the deterministic run."""
    plain = in_process("simulate", *VGG_RUN, "--samples", "3")
    assert plain.returncode == 0
    assert "profile 'vgg16' has no measured spread" in plain.stderr and "give --cv" in plain.stderr
    drawn = in_process("simulate", *VGG_RUN, "--samples", "3", "--cv", "0.1")
    assert drawn.returncode == 0 and "spread" not in drawn.stderr
