"""Sweep results on disk: finished batches as atomic Parquet chunks, merged into one table at the end.

While a sweep runs, ``OUT.parts/`` holds ``manifest.json`` and one chunk per finished batch
(``pipesim.sweep.parts``: written whole, by the sweep or by the Dask worker that ran the batch),
so a killed sweep leaves only whole chunks; one sweep at a time writes there. ``--resume`` checks
the chunks and skips their points. When every point is done, the chunks (this run's taken from
memory) are merged, sorted by point, written atomically to OUT (Parquet, or CSV by suffix) and
what pipesim wrote in the folder is removed.
A finished CSV table gets ``OUT.digest`` beside it (the spec's digest and the hash of the CSV's
bytes), so that ``--resume`` on a finished CSV, as on a finished Parquet table (which holds the
digest in its metadata), does nothing.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipesim.errors import ConfigError, PipesimError
from pipesim.spec.files import dumps, read_json, write_text_atomic
from pipesim.sweep.parts import (MANIFEST_NAME, PartsLock, check_chunks, chunk_path, chunk_table, finished_chunks,
                                 read_manifest, remove_parts, rows_frame, write_atomic, write_chunk, write_reason)

PARTS_SCHEMA = "pipesim.sweep-parts/1"
CSV_DIGEST_SCHEMA = "pipesim.sweep-csv-digest/1"
DIGEST_KEY = b"pipesim.sweep.digest"
RUN_KEY = b"pipesim.run"
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}


class SweepFailedError(PipesimError):
    """A sweep stopped before its end: its output could not be written, or its Dask scheduler or
    workers were lost. The finished points stay in ``OUT.parts/``; the message says so, in one line."""


def resume_hint(parts: Path, done: int) -> str:
    """The end of every SweepFailedError message: what is kept and how to go on."""
    return f"{done} finished points are kept in {parts} (rerun with --resume)"


@contextmanager
def writing(path: Path, parts: Path, done: int) -> Iterator[None]:
    """Turn an OSError (disk full, file too large, no permission) while writing ``path`` into a
    one-line SweepFailedError naming the file.

    Raises:
        SweepFailedError: the write failed.
    """
    try:
        yield
    except OSError as exc:
        raise SweepFailedError(f"cannot write {path}: {write_reason(exc)}; {resume_hint(parts, done)}") from exc


def table_format(path: Path, field: str = "out") -> str:
    """``"parquet"`` or ``"csv"`` from the file's suffix; ``field`` names the argument in errors.

    Raises:
        ConfigError: another suffix.
    """
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ConfigError(field, str(path), f"must end in {', '.join(FORMATS)}")
    return FORMATS[suffix]


def write_table(frame: Any, path: Path, *, digest: str | None = None, run: dict[str, Any] | None = None) -> None:
    """Write a results table atomically as Parquet or CSV (by suffix); deterministic bytes.

    In a finished Parquet table (``digest`` given) the ``error`` of a point without one is null;
    in CSV it is the empty field, which is CSV's null. ``run`` (what produced the table: command,
    version, spec and inputs by name and SHA-256) goes in the Parquet key-value metadata under
    ``pipesim.run`` as JSON, or for CSV into ``OUT.digest``.
    """
    kind = table_format(path)
    if kind == "csv":
        if "error" in frame.columns:  # null errors as empty fields, not na_rep's "nan"
            frame = frame.assign(error=frame["error"].fillna(""))
        write_atomic(path, lambda temporary: frame.to_csv(temporary, index=False, lineterminator="\n", na_rep="nan"))
        if digest is not None:
            write_text_atomic(csv_digest_path(path), dumps({"schema": CSV_DIGEST_SCHEMA, "digest": digest,
                                                            "sha256": _sha256(path), **({"run": run} if run else {})}))
        return
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    if digest is not None and "error" in frame.columns:
        # The finished table: no error is null, as Parquet readers (pandas, DuckDB, Spark) expect.
        frame = frame.assign(error=frame["error"].where(frame["error"].fillna("") != "", None))
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if digest is not None:
        extra = {DIGEST_KEY: digest.encode()}
        if run is not None:
            extra[RUN_KEY] = json.dumps(run, sort_keys=True, allow_nan=False).encode()
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **extra})
    write_atomic(path, lambda temporary: pq.write_table(table, temporary))


def read_table(path: str | Path, *, columns: Sequence[str] = (), numbers: Sequence[str] = ()) -> Any:
    """Read a sweep table (Parquet or CSV) as a DataFrame; ``error`` is null where a point had none.

    Every column a sweep writes (``COLUMN_KINDS``) is checked for its kind, and so is each of
    ``numbers``; each of ``columns`` must be there.

    Raises:
        ConfigError: a missing, unreadable or malformed file, an unknown suffix, a column of
            ``columns`` missing, or a value of another kind; the message names the file, and the
            column and value.
    """
    target = Path(path)
    kind = table_format(target, "table")
    if target.is_dir():
        raise ConfigError("table", str(target), "is a directory, expected a file")
    if not target.is_file():
        raise ConfigError("table", str(target), "file does not exist")
    frame = _read_csv(target) if kind == "csv" else _read_parquet(target)
    from pipesim.sweep.analysis import require_columns

    require_columns(frame, *columns, source=str(target))
    return _checked(frame, numbers, str(target))


def _read_csv(target: Path) -> Any:
    import pandas as pd

    try:
        frame = pd.read_csv(target, keep_default_na=False, na_values=["nan"])
    except pd.errors.EmptyDataError:
        raise ConfigError("table", str(target), "is empty, expected a CSV header and rows") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("table", str(target), f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except pd.errors.ParserError as exc:
        raise ConfigError("table", str(target), f"is not a valid CSV table ({_first_line(exc)})") from None
    except OSError as exc:
        raise ConfigError("table", str(target), f"cannot be read ({exc.strerror or _first_line(exc)})") from None
    if "error" in frame.columns:  # the empty field is CSV's null: read it as Parquet's null reads
        frame["error"] = frame["error"].where(frame["error"] != "")
    return frame


def _read_parquet(target: Path) -> Any:
    import pandas as pd
    import pyarrow as pa

    try:
        return pd.read_parquet(target)
    except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
        # pyarrow's reason follows the path it quotes: "Could not open Parquet input source '...': REASON"
        reason = _first_line(exc).rsplit("': ", 1)[-1]
        raise ConfigError("table", str(target), f"is not a readable Parquet table ({reason})") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _checked(frame: Any, numbers: Sequence[str], source: str) -> Any:
    """``frame`` with each column of a known kind (``COLUMN_KINDS``), and each of ``numbers``,
    holding only values of that kind: numbers given as text in a CSV column converted.

    Raises:
        ConfigError: naming the column, its first value of another kind and its row.
    """
    import numpy as np
    import pandas as pd

    from pipesim.sweep.points import COLUMN_KINDS

    types = pd.api.types
    for column in frame.columns:
        kind = COLUMN_KINDS.get(column, "text")
        if kind == "text" and column in numbers:
            kind = "number"
        values = frame[column]
        numeric_type = types.is_numeric_dtype(values) and not types.is_bool_dtype(values)
        if kind == "text" or (kind == "boolean" and types.is_bool_dtype(values)) or \
                (kind == "integer" and types.is_integer_dtype(values) and numeric_type) or \
                (kind == "number" and numeric_type):
            continue
        if kind == "boolean":
            bad = ~values.map(lambda value: isinstance(value, bool | np.bool_)).to_numpy(dtype=bool)
            rule = "must be true or false"
            if not bad.any():
                continue
        else:
            # Booleans are not numbers here, though to_numeric would take True for 1.
            numeric = values if numeric_type else pd.to_numeric(
                values.where(values.map(lambda value: not isinstance(value, bool | np.bool_))), errors="coerce")
            number = numeric.to_numpy(dtype=float)
            if kind == "integer":
                bad = ~np.isfinite(number) | (number != np.round(number)) | (np.abs(number) >= 2.0**63)
                rule = "must be an integer"
            else:
                bad = np.isnan(number) & values.notna().to_numpy(dtype=bool)
                rule = "must be a number"
            if not bad.any():
                frame[column] = numeric.astype("int64") if kind == "integer" else numeric.astype(float)
                continue
        row = int(np.flatnonzero(bad)[0])
        value = values.iloc[row]
        shown = value.item() if isinstance(value, np.generic) else value
        raise ConfigError(column, shown, f"{rule} (row {row + 1} of {len(frame)})", source=source)
    return frame


def read_run(path: str | Path) -> dict[str, Any] | None:
    """The ``run`` record a finished table was written with (``write_table``), or None."""
    target = Path(path)
    if table_format(target, "table") == "csv":
        digest_file = csv_digest_path(target)
        kept = read_json(digest_file, "digest") if digest_file.is_file() else None
        run = kept.get("run") if isinstance(kept, dict) else None
    else:
        import pyarrow.parquet as pq

        raw = (pq.read_schema(target).metadata or {}).get(RUN_KEY)
        run = json.loads(raw) if raw else None
    return run if isinstance(run, dict) else None


class ResultStore:
    """The chunk folder of one sweep's output, locked against a second sweep onto the same ``out``
    (``parts.PartsLock``) until ``finish`` or ``close``.

    Args:
        out: the final table's path (``.parquet`` or ``.csv``).
        digest: hash of the spec and its inputs; chunks of another spec are refused.
        num_points: points in the sweep.
        columns: row columns, in order.
        resume: continue an interrupted sweep; without it, existing chunks are an error.
        run: what produced the table, written into its metadata (``write_table``).

    Attributes:
        done: the points whose rows are in sound chunks.
        dropped: one line per chunk a resume found damaged, of another sweep or repeated, and
            removed (its points are not in ``done``, so they run again).

    Raises:
        ConfigError: another sweep is writing ``out``, chunks exist without ``resume``, or they
            belong to another spec (or their manifest is damaged).
        SweepFailedError: the folder or its manifest cannot be written.
    """

    def __init__(self, out: Path, digest: str, num_points: int, columns: Sequence[str], *, resume: bool,
                 run: dict[str, Any] | None = None) -> None:
        table_format(out)
        self.run = run
        self.out = out
        self.parts = out.parent / f"{out.name}.parts"
        self.digest = digest
        self.num_points = num_points
        self.columns = tuple(columns)
        self.done: set[int] = set()
        self.dropped: list[str] = []
        self.tables: dict[str, Any] = {}
        # Names this run in the manifest: a worker writes its batch's chunk only where it reads this token
        # there (the folder it sees is this run's), and a task left running by an interrupted run does not.
        self.writer = uuid.uuid4().hex
        manifest = self.parts / MANIFEST_NAME
        with writing(self.parts, self.parts, 0):
            self.parts.mkdir(parents=True, exist_ok=True)  # through a link to scratch space too
            self.lock = PartsLock(self.parts, out)
        try:
            self._take_over(manifest, resume)
        except BaseException:
            self.close()
            raise
        # The writer's libraries now, before any work is sent out: imported at the first chunk, with both cores
        # busy with workers, they held that chunk back by about a second (2026-11-25).
        import pandas  # noqa: F401
        import pyarrow.parquet  # noqa: F401

    def _take_over(self, manifest: Path, resume: bool) -> None:
        """Check the chunks left by an interrupted sweep (keeping the sound ones) and write the manifest."""
        # A sweep that ended before its first chunk left nothing to keep: it starts over, --resume or not.
        chunks = finished_chunks(self.parts)
        if chunks and not resume:
            raise ConfigError(
                "resume", False, f"{self.parts} holds {len(chunks)} finished chunks of an interrupted sweep: "
                "pass --resume to continue it, or delete that folder to start over",
            )
        if chunks:
            previous = read_manifest(manifest) if manifest.exists() else {}
            if previous.get("digest") != self.digest:
                raise ConfigError(
                    "resume", str(self.parts), "holds results of a different spec, profile or pipesim version; "
                    "delete it to start over",
                )
            self.done, bad = check_chunks(chunks, self.columns, self.num_points)
            for chunk, reason in bad:  # pipesim's own chunk, damaged: its points run again
                chunk.unlink(missing_ok=True)
                self.dropped.append(f"{chunk}: {reason}")
        for stray in self.parts.glob(".*.tmp"):
            stray.unlink()
        with writing(manifest, self.parts, len(self.done)):
            write_text_atomic(manifest, dumps({"schema": PARTS_SCHEMA, "digest": self.digest,
                                               "num_points": self.num_points, "writer": self.writer}))

    def close(self) -> None:
        """Give up the lock on ``OUT.parts`` (the chunks stay for a resume)."""
        self.lock.release()

    def write_chunk(self, rows: Sequence[dict[str, Any]]) -> Path:
        """Write one finished batch's rows as a chunk and mark its points done.

        Raises:
            SweepFailedError: the chunk could not be written (the earlier chunks are kept).
        """
        points = [int(row["point"]) for row in rows]
        path = chunk_path(self.parts, points)
        table = chunk_table(rows, self.columns)
        with writing(path, self.parts, len(self.done)):
            write_chunk(self.parts, table)
        self.add_written(points, table)
        return path

    def add_written(self, points: Sequence[int], table: Any) -> None:
        """Mark ``points`` done, their chunk written (``parts.write_chunk``) with ``table``, which the
        merge takes instead of reading the chunk back."""
        self.done.update(points)
        self.tables[chunk_path(self.parts, points).name] = table

    def recount(self) -> int:
        """Read the points done again from the chunks on disk (after workers that may have written
        chunks unreported have stopped); the count."""
        import pyarrow.parquet as pq

        done: set[int] = set()
        for chunk in finished_chunks(self.parts):
            done.update(pq.read_table(chunk, columns=["point"]).column("point").to_pylist())
        self.done = done
        return len(done)

    def finish(self) -> Any:
        """Merge the chunks into ``out`` (sorted by point), remove what pipesim wrote in the folder,
        return the table. The chunks written in this run are taken from memory; only those of an
        interrupted run are read.

        Raises:
            ConfigError: the chunks do not hold every point exactly once.
            SweepFailedError: ``out`` could not be written (the chunks are kept).
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = [self.tables[chunk.name] if chunk.name in self.tables else pq.read_table(chunk)
                  for chunk in finished_chunks(self.parts)]
        if tables:
            # One schema for all: a column that is all null in one chunk (no point had an error) and
            # text in another is text; the chunks' pandas metadata (their own index) is dropped.
            merged = pa.concat_tables(tables, promote_options="default").replace_schema_metadata(None)
            frame = merged.to_pandas()
        else:
            frame = rows_frame([], self.columns)
        frame = frame.sort_values("point", kind="stable").reset_index(drop=True)
        points = frame["point"].tolist()
        if points != list(range(self.num_points)):
            raise ConfigError("parts", str(self.parts), f"hold {len(points)} rows for {self.num_points} points")
        with writing(self.out, self.parts, len(points)):
            write_table(frame, self.out, digest=self.digest, run=self.run)
        remove_parts(self.parts)
        self.close()
        return frame


def csv_digest_path(out: Path) -> Path:
    """Where a finished CSV table's digest is kept: ``OUT.digest``."""
    return out.parent / f"{out.name}.digest"


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def finished_digest(out: Path) -> str | None:
    """The spec digest of a finished table: in a Parquet table's metadata, or for CSV in
    ``OUT.digest`` when that names the CSV's current bytes; None when missing or unreadable."""
    if not out.is_file():
        return None
    if table_format(out) == "csv":
        try:
            kept = read_json(csv_digest_path(out), "digest")
            digest, sha = kept.get("digest"), kept.get("sha256")
        except (ConfigError, OSError, AttributeError):
            return None
        return digest if isinstance(digest, str) and sha == _sha256(out) else None
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(out).metadata or {}
    except (OSError, ValueError):
        return None
    value = metadata.get(DIGEST_KEY)
    return value.decode() if value else None
