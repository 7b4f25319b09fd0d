"""Inputs that would cost without bound: alias bombs, endless files, over-long integers, overflowing units.

Each is refused before any work with one line and exit 2 (issue 37, items 7, 8, 10, 12 and 14);
the commands run through the real entry point, bounded by a timeout and an address-space limit so
that a regression fails here instead of exhausting the shared machine.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from pipesim.errors import ConfigError
from pipesim.spec.files import MAX_INPUT_BYTES

ROOT = Path(__file__).resolve().parents[2]
UNIFORM = "layers=4,forward_ms=1,backward_ms=2,activation_bytes=1000,param_bytes=4000"
SPEC_HEAD = ("profile: {uniform: {layers: 4, forward_ms: 1.0, backward_ms: 2.0, activation_bytes: 1000, "
             "param_bytes: 4000}}\nschedule: [gpipe]\n")
HUGE = "1" * 5000  # past Python's 4,300-digit limit of int()


def _limited() -> None:
    """The child's address space capped at 2 GiB: an unbounded expansion fails fast, not the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def pipesim(*args: str, stdin: object = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipesim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout_s, stdin=stdin, preexec_fn=_limited)  # type: ignore[arg-type]


def one_line(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("pipesim: error: "), done.stderr[-2000:]
    for text in expected:
        assert text in done.stderr, done.stderr


def alias_bomb(levels: int) -> str:
    """A spec of about 600 bytes whose ``stages`` list expands to 9**levels items."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\n{SPEC_HEAD}stages: *a{levels - 1}\nmicrobatches: [4]\n"


def test_a_yaml_alias_bomb_is_refused_before_any_work(tmp_path: Path) -> None:
    spec = tmp_path / "bomb.yaml"
    spec.write_text(alias_bomb(10))
    assert spec.stat().st_size < 1000
    done = pipesim("sweep", str(spec), "--out", str(tmp_path / "t.csv"), timeout_s=60)
    one_line(done, "bomb.yaml: spec=", "expands to more than 1,000,000 items through its YAML aliases")
    assert not (tmp_path / "t.csv").exists() and not (tmp_path / "t.csv.parts").exists()


@pytest.mark.parametrize(("name", "rule"), [("missing.yaml", "file does not exist"),
                                           (".", "is a directory, expected a file")])
def test_a_spec_that_is_not_a_file_is_one_line(tmp_path: Path, name: str, rule: str) -> None:
    spec = tmp_path / name
    one_line(pipesim("sweep", str(spec), "--out", str(tmp_path / "t.csv"), timeout_s=60), f"spec='{spec}': {rule}")
    assert not (tmp_path / "t.csv").exists()


@pytest.mark.parametrize(("text", "rule"), [
    ("a: &a [1, *a]\n" + SPEC_HEAD + "stages: *a\nmicrobatches: [4]\n", "holds itself through a YAML alias"),
    ("schedule: " + "[" * 3000 + "]" * 3000 + "\n", "is nested too deeply"),
])
def test_a_spec_that_holds_itself_or_nests_past_the_parser_is_one_line(tmp_path: Path, text: str, rule: str) -> None:
    spec = tmp_path / "odd.yaml"
    spec.write_text(text)
    one_line(pipesim("sweep", str(spec), "--out", str(tmp_path / "t.csv"), timeout_s=60), rule)


BOUNDED_REPR = """
from pipesim.errors import ConfigError
value = ["x"] * 9
for _ in range(12):
    value = [value] * 9
print(ConfigError("stages", value, "must be a list of integers"))
"""


def test_an_error_shows_a_bounded_repr_of_a_huge_shared_value() -> None:
    """The value of 9**13 items (shared, as YAML aliases make it) is shown cut at 80 characters
    (in a child process with bounded memory: its whole repr would take terabytes)."""
    done = subprocess.run([sys.executable, "-c", BOUNDED_REPR], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          preexec_fn=_limited)
    assert done.returncode == 0, done.stderr[-2000:]
    message = done.stdout.strip()
    assert message.startswith("stages=[[[[[[[[[[[[['x', 'x'") and message.endswith("...: must be a list of integers")
    assert len(message) < 200
    # Small values read exactly as repr() shows them.
    for small in ([1, (2,)], {"a": {1, 2}}, frozenset({3}), "it's", 10**100, None, 1.5):
        shown = repr(small)
        assert str(ConfigError("f", small, "r")) == f"f={shown if len(shown) <= 80 else shown[:77] + '...'}: r"
    assert str(ConfigError("f", [10**5000], "r")) == "f=[<an integer of 16,610 bits>]: r"


def _profile_with(value: str) -> str:
    return ('{"schema": "pipesim.profile/1", "layers": [{"name": "a", "forward_s": %s, "backward_s": 1, '
            '"activation_bytes": 1, "param_bytes": 1}]}' % value)


@pytest.mark.parametrize("kind", ["profile", "topology", "plan", "trace", "schedule_csv", "sweep_spec"])
def test_an_integer_past_pythons_digit_limit_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    if kind == "profile":
        (tmp_path / "p.json").write_text(_profile_with(HUGE))
        args = ["simulate", "--profile", str(tmp_path / "p.json"), "--stages", "1", "--microbatches", "1",
                "--schedule", "gpipe"]
    elif kind == "topology":
        (tmp_path / "t.json").write_text(json.dumps({"schema": "pipesim.topology/1", "devices": [
            {"name": "a", "memory_bytes": 1}]}).replace('"memory_bytes": 1', f'"memory_bytes": {HUGE}'))
        args = ["simulate", "--uniform", UNIFORM, "--stages", "1", "--microbatches", "1", "--schedule", "gpipe",
                "--topology", str(tmp_path / "t.json")]
    elif kind == "plan":
        (tmp_path / "plan.json").write_text('{"schema": "pipesim.plan/1", "schedule": "gpipe", "num_stages": %s}'
                                            % HUGE)
        args = ["simulate", "--uniform", UNIFORM, "--plan", str(tmp_path / "plan.json")]
    elif kind == "trace":
        made = pipesim("simulate", "--uniform", UNIFORM, "--stages", "2", "--microbatches", "2", "--schedule",
                       "gpipe", "--out", str(tmp_path / "run"))
        assert made.returncode == 0, made.stderr
        text = (tmp_path / "run" / "trace.json").read_text()
        (tmp_path / "trace.json").write_text(text.replace('"num_microbatches":2', f'"num_microbatches":{HUGE}'))
        args = ["plot", "timeline", str(tmp_path / "trace.json"), "--out", str(tmp_path / "t.png")]
    elif kind == "schedule_csv":
        (tmp_path / "s.csv").write_text(f"0F{HUGE},0B0\n")
        args = ["check", str(tmp_path / "s.csv")]
    else:
        (tmp_path / "s.yaml").write_text(f"{SPEC_HEAD}stages: [{HUGE}]\nmicrobatches: [4]\n")
        args = ["sweep", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "t.csv")]
    done = pipesim(*args)
    one_line(done, "digits" if kind != "schedule_csv" else "column 1=")
    assert "Traceback" not in done.stderr


def test_a_profile_or_spec_naming_dev_zero_is_refused_at_the_read_limit(tmp_path: Path) -> None:
    limit = f"holds more than {MAX_INPUT_BYTES:,} bytes, the most pipesim reads from one file"
    one_line(pipesim("simulate", "--profile", "/dev/zero", "--stages", "1", "--microbatches", "1", "--schedule",
                     "gpipe", timeout_s=60), "profile='/dev/zero'", limit)
    spec = tmp_path / "zero.yaml"
    spec.write_text("profile: [/dev/zero]\nschedule: [gpipe]\nstages: [1]\nmicrobatches: [1]\n")
    one_line(pipesim("sweep", str(spec), "--out", str(tmp_path / "t.csv"), timeout_s=60), limit)


def test_check_on_endless_standard_input_is_refused_at_the_read_limit() -> None:
    with open("/dev/zero", "rb") as endless:
        done = pipesim("check", "-", stdin=endless, timeout_s=60)
    one_line(done, "schedule='<stdin>': holds more than")


@pytest.mark.parametrize(("option", "value"), [("--bandwidth", "1e400GB/s"), ("--memory", "1e400GB"),
                                               ("--bandwidth", "2e300TB/s")])
def test_a_quantity_that_overflows_is_refused_not_read_as_unlimited(option: str, value: str) -> None:
    done = pipesim("simulate", "--uniform", UNIFORM, "--stages", "2", "--microbatches", "2", "--schedule", "gpipe",
                   option, value, "--json")
    one_line(done, f"{option[2:]}='{value}': is too large: must be below")


@pytest.mark.parametrize("line", ['bandwidth: ["1e400GB/s"]', 'memory_limit: ["1e400GB"]'])
def test_a_sweep_quantity_that_overflows_is_refused_not_stored_as_inf(tmp_path: Path, line: str) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(f"{SPEC_HEAD}stages: [2]\nmicrobatches: [4]\n{line}\n")
    one_line(pipesim("sweep", str(spec), "--out", str(tmp_path / "t.csv")), f"{line.split(':')[0]}[0]=")
    assert not (tmp_path / "t.csv").exists()


def test_a_schedule_csv_with_a_byte_order_mark_reads_as_without(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" starts the file with U+FEFF."""
    plain = pipesim("schedule", "--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--format", "csv")
    assert plain.returncode == 0
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + plain.stdout.encode())
    checked = pipesim("check", str(tmp_path / "bom.csv"))
    assert checked.returncode == 0 and "bom.csv: valid (2 ranks, 2 stages, 2 microbatches" in checked.stdout, \
        checked.stderr
    run = pipesim("simulate", "--uniform", UNIFORM, "--microbatches", "2", "--schedule-csv", str(tmp_path / "bom.csv"),
                  "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["num_ops"] == 8
