"""A sweep's chunk folder ``OUT.parts/``: whole chunks, one writer at a time, chunks checked before a resume trusts them.

Whoever ran a batch writes its chunk, one Parquet file named by the batch's smallest and largest
point: the sweep for the points it ran itself, a Dask worker for its batches where it sees the
folder (it reads this run's token in ``manifest.json``, ``writer_of``). A chunk goes to a
temporary name first and is renamed, so the folder only ever holds whole chunks.

Two sweeps onto one OUT would each compute everything and delete the other's files, so the
sweep that writes OUT holds an exclusive lock (``flock``) on ``OUT.parts/lock``, which names its
pid; the kernel releases it when the process ends, however it ends, so a killed sweep leaves no
stale lock. A resumed sweep reads every chunk whole and keeps only those that hold the sweep's
columns, of their kinds, and points of their own: a damaged, foreign or repeated chunk is named
and removed, and its points are computed again. At the end only what pipesim wrote goes: the
chunks, the manifest and the lock, then the folder if it is pipesim's and empty (a symbolic link
to scratch space, and anything else in the folder, stay).
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from pipesim.errors import ConfigError
from pipesim.spec.files import read_json

CHUNK_GLOB = "chunk-*.parquet"
LOCK_NAME = "lock"
MANIFEST_NAME = "manifest.json"


class PartsLock:
    """The exclusive right to write ``OUT.parts/`` (and OUT), held until ``release``.

    Raises:
        ConfigError: another live process holds it (its pid named).
    """

    def __init__(self, parts: Path, out: Path) -> None:
        self.path = parts / LOCK_NAME
        for _ in range(8):  # the holder may remove the file as it finishes: lock the file that is there
            handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(handle, 32).decode(errors="replace").strip() or "unknown"
                os.close(handle)
                raise ConfigError("out", str(out), f"another sweep (pid {holder}) is writing it and {parts}; wait for "
                                  "it to end, or choose another --out") from None
            with suppress(FileNotFoundError):
                if os.stat(self.path).st_ino == os.fstat(handle).st_ino:
                    break
            os.close(handle)
        else:
            raise ConfigError("out", str(out), f"could not lock {self.path}: another sweep keeps replacing it")
        os.ftruncate(handle, 0)
        os.write(handle, f"{os.getpid()}\n".encode())
        self.handle: int | None = handle

    def release(self) -> None:
        """Give the lock up (closing the file releases it)."""
        if self.handle is not None:
            os.close(self.handle)
            self.handle = None


def read_manifest(manifest: Path) -> dict[str, Any]:
    """The manifest of an interrupted sweep's chunks.

    Raises:
        ConfigError: it is unreadable or not a JSON object, naming the file.
    """
    data = read_json(manifest, "manifest")
    if not isinstance(data, dict):
        raise ConfigError("manifest", type(data).__name__, "must be a JSON object naming the sweep's digest; "
                          f"delete {manifest.parent} to start over", source=str(manifest))
    return data


def check_chunks(chunks: Sequence[Path], columns: Sequence[str],
                 num_points: int) -> tuple[set[int], list[tuple[Path, str]]]:
    """The points the whole, sound ``chunks`` hold, and each chunk that is not with the reason.

    A chunk is sound when it reads as Parquet, holds exactly ``columns`` in order, each column of
    its kind (``points.COLUMN_KINDS``: what the final table's merge and readers need), and points
    that are integers in ``0..num_points-1`` that no earlier chunk (by name) holds.
    """
    done: set[int] = set()
    bad: list[tuple[Path, str]] = []
    for chunk in chunks:
        try:
            points = _chunk_points(chunk, columns, num_points)
        except ValueError as reason:
            bad.append((chunk, str(reason)))
            continue
        repeated = done.intersection(points)
        if repeated:
            bad.append((chunk, f"repeats point {min(repeated)} of an earlier chunk"))
            continue
        done.update(points)
    return done, bad


def _chunk_points(chunk: Path, columns: Sequence[str], num_points: int) -> list[int]:
    """The points of one chunk.

    Raises:
        ValueError: why the chunk cannot be used.
    """
    import pandas as pd
    import pyarrow as pa  # type: ignore[import-untyped]

    from pipesim.sweep.points import COLUMN_KINDS

    try:
        frame = pd.read_parquet(chunk)
    except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = text.rsplit("': ", 1)[-1]  # pyarrow's follows the path it quotes: "... source '...': REASON"
        raise ValueError(f"is not a readable Parquet file ({reason})") from None
    if list(frame.columns) != list(columns):
        missing = [column for column in columns if column not in frame.columns]
        extra = [column for column in frame.columns if column not in columns]
        raise ValueError(f"lacks the columns {missing}" if missing else f"has columns no sweep writes: {extra}"
                         if extra else "has the sweep's columns in another order")
    types = pd.api.types
    for column in columns:
        values, kind = frame[column], COLUMN_KINDS.get(column, "text")
        number = types.is_numeric_dtype(values) and not types.is_bool_dtype(values)
        fits = {"integer": types.is_integer_dtype(values) and number, "number": number,
                "boolean": types.is_bool_dtype(values)}.get(kind)
        if fits is None:  # text: strings, or nothing at all
            fits = all(value is None or isinstance(value, str) for value in values)
        if not fits:
            raise ValueError(f"column {column} holds {values.dtype} values, not {kind} ones")
    points = frame["point"].tolist()
    if len(set(points)) != len(points) or not all(0 <= point < num_points for point in points):
        raise ValueError(f"holds points outside 0..{num_points - 1} or twice")
    return [int(point) for point in points]


def remove_parts(parts: Path) -> None:
    """Remove what pipesim wrote in ``parts`` (chunks, manifest, temporary files, lock), then the
    folder itself if it is a folder (not a link to one) and nothing else is left in it."""
    for path in [*parts.glob(CHUNK_GLOB), *parts.glob(".*.tmp"), parts / MANIFEST_NAME, parts / LOCK_NAME]:
        path.unlink(missing_ok=True)
    if not parts.is_symlink():
        with suppress(OSError):
            parts.rmdir()


def has_chunks(parts: Path) -> bool:
    """Whether ``parts`` holds finished chunks of an interrupted sweep."""
    return parts.is_dir() and any(parts.glob(CHUNK_GLOB))


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary)`` then rename the temporary file onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        write(temporary)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def rows_frame(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Any:
    """A DataFrame of ``rows`` with ``columns`` in order."""
    import pandas as pd

    return pd.DataFrame.from_records(list(rows), columns=list(columns))


def write_reason(error: OSError) -> str:
    """Why a write failed, in a few words: the system's reason ("No space left on device")."""
    text = str(error).strip()
    return error.strerror or (text.splitlines()[0] if text else type(error).__name__)


def finished_chunks(parts: Path) -> list[Path]:
    """The chunks in ``parts`` (none when the folder is missing), by name."""
    return sorted(parts.glob(CHUNK_GLOB)) if parts.exists() else []


def chunk_path(parts: Path, points: Sequence[int]) -> Path:
    """Where the chunk of a batch of ``points`` goes: named by its smallest and largest point (each
    point is in one batch, so no two batches share their smallest)."""
    return parts / f"chunk-{min(points):08d}-{max(points):08d}.parquet"


def chunk_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Any:
    """A batch's rows as the Arrow table its chunk holds."""
    import pyarrow as pa

    return pa.Table.from_pandas(rows_frame(rows, columns), preserve_index=False)


def write_chunk(parts: Path, table: Any) -> Path:
    """Write a batch's table (``chunk_table``) into ``parts`` as one chunk, atomically; its path.
    Workers call it for the batches they ran, where they see the folder (``writer_of``), and the
    sweep for the others."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    path = chunk_path(parts, table.column("point").to_pylist())
    write_atomic(path, lambda temporary: pq.write_table(table, temporary))
    return path


def writer_of(parts: Path) -> str | None:
    """The token of the sweep writing ``parts`` now (its manifest's ``writer``), or None where the
    folder or its manifest cannot be read: a worker on another host without the folder, say."""
    try:
        manifest = json.loads((parts / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    writer = manifest.get("writer") if isinstance(manifest, dict) else None
    return writer if isinstance(writer, str) else None
