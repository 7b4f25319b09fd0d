"""The README and docs/ (issue 36 item 13): a short README that links reference pages, and every
command they show accepted by the command line, the README's own ones run.

The rules the tests hold:

- README.md has fewer than 250 lines, and every page of docs/ is reached from it by links.
- Every relative Markdown link in README.md and docs/*.md names a file of the repository, with no
  ``#anchor`` (headings move between pages; a file is what a link can be held to).
- Commands: in a fenced code block other than ``python`` and ``yaml``, a line that starts with
  ``pipesim `` (or ``$ pipesim ``) starts a command; the indented lines under it, and lines after a trailing backslash,
  continue it; a ``  # comment`` tail is dropped, and so is what a `` | `` pipes into (a second
  ``pipesim`` there is a command of its own). A command whose text holds ``[``, ``(``, ``|`` or
  ``...`` is a *synopsis*: its subcommand (each name of ``timeline|memory`` for a group's) must exist
  and each ``--flag`` in it must be an option of that command. Any other command is a *command
  line*: split as a shell splits it and parsed, without running, by the subcommand's own click
  parser, so an unknown option, an option without its value or an extra argument fails. Words in
  capitals (``FILE``, ``DIR/plan.json``) are placeholders: parsed as values, never run.
- The README's command lines run, in order, in a temporary folder that holds the repository's
  ``traces/``, and exit 0 (through the CLI's entry point, in this process); the README may hold no placeholder outside a synopsis. Left out, and only
  parsed: the torch harness's commands (``NOT_RUN``: each is real training runs of tens of seconds,
  which tests/harness/ runs).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from pipesim.cli import cli
from pipesim.cli.device import DeviceGroup
from cli_runner import in_process

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = {"profile", "linkbench", "run", "validate"}
SYNOPSIS = re.compile(r"[\[(|]|\.\.\.")
PLACEHOLDER = re.compile(r"\b[A-Z]{2,}\b")


def code_blocks(text: str) -> Iterator[list[str]]:
    """The lines of each fenced block whose language is not python or yaml."""
    for match in re.finditer(r"^```([a-z]*)\n(.*?)^```", text, flags=re.M | re.S):
        if match.group(1) not in ("python", "yaml"):
            yield match.group(2).splitlines()


def commands(text: str) -> list[str]:
    """Each ``pipesim ...`` command of the page's code blocks, continuation lines joined."""
    found: list[str] = []
    for lines in code_blocks(text):
        current: list[str] | None = None
        for line in lines:
            line = re.sub(r"\s+#\s.*$", "", re.sub(r"^\$ ", "", line)).rstrip()
            continues = current is not None and (current[-1].endswith("\\") or line[:1].isspace())
            if continues and current is not None and line.strip():
                current[-1] = current[-1].rstrip("\\")
                current.append(line.strip())
                continue
            if current is not None:
                found.append(" ".join(current))
                current = None
            if line.startswith("pipesim "):
                current = [line]
        if current is not None:
            found.append(" ".join(current))
    pieces: list[str] = []
    for command in found:  # `pipesim schedule ... | pipesim check -`: both are commands
        pieces += [part.strip() for part in re.split(r" \| (?=[a-z])", command) if part.strip().startswith("pipesim ")]
    return [" ".join(piece.split()) for piece in pieces]


def synopsis_targets(words: list[str]) -> list[click.Command]:
    """The command(s) a synopsis names: the subcommand, and each of ``a|b`` where it is a group."""
    context = click.Context(cli, info_name="pipesim")
    command = cli.get_command(context, words[1])
    assert command is not None, f"no subcommand {words[1]!r}"
    if not isinstance(command, click.Group) or len(words) < 3 or words[2].startswith(("-", "[", "(")):
        return [command]
    names = words[2].split("|")
    if isinstance(command, DeviceGroup) and names[0] not in command.commands:
        return [command, command.commands["show"]]  # `pipesim device NAME`
    targets = [command.commands.get(name) for name in names]
    assert all(targets), f"{words[1]} has no subcommand among {names}"
    return [command, *(target for target in targets if target is not None)]


def option_names(command: click.Command) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)
            if name.startswith("-")}


def check_synopsis(line: str) -> None:
    words = line.split()
    targets = synopsis_targets(words)
    known = set().union(*(option_names(target) for target in targets))
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line))
    assert flags <= known, f"{line!r}: not options of pipesim {words[1]}: {sorted(flags - known)}"


def parse(line: str) -> None:
    """Parse a command line with the real parsers of ``pipesim`` and its (sub)commands, running nothing."""
    args = shlex.split(line)[1:]
    command: click.Command = cli
    context = click.Context(cli, info_name="pipesim")
    while True:
        options, rest, _ = command.make_parser(context).parse_args(list(args))
        if not isinstance(command, click.Group):
            assert not rest, f"{line!r}: unexpected arguments {rest}"
            return
        if not rest:
            assert command is not cli, f"{line!r}: no subcommand"
            return
        name, args = rest[0], rest[1:]
        sub = command.get_command(context, name)
        if sub is None and isinstance(command, DeviceGroup):  # `pipesim device h100` shows a device
            sub, args = command.commands["show"], rest
        assert sub is not None, f"{line!r}: no subcommand {name!r}"
        command, context = sub, click.Context(sub, info_name=name, parent=context)


def all_commands() -> list[tuple[str, str]]:
    return [(page.relative_to(ROOT).as_posix(), line)
            for page in PAGES for line in commands(page.read_text(encoding="utf-8"))]


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < 250, f"README.md has {lines} lines"


def test_every_relative_link_names_a_file() -> None:
    checked = 0
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            assert "#" not in target, f"{page.name}: link {target!r} has an anchor"
            assert (page.parent / target).resolve().is_file(), f"{page.name}: link {target!r} names no file"
            checked += 1
    assert checked >= 10  # the README links a page per command family


def test_every_docs_page_is_reached_from_the_readme() -> None:
    """Through links: the README's, then the pages' own (a page may hang under another)."""
    reached, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        for target in re.findall(r"\]\(([^)#\s]+\.md)\)", page.read_text(encoding="utf-8")):
            found = (page.parent / target).resolve()
            if found.is_file() and found not in reached:
                reached.add(found)
                todo.append(found)
    assert {page.resolve() for page in (ROOT / "docs").glob("*.md")} <= reached


def test_the_command_finder_reads_synopses_continuations_and_pipes() -> None:
    text = ("```\npipesim simulate --profile traces/vgg16.json \\\n    --stages 4   # a comment\n"
            "pipesim plot timeline|memory TRACE --out F\n"
            "pipesim schedule --stages 2 | pipesim check -\n```\n```python\npipesim simulate --no\n```\n")
    assert commands(text) == ["pipesim simulate --profile traces/vgg16.json --stages 4",
                              "pipesim plot timeline|memory TRACE --out F", "pipesim schedule --stages 2",
                              "pipesim check -"]


@pytest.mark.parametrize("bad", ["pipesim simulate --stages 4 --no-such-flag",
                                 "pipesim simulate --stages", "pipesim check a.csv b.csv", "pipesim simulat -h"])
def test_the_parser_check_refuses_what_the_cli_refuses(bad: str) -> None:
    with pytest.raises((AssertionError, click.UsageError)):
        parse(bad)


def test_the_synopsis_check_refuses_an_unknown_flag() -> None:
    with pytest.raises(AssertionError, match="--tpp"):
        check_synopsis("pipesim simulate [--tp T] [--tpp T]")
    with pytest.raises(AssertionError, match="no subcommand"):
        check_synopsis("pipesim simulte [--tp T]")


def test_every_command_in_the_docs_is_accepted_by_the_command_line() -> None:
    found = all_commands()
    assert len(found) >= 25
    failures = []
    for page, line in found:
        try:
            check_synopsis(line) if SYNOPSIS.search(line) else parse(line)
        except (AssertionError, click.UsageError) as exc:
            failures.append(f"{page}: {exc}")
    assert not failures, "\n".join(failures)


def test_the_readme_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [line for line in commands((ROOT / "README.md").read_text(encoding="utf-8"))
             if not SYNOPSIS.search(line)]
    placeholders = [line for line in lines if PLACEHOLDER.search(line)]
    assert not placeholders, f"README command lines must run as written: {placeholders}"
    runnable = [line for line in lines if line.split()[1] not in NOT_RUN]
    assert len(runnable) >= 4
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    monkeypatch.chdir(tmp_path)
    for line in runnable:  # through the CLI's entry point in this process: no interpreter start-up each
        done = in_process(*shlex.split(line)[1:])
        assert done.returncode == 0, f"{line}\n{done.stderr}"
    assert (tmp_path / "vgg16" / "report.html").is_file()
