"""Turning pydantic validation failures into one-line ConfigErrors."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from pipesim.errors import MISSING, ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)


class FrozenModel(BaseModel):
    """Base of every input model: immutable, no unknown fields, NaN and inf refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _number(value: Any) -> Any:
    """Refuse what pydantic's lax mode would read as a number: a boolean (``true`` is not 1) or a
    string (``"4"`` in a JSON file is a mistake); ints stay numbers where floats are expected."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    if isinstance(value, str):
        raise ValueError("must be a number, not a string")
    return value


def _boolean(value: Any) -> Any:
    """Refuse what pydantic's lax mode would read as a boolean: a string (``"yes"``) or a number."""
    if isinstance(value, str):
        raise ValueError("must be true or false, not a string")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError("must be true or false, not a number")
    return value


# The number and boolean types of the input files' models (the field's constraints come from Field).
Float = Annotated[float, BeforeValidator(_number)]
Int = Annotated[int, BeforeValidator(_number)]
Bool = Annotated[bool, BeforeValidator(_boolean)]


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
    """The first error of a pydantic ValidationError as a ConfigError. A model's own check that
    raises a ConfigError names its field and value, under the path of the model that raised it."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    raised = first.get("ctx", {}).get("error")
    if isinstance(raised, ConfigError):
        within = field_path(tuple(first["loc"])) if first["loc"] else ""
        field = f"{within}.{raised.field}" if within and not raised.field.startswith("[") else within + raised.field
        return ConfigError(field, raised.value, raised.rule, source=source)
    if first["type"] == "missing":  # pydantic's input is then the whole object that lacks it
        within = first.get("input")
        named = within.get("name") if isinstance(within, dict) else None
        of = f" (in {_short_name(named)})" if isinstance(named, str) else ""
        # A misspelt field is both missing and unknown: the unknown name beside it says which.
        parent = tuple(first["loc"][:-1])
        unknown = [str(error["loc"][-1]) for error in errors
                   if error["type"] == "extra_forbidden" and tuple(error["loc"][:-1]) == parent]
        given = f"; {', '.join(map(repr, unknown))} {'is not a field' if len(unknown) == 1 else 'are not fields'}" \
            if unknown else ""
        return ConfigError(field_path(tuple(first["loc"])), MISSING, f"is required{of}{given}", source=source)
    rule = str(first["msg"])
    if rule.startswith("Value error, "):
        rule = rule[len("Value error, ") :]
    return ConfigError(field_path(tuple(first["loc"])), first.get("input"), rule, source=source)


def _short_name(name: str, limit: int = 60) -> str:
    """A name as it reads in a message: quoted, cut to ``limit`` characters."""
    return repr(name if len(name) <= limit else name[: limit - 3] + "...")
