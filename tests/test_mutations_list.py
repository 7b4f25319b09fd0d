"""benchmarks/mutations.py follows the code it mutates: every mutation still applies, and the runner
(``make mutants``) refuses loudly, naming it, a mutation whose text has gone from its file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import mutants  # noqa: E402 - benchmarks/ is not a package
from mutations import MUTATIONS, Mutation  # noqa: E402


def test_every_mutation_still_applies_to_the_code_as_it_is() -> None:
    assert len(MUTATIONS) >= 25
    problems = mutants.stale(MUTATIONS)
    assert not problems, "update benchmarks/mutations.py:\n" + "\n".join(problems)


def test_a_mutation_whose_text_is_gone_is_named_and_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pipesim").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "pipesim" / "cost.py").write_text("def cost(x):\n    return 2 * x\n")
    (tmp_path / "tests" / "test_cost.py").write_text("")
    current = Mutation("pipesim/cost.py", "return 2 * x", "return 3 * x", "triples", ("tests/test_cost.py",))
    gone = Mutation("pipesim/cost.py", "return 4 * x", "return 5 * x", "quintuples", ("tests/test_cost.py",))
    twice = Mutation("pipesim/cost.py", "x", "y", "renames", ("tests/test_missing.py",))
    assert mutants.stale([current], tmp_path) == []
    problems = mutants.stale([current, gone, twice], tmp_path)
    assert problems[0] == ("mutation 2 (pipesim/cost.py: quintuples): its old text is found 0 times, expected "
                           "once: 'return 4 * x'")
    assert problems[1].startswith("mutation 3 (pipesim/cost.py: renames): its old text is found 2 times")
    assert problems[2] == "mutation 3 (pipesim/cost.py: renames): guard test tests/test_missing.py does not exist"
    # The runner stops before running anything, with status 2 and every stale mutation named.
    monkeypatch.setattr(mutants, "MUTATIONS", [current, gone])
    monkeypatch.setattr(mutants, "ROOT", tmp_path)
    assert mutants.main(["--check"]) == 2
    assert "mutation 2 (pipesim/cost.py: quintuples)" in capsys.readouterr().err
