"""Turning pydantic validation failures into one-line ConfigErrors."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from pipesim.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)


class FrozenModel(BaseModel):
    """Base of every input model: immutable, no unknown fields, NaN and inf refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def field_path(location: tuple[int | str, ...]) -> str:
    """Render a pydantic error location as ``layers[3].forward_s``."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + part
    return path or "<root>"


def build(model: type[ModelT], data: Any, *, source: str | None = None) -> ModelT:
    """Validate ``data`` into ``model``.

    Raises:
        ConfigError: naming the first offending field, its value and the rule it breaks.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise config_error_from(exc, source=source) from None


def config_error_from(exc: ValidationError, *, source: str | None = None) -> ConfigError:
    """The first error of a pydantic ValidationError as a ConfigError."""
    first = exc.errors(include_url=False)[0]
    rule = str(first["msg"])
    if rule.startswith("Value error, "):
        rule = rule[len("Value error, ") :]
    return ConfigError(field_path(tuple(first["loc"])), first.get("input"), rule, source=source)
