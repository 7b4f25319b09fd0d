"""Where commands write: ``--out`` checked before any work, so a bad path is one line and exit 2.

A folder (``simulate --out``, ``plan --out``) or a file's folder (``report``, ``sweep``, figures)
is tried up front, so the run is not wasted on a path that cannot take its files, and removed
again if it was new; the writers create it and write each file atomically. Errors the disk
raises while writing become the same one-line ConfigError (``writing``).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import click

from pipesim.errors import ConfigError, WriteFailedError
from pipesim.sweep.cluster import blocked_in_thread

# Suffixes that name a file, not a folder: ``--out result.json`` for a report folder is a mistake.
FILE_SUFFIXES = (".json", ".html", ".htm", ".png", ".svg", ".pdf", ".csv", ".parquet", ".pq", ".txt", ".yaml")


def _reason(exc: OSError) -> str:
    if exc.errno == errno.EEXIST or isinstance(exc, FileExistsError):
        return "exists and is a file"
    if exc.errno == errno.ENOTDIR:
        return "has a file where a folder should be"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "is not writable (permission denied)"
    if exc.errno == errno.ENOSPC:
        return "cannot be written: no space left on the device"
    return f"cannot be created or written ({exc.strerror or exc})"


def _probe_folder(folder: Path, field: str, shown: str) -> None:
    """Check that ``folder`` can be created and written, naming the first part of the path in the
    way; the folders this creates to find out are removed again, so a run that fails later leaves
    nothing behind (the writers create them for real)."""
    missing = []
    for ancestor in [folder, *folder.parents]:
        if ancestor.exists():
            if not ancestor.is_dir():
                rule = ("must be a folder, but it is a file" if ancestor == Path(shown)
                        else f"cannot be written: {ancestor} is a file, not a folder")
                raise ConfigError(field, shown, rule)
            break
        missing.append(ancestor)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError as exc:
        raise ConfigError(field, shown, _reason(exc)) from None
    finally:
        for created in missing:  # deepest first
            with suppress(OSError):
                created.rmdir()
    if not writable:
        raise ConfigError(field, shown, "is not writable (permission denied)")


def out_folder(path: str, field: str = "out") -> Path:
    """Check the folder ``path`` that a command writes its files into.

    Raises:
        ConfigError: the path names a file, looks like a file name (``result.json``), runs
            through a file, or cannot be created or written.
    """
    folder = Path(path)
    if not path.strip():
        raise ConfigError(field, path, "must name a folder")
    if folder.suffix.lower() in FILE_SUFFIXES and not folder.is_dir():
        raise ConfigError(field, path, f"must be a folder, not a file name ending in {folder.suffix}")
    _probe_folder(folder, field, path)
    return folder


def out_file(path: str, suffixes: tuple[str, ...] | None, field: str = "out") -> Path:
    """Check a file path a command will write (atomically).

    Raises:
        ConfigError: a suffix not in ``suffixes`` (None: any), an existing folder at ``path``,
            or a folder that cannot be created or written.
    """
    target = Path(path)
    if suffixes is not None and target.suffix.lower() not in suffixes:
        raise ConfigError(field, path, f"must end in {', '.join(suffixes)}")
    if target.is_dir():
        raise ConfigError(field, path, "is a folder, expected a file name")
    _probe_folder(target.parent, field, path)
    return target


def check_out_files(folder: Path, names: Iterable[str], field: str = "out") -> None:
    """Check every file a command will write under ``folder`` (``names`` relative to it) before
    it writes any, so that a refused command leaves the folder as it was.

    Raises:
        ConfigError: naming the folder and the first file that cannot be written: a folder in its
            place, a file where its folder should be, or a folder that is not writable.
    """
    for name in names:
        parts = Path(name).parts
        path = folder
        for depth, part in enumerate(parts, start=1):
            path = path / part
            if depth == len(parts) and path.is_dir():
                raise ConfigError(field, str(folder), f"cannot write {name}: it is a folder")
            if depth < len(parts) and path.exists() and not path.is_dir():
                raise ConfigError(field, str(folder), f"cannot write {name}: {Path(*parts[:depth])} is a file, "
                                  "not a folder")
            if depth < len(parts) and path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
                raise ConfigError(field, str(folder), f"cannot write {name}: {Path(*parts[:depth])} is not "
                                  "writable (permission denied)")


# Errors of the path (the input's fault: exit 2); any other refusal is the disk's (exit 1).
PATH_ERRORS = (errno.EEXIST, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EISDIR, errno.EROFS)


@contextmanager
def writing(path: str | Path, field: str = "out") -> Iterator[None]:
    """Turn an OSError raised while writing under ``path`` into one line: a ConfigError for a path
    that cannot take the file (exit 2), a WriteFailedError for a disk that refused it (full, a
    file-size limit, an I/O error: exit 1).
    """
    try:
        yield
    except OSError as exc:
        if exc.errno in PATH_ERRORS:
            raise ConfigError(field, str(path), _reason(exc)) from None
        raise WriteFailedError(f"cannot write {path}: {exc.strerror or _reason(exc)}") from None


def write_together(folder: Path, write: Callable[[Path], list[Path]], field: str = "out") -> list[Path]:
    """Call ``write(stage)`` on a hidden folder inside ``folder``, then move every file it wrote into
    ``folder``, so that a disk that refuses a write leaves ``folder`` as it was (no file of the set
    replaced, none half there); return the files' final paths.

    Raises:
        ConfigError: the path cannot take the files (exit 2).
        WriteFailedError: the disk refused a write; nothing in ``folder`` changed, and a folder
            this created is removed again.
    """
    missing = [ancestor for ancestor in [folder, *folder.parents] if not ancestor.exists()]
    stage: Path | None = None
    try:
        with writing(folder, field):
            folder.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(prefix=".pipesim-writing-", dir=folder))
            written = [folder / path.relative_to(stage) for path in write(stage)]
            for path in sorted(path for path in stage.rglob("*") if path.is_file()):
                target = folder / path.relative_to(stage)
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_file():  # a replaced file keeps its mode, as write_text_atomic keeps it
                    os.chmod(path, target.stat().st_mode & 0o7777)
                os.replace(path, target)
    except WriteFailedError as exc:
        raise WriteFailedError(f"{exc}; nothing was written to {folder}") from None
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        for created in missing:  # deepest first; only empty ones, so only after a failure
            with suppress(OSError):
                created.rmdir()
    return written


def out_file_option(suffixes: tuple[str, ...] | None) -> Any:
    """A click callback that checks ``--out FILE`` (``out_file``) as the command line is parsed,
    before the command does any work."""
    def check(context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            out_file(value, suffixes)
        return value

    return check


class ProgressBar:
    """Progress on stderr: ``sweep ━━━ 40/100 points 12.5 points/s elapsed 0:00:03 · 0:00:05 left``.

    On a terminal a rich bar redrawn in place; elsewhere (a log, a CI job) the same words as one
    line at every tenth of the work and at the end, so a redirected run still shows progress.
    Call it with (done, total), (done, total, where) or (done, total, where, work): ``where``
    follows the label (``sweep here``, ``sweep on Dask``); ``work``, the share of the work done
    (0 to 1), sets the time left where items differ in size (else the rate of items does). The
    rate counts from ``started`` (``time.perf_counter()``; the command's start, so that it
    matches the run's wall time) or else from the first call.
    """

    def __init__(self, enabled: bool, *, label: str, unit: str, started: float | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self.label, self.unit, self.enabled = label, unit, enabled
        self.is_live = enabled and console.is_terminal
        self.progress = Progress(
            TextColumn(label + "{task.fields[where]}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
            TextColumn("{task.fields[rate]}"), TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("·"),
            TextColumn("{task.fields[left]}"), TextColumn("left"),
            console=console, disable=not self.is_live,
        )
        self.task: Any = None
        self.start_done = 0
        self.start_work: float | None = None
        self.from_start = started is not None
        self.started = time.perf_counter() if started is None else started
        self.printed_tenth = -1

    def __call__(self, done: int, total: int, where: str = "", work: float | None = None) -> None:
        place = f" {where}" if where else ""
        if self.task is None:
            with blocked_in_thread():  # a live bar's refresher thread must not take a Ctrl-C
                self.progress.start()
            self.start_done, self.start_work = done, work
            if not self.from_start:
                self.started = time.perf_counter()
            self.task = self.progress.add_task(self.label, total=total, completed=done, rate="", where=place,
                                               left="-:--:--")
            self.printed_tenth = 10 * done // max(1, total)
            return
        elapsed = time.perf_counter() - self.started
        rate = (done - self.start_done) / elapsed if elapsed > 0 else 0.0
        if work is not None and self.start_work is not None and work > self.start_work:
            left = elapsed * (1.0 - work) / (work - self.start_work)
        else:
            left = (total - done) / rate if rate > 0 else 0.0
        self.progress.update(self.task, completed=done, rate=f"{rate:.1f} {self.unit}/s", where=place,
                             left=_clock(left))
        tenth = 10 * done // max(1, total)
        if self.enabled and not self.is_live and tenth > self.printed_tenth:
            self.printed_tenth = tenth
            click.echo(f"{self.label}{place} {done}/{total} {self.unit} {rate:.1f} {self.unit}/s elapsed "
                       f"{_clock(elapsed)} · {_clock(left)} left", err=True)

    def stop(self) -> None:
        """End the bar (a terminal's last redraw stays on screen)."""
        self.progress.stop()


def _clock(seconds: float) -> str:
    """``H:MM:SS``, as rich writes elapsed and remaining time."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
