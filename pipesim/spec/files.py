"""Reading and writing input files: our versioned JSON, told apart from PipeDream's graph.txt."""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any, BinaryIO

from pipesim.errors import ConfigError
from pipesim.spec.cluster import Cluster
from pipesim.spec.device import Device
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Profile
from pipesim.spec.topology import Topology
from pipesim.spec.validation import FrozenModel, build


# The most bytes pipesim reads from an input file (profile, topology, plan, sweep spec, schedule CSV):
# far past any real one (a 100,000-layer profile is about 30 MB), so that /dev/zero or an endless
# pipe is refused rather than read until memory runs out.
MAX_INPUT_BYTES = 256 << 20
# A trace file (plot, report): about 175 bytes per op, so a run at the default --max-ops is ~1.5 GB.
MAX_TRACE_BYTES = 4 << 30
# Python refuses to convert longer digit strings to int (sys.get_int_max_str_digits), with a traceback.
MAX_INT_DIGITS = 4300


def read_bytes(path: str | Path, field: str = "path", limit: int = MAX_INPUT_BYTES) -> bytes:
    """Read at most ``limit`` bytes of a file (or a device, or a pipe such as ``<(...)``).

    Raises:
        ConfigError: the file is missing, unreadable, or holds more than ``limit`` bytes.
    """
    try:
        with open(path, "rb") as stream:
            status = os.fstat(stream.fileno())
            regular = stat.S_ISREG(status.st_mode)
            data = b"" if regular and status.st_size > limit else _read_bounded(
                stream, limit, status.st_size + 1 if regular else 16 << 20)
    except FileNotFoundError:
        raise ConfigError(field, str(path), "file does not exist") from None
    except IsADirectoryError:
        raise ConfigError(field, str(path), "is a directory, expected a file") from None
    except OSError as exc:
        raise ConfigError(field, str(path), f"cannot be read ({exc.strerror})") from None
    if len(data) > limit or (regular and status.st_size > limit):
        raise ConfigError(field, str(path), f"holds more than {limit:,} bytes, the most pipesim reads from one file")
    return data


def _read_bounded(stream: BinaryIO, limit: int, piece_bytes: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``stream``, ``piece_bytes`` at a time (``read(n)`` sets n bytes
    aside at once: a regular file's size, or 16 MiB pieces of a device or a pipe)."""
    first = stream.read(min(piece_bytes, limit + 1))
    if len(first) < piece_bytes or len(first) > limit:  # the whole file in one read, the usual case
        return first
    data = bytearray(first)
    while len(data) <= limit:
        piece = stream.read(min(16 << 20, limit + 1 - len(data)))
        if not piece:
            break
        data += piece
    return bytes(data)


def decode_utf8(data: bytes, path: str | Path, field: str = "path") -> str:
    """``data`` as UTF-8 text.

    Raises:
        ConfigError: the bytes are not UTF-8, naming where they stop being so.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, str(path), f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_text(path: str | Path, field: str = "path", limit: int = MAX_INPUT_BYTES) -> str:
    """Read a UTF-8 text file of at most ``limit`` bytes.

    Raises:
        ConfigError: the file is missing, unreadable, larger than ``limit`` or not UTF-8.
    """
    return decode_utf8(read_bytes(path, field, limit), path, field)


def check_int_digits(digits: str) -> int:
    """``int(digits)``, refusing more digits than Python converts (which would be a traceback).

    Raises:
        ConfigError: more than ``MAX_INT_DIGITS`` digits (the value shown cut short).
    """
    count = len(digits.lstrip("+-"))
    if count > MAX_INT_DIGITS:
        raise ConfigError("integer", digits[:20] + "...", f"has {count:,} digits; pipesim reads at most "
                          f"{MAX_INT_DIGITS:,}")
    return int(digits)


def parse_json(text: str, path: str | Path, field: str = "path") -> Any:
    """Parse JSON text read from ``path``; a syntax error names the line and column, a key given
    twice in one object is an error (JSON parsers otherwise keep the last silently), and so is an
    integer of more digits than Python converts."""

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise ConfigError(key, value, "is given twice in one JSON object", source=str(path))
            seen[key] = value
        return seen

    try:
        return json.loads(text, object_pairs_hook=unique_keys, parse_int=check_int_digits)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            field, str(path), f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise ConfigError(field, str(path), "is nested too deeply") from None
    except ConfigError as exc:
        if exc.source is not None:
            raise
        raise ConfigError(exc.field, exc.value, exc.rule, source=str(path)) from None


def read_json(path: str | Path, field: str = "path") -> Any:
    """Read and parse a JSON file (see ``parse_json``)."""
    return parse_json(read_text(path, field), path, field)


def dumps(data: Any) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, a final newline."""
    return json.dumps(data, sort_keys=True, indent=2, allow_nan=True) + "\n"


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a crash leaves the old file.

    A new file gets the usual ``0666 & ~umask`` mode, a replaced file keeps its mode.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: its files are owner-only (0600) whatever the umask, and would stay so after the rename.
    temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        if target.exists():
            os.chmod(temporary, target.stat().st_mode & 0o7777)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def looks_like_graph_txt(text: str) -> bool:
    """True when ``text`` is PipeDream's graph.txt format rather than JSON."""
    stripped = text.lstrip()
    return not stripped.startswith("{") and " -- " in stripped.split("\n", 1)[0]


def load_profile(path: str | Path) -> Profile:
    """Load a profile from our JSON or from PipeDream's graph.txt, told apart by content.

    Raises:
        ConfigError: an unreadable file or a value that breaks a rule, naming the file and field.
    """
    text = read_text(path, "profile")
    if looks_like_graph_txt(text):
        from pipesim.spec.graphtxt import parse_graph_txt

        return parse_graph_txt(text, source=str(path))
    return build(Profile, parse_json(text, path, "profile"), source=str(path))


def load_topology(path: str | Path) -> Topology:
    """Load a topology JSON file (``pipesim.topology/1``)."""
    return build(Topology, read_json(path, "topology"), source=str(path))


def load_device_file(*, path: str | Path | None = None, text: str | None = None, source: str | None = None) -> Device:
    """A device file (``pipesim.device/1``) from ``path``, or from ``text`` read elsewhere (``source`` names it)."""
    where = str(path) if path is not None else source or "device"
    data = read_json(path, "device") if path is not None else parse_json(text or "", where, "device")
    return build(Device, data, source=where)


def load_cluster_file(*, path: str | Path | None = None, text: str | None = None, source: str | None = None) -> Cluster:
    """A cluster file (``pipesim.cluster/1``) from ``path``, or from ``text`` read elsewhere (``source`` names it)."""
    where = str(path) if path is not None else source or "cluster"
    data = read_json(path, "cluster") if path is not None else parse_json(text or "", where, "cluster")
    return build(Cluster, data, source=where)


def load_plan(path: str | Path) -> Plan:
    """Load a plan JSON file (``pipesim.plan/1``); a planner output's ``"plan"`` key is accepted too."""
    data = read_json(path, "plan")
    if isinstance(data, dict) and isinstance(data.get("plan"), dict):
        data = data["plan"]
    return build(Plan, data, source=str(path))


def model_to_json(model: FrozenModel) -> str:
    """Deterministic JSON of an input model, with ``schema`` first-class and unset optionals dropped."""
    return dumps(model.model_dump(mode="json", by_alias=True, exclude_none=True))


def save_model(model: FrozenModel, path: str | Path) -> None:
    """Write an input model (Profile, Topology, Plan) as deterministic JSON, atomically."""
    write_text_atomic(path, model_to_json(model))
