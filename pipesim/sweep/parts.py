"""A sweep's chunk folder, ``OUT.parts/``: one Parquet chunk per finished batch, each written whole.

Whoever ran a batch writes its chunk: the sweep for the points it ran itself, a Dask worker for its
batches where it sees the folder (it reads this run's token in ``manifest.json``, ``writer_of``).
A chunk goes to a temporary name first and is renamed, so the folder only ever holds whole chunks;
the chunk of a batch is named by its smallest and largest point.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


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
    return sorted(parts.glob("chunk-*.parquet")) if parts.exists() else []


def chunk_path(parts: Path, points: Sequence[int]) -> Path:
    """Where the chunk of a batch of ``points`` goes: named by its smallest and largest point (each
    point is in one batch, so no two batches share their smallest)."""
    return parts / f"chunk-{min(points):08d}-{max(points):08d}.parquet"


def chunk_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Any:
    """A batch's rows as the Arrow table its chunk holds."""
    import pyarrow as pa  # type: ignore[import-untyped]

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
        manifest = json.loads((parts / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    writer = manifest.get("writer") if isinstance(manifest, dict) else None
    return writer if isinstance(writer, str) else None
