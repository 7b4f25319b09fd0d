"""Mutation benchmark (``make mutants``): does the suite catch a wrong headline number?

Each mutation in ``mutations.MUTATIONS`` (a file, an exact text, its replacement, what it breaks, and
the test files that guard that code) is applied to a fresh temporary copy of the tree (never to the
working tree); the non-slow tests of its guard files run against the copy with ``-x``; pytest
failing a test counts as caught, the tests passing as missed. The table goes to its section of
benchmarks/RESULTS.md. Exit status: 0 when every mutation is caught, 1 when one is missed or a run
went wrong, 2 when a mutation no longer applies (its text is gone from its file, or is there twice):
the list must follow the code it mutates.

    python benchmarks/mutants.py            # every mutation, then RESULTS.md
    python benchmarks/mutants.py --check    # only check that every mutation still applies
    python benchmarks/mutants.py --only 3,7 --no-write
    python benchmarks/mutants.py --full     # the whole non-slow suite against each (hours)
    python benchmarks/mutants.py --only 52 --tests tests/harness/test_harness_emulated.py --no-write

The guard files run once on the unmutated copy first (they must pass); a mutation marked
``refresh_golden`` regenerates the golden wavefront files from the broken code before its tests.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutations import MUTATIONS, Mutation  # noqa: E402 - the list sits beside this script
from results_file import machine, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PER_MUTATION_TIMEOUT_S = 900


@dataclass(frozen=True)
class Outcome:
    """What one mutation's run gave: ``caught`` (a test failed), ``missed`` (all passed) or
    ``error`` (pytest could not run the tests, or ran out of time)."""

    number: int
    mutation: Mutation
    verdict: str
    seconds: float
    detail: str


def stale(mutations: list[Mutation], root: Path = ROOT) -> list[str]:
    """One line per mutation that no longer applies to the tree at ``root``: its file is gone, its
    text is not found exactly once, or it changes nothing. Empty when the list is current."""
    problems = []
    for number, mutation in enumerate(mutations, 1):
        path = root / mutation.file
        where = f"mutation {number} ({mutation.file}: {mutation.breaks})"
        if not path.is_file():
            problems.append(f"{where}: the file is gone")
            continue
        found = path.read_text(encoding="utf-8").count(mutation.old)
        if found != 1:
            problems.append(f"{where}: its old text is found {found} times, expected once: {mutation.old!r}")
        if mutation.old == mutation.new:
            problems.append(f"{where}: the new text equals the old")
        for test in mutation.tests:
            if not (root / test.split("::")[0]).exists():
                problems.append(f"{where}: guard test {test} does not exist")
    return problems


def tree_files(root: Path) -> list[str]:
    """The files of the working tree as git sees them: tracked and untracked, less what it ignores."""
    done = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                          capture_output=True, check=True)
    return [name for name in done.stdout.decode().split("\0") if name and (root / name).is_file()]


def copy_tree(root: Path, into: Path) -> Path:
    """A copy of the working tree's files under ``into/tree``, beside a link to the shared inputs the
    tests read from the tree's parent folder (``../shared``)."""
    tree = into / "tree"
    for name in tree_files(root):
        target = tree / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    shared = root.parent / "shared"
    if shared.exists():
        (into / "shared").symlink_to(shared)
    return tree


def apply(mutation: Mutation, tree: Path) -> None:
    """Write the mutation into the copy at ``tree`` and check that the result still compiles."""
    path = tree / mutation.file
    text = path.read_text(encoding="utf-8")
    assert text.count(mutation.old) == 1, f"{mutation.file}: {mutation.old!r} is not there once"
    path.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")
    if path.suffix == ".py":
        compile(path.read_text(encoding="utf-8"), str(path), "exec")  # a SyntaxError here is the list's fault


def environment(tree: Path) -> dict[str, str]:
    """The test processes' environment: the copy's pipesim first on the path (ahead of the
    editable install, which points at the working tree), for subprocesses too."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.pop("PIPESIM_REGEN_GOLDEN", None)
    return env


def imported_from(tree: Path) -> str:
    """Where ``import pipesim`` resolves in the copy's environment (it must be the copy)."""
    done = subprocess.run([sys.executable, "-c", "import pipesim; print(pipesim.__file__)"], cwd=tree,
                          env=environment(tree), capture_output=True, text=True, check=True)
    return done.stdout.strip()


def pytest_command(tests: tuple[str, ...]) -> list[str]:
    """pytest on ``tests``, stopping at the first failure, as ``make test`` runs it otherwise: the
    ``mutants`` hypothesis profile tries ci's examples and reports a failure without shrinking it."""
    return [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow",
            "--hypothesis-profile=mutants", *tests]


def baseline(tree: Path, tests: tuple[str, ...]) -> tuple[float, str]:
    """Run ``tests`` on the unmutated copy at ``tree``: they must pass, or every mutation would look
    caught. The run also leaves the compiled files (Python's and numba's) in the copy, which each
    mutation's copy then reuses for the files it leaves alone. Returns its seconds and "" or what failed."""
    started = time.perf_counter()
    done = subprocess.run(pytest_command(tests), cwd=tree, env=environment(tree), capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode == 0:
        print(f"mutants: {len(tests)} guard test files pass on the unmutated tree in {seconds:.0f} s", flush=True)
        return seconds, ""
    return seconds, " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])


def run_one(number: int, mutation: Mutation, snapshot: Path, full: bool, tests: tuple[str, ...] = ()) -> Outcome:
    """Apply ``mutation`` to a fresh copy of ``snapshot`` (the tree as the run began) and run its
    guard tests (all, with ``full``; ``tests`` in their place when given)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pipesim-mutant-") as folder:
        tree = Path(folder) / "tree"
        shutil.copytree(snapshot / "tree", tree, symlinks=True)
        if (snapshot / "shared").exists():
            (Path(folder) / "shared").symlink_to((snapshot / "shared").resolve())
        resolved = imported_from(tree)
        if not resolved.startswith(str(tree)):
            return Outcome(number, mutation, "error", 0.0, f"pipesim imports from {resolved}, not the copy")
        apply(mutation, tree)
        if mutation.refresh_golden:
            refresh = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                      "tests/schedule/test_golden_wavefronts.py", "-k",
                                      "test_wavefront_matches_the_golden_table"], cwd=tree,
                                     env={**environment(tree), "PIPESIM_REGEN_GOLDEN": "1"}, capture_output=True,
                                     text=True, timeout=PER_MUTATION_TIMEOUT_S)
            if refresh.returncode != 0:
                return Outcome(number, mutation, "error", time.perf_counter() - started,
                               "the golden refresh failed: " + refresh.stdout.strip().splitlines()[-1])
        command = pytest_command(("tests",) if full else tests or mutation.tests)
        try:
            done = subprocess.run(command, cwd=tree, env=environment(tree), capture_output=True, text=True,
                                  timeout=PER_MUTATION_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Outcome(number, mutation, "error", time.perf_counter() - started,
                           f"no verdict in {PER_MUTATION_TIMEOUT_S} s")
    seconds = time.perf_counter() - started
    output = done.stdout + done.stderr
    if done.returncode == 1:
        failed = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
        return Outcome(number, mutation, "caught", seconds, failed.group(1) if failed else "a test failed")
    if done.returncode == 0:
        return Outcome(number, mutation, "missed", seconds, "every guard test passed")
    tail = " | ".join(output.strip().splitlines()[-3:])
    return Outcome(number, mutation, "error", seconds, f"pytest exit {done.returncode}: {tail}")


def table(outcomes: list[Outcome]) -> str:
    """The results as a Markdown table, one row per mutation."""
    rows = ["| # | file | what it breaks | verdict | seconds | first failing test |", "|---|---|---|---|---:|---|"]
    for outcome in outcomes:
        m = outcome.mutation
        rows.append(f"| {outcome.number} | `{m.file}` | {m.breaks} | {outcome.verdict} | {outcome.seconds:.0f} | "
                    f"`{outcome.detail}` |" if outcome.verdict == "caught" else
                    f"| {outcome.number} | `{m.file}` | {m.breaks} | **{outcome.verdict}** | {outcome.seconds:.0f} | "
                    f"{outcome.detail} |")
    return "\n".join(rows)


def section(outcomes: list[Outcome], total_s: float, baseline_s: float, load: tuple[float, float, float],
            full: bool) -> str:
    """The RESULTS.md section of a whole run."""
    caught = sum(o.verdict == "caught" for o in outcomes)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    suite = "the whole non-slow suite" if full else \
        "its guard test files (`benchmarks/mutations.py`, `benchmarks/mutations_cost_model.py`)"
    return f"""## Mutation benchmark (`make mutants`, issue 38)

{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, {machine()}; load average at
start {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} (a machine shared with other engineers' test runs: the seconds
below are inflated by their load and vary between runs).

Each mutation is a plausible slip in the code behind a headline number (timing kernel, memory events,
each metric, versions and staleness, capacity tokens/s, MFU and the memory verdict, the op cost model's
device curves, op FLOPs and bytes and collectives, Adam's bytes, ZeRO, context and expert parallelism,
the planners' cost, validate's error and noise floor, readers and refusals), applied to a
fresh copy of the tree, never to the working tree; then {suite} run against the copy with
`pytest -x -m "not slow"`. Caught: a test failed. The three schedule mutations marked "golden files
refreshed" first regenerate tests/golden/wavefronts/ from the broken code, as a careless
`PIPESIM_REGEN_GOLDEN=1` would, so that the golden test itself passes.

Why guard files and not the whole suite: with `-x` a caught mutation stops at its first failing test,
but the suite runs its files in alphabetical order, so a mutation of validate's comparison would first
sit through every CLI test, and a missed one through all of it: the suite takes about 6 minutes on a
quiet machine and 19 at this machine's usual load, so {len(outcomes)} mutations of it would take hours.
Each mutation's guards are the test files of the module it mutates and of the outputs that read it,
closest first; `python benchmarks/mutants.py --full` runs the whole suite instead. Before the mutations,
the union of the guard files runs once on the unmutated copy ({baseline_s:.0f} s here): it must pass, or
a "caught" would mean nothing, and it leaves compiled files (Python's, numba's) that each copy reuses for
the files its mutation leaves alone. Hypothesis runs the ci profile's examples without shrinking a
failure (the `mutants` profile in tests/conftest.py: whether a test fails is all that counts here).

**{caught} of {len(outcomes)} caught** in {total_s / 60:.1f} minutes, the baseline included.

{table(outcomes)}
"""


def stop(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: subprocess.run then kills the running pytest and the copies are removed."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that every mutation still applies")
    parser.add_argument("--only", default="", help="comma-separated mutation numbers (1-based) to run")
    parser.add_argument("--full", action="store_true", help="run the whole non-slow suite against each mutation")
    parser.add_argument("--tests", default="", help="comma-separated test paths to run in place of the guards "
                        "(to see whether one test catches a mutation)")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave RESULTS.md alone")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the run of the guard tests on the unmutated tree")
    args = parser.parse_args(argv)
    problems = stale(MUTATIONS, ROOT)
    if problems:
        print(f"mutants: {len(problems)} mutation(s) no longer apply; update benchmarks/mutations.py to the code "
              "as it is now (same kind of change, same guarded number):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    if args.check:
        print(f"mutants: all {len(MUTATIONS)} mutations apply")
        return 0
    chosen = [int(n) for n in args.only.split(",") if n.strip()] or list(range(1, len(MUTATIONS) + 1))
    tests = tuple(test for test in args.tests.split(",") if test.strip())
    signal.signal(signal.SIGTERM, stop)  # unwind (and end the running pytest) on kill, as on Ctrl-C
    load = os.getloadavg()
    started = time.perf_counter()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="pipesim-mutants-") as folder:
        snapshot = Path(folder)
        copy_tree(ROOT, snapshot)
        baseline_s = 0.0
        if not args.no_baseline:
            guards = tests or tuple(dict.fromkeys(test for n in chosen for test in MUTATIONS[n - 1].tests))
            baseline_s, failed = baseline(snapshot / "tree", ("tests",) if args.full else guards)
            if failed:
                print(f"mutants: the guard tests fail on the tree as it is, so no verdict would mean anything: "
                      f"{failed}", file=sys.stderr)
                return 1
        for number in chosen:
            outcome = run_one(number, MUTATIONS[number - 1], snapshot, args.full, tests)
            outcomes.append(outcome)
            print(f"{outcome.verdict:6} {number:3} {outcome.seconds:6.0f} s  {outcome.mutation.file}: "
                  f"{outcome.mutation.breaks}  [{outcome.detail}]", flush=True)
    total_s = time.perf_counter() - started
    caught = sum(o.verdict == "caught" for o in outcomes)
    print(f"mutants: {caught} of {len(outcomes)} caught in {total_s / 60:.1f} min")
    if not args.no_write and not args.tests and len(outcomes) == len(MUTATIONS):
        write_section("mutants", section(outcomes, total_s, baseline_s, load, args.full))
    return 0 if caught == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
