"""One Hugging Face ``config.json``'s values, each read with its type and range checked (the readers' common part)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipesim.errors import ConfigError
from pipesim.spec.transformer import FfnActivation

GELUS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate", "quick_gelu")
# hidden_act names by (the function's family, whether the FFN is gated) -> pipesim's ffn_activation
ACTIVATIONS: dict[tuple[str, bool], FfnActivation] = {("gelu", False): "gelu", ("relu", False): "relu",
                                                       ("gelu", True): "geglu", ("silu", True): "swiglu"}
FAMILY = {name: "gelu" for name in GELUS} | {"relu": "relu", "silu": "silu", "swish": "silu"}


class ConfigKeys:
    """One config.json's values, each read with its type and range checked; ``aliases`` are the
    other names transformers accepts for a key (GPT-2's ``hidden_size`` for ``n_embd``)."""

    def __init__(self, data: Mapping[str, Any], source: str, aliases: Mapping[str, tuple[str, ...]]) -> None:
        self.data, self.source, self.aliases = data, source, aliases
        self.model_type = str(data["model_type"])

    def error(self, key: str, value: Any, rule: str) -> ConfigError:
        return ConfigError(key, value, rule, source=self.source)

    def get(self, key: str) -> tuple[str, Any]:
        """``(name, value)`` as given under ``key`` or an alias (None when absent or null)."""
        given = [(name, self.data[name]) for name in (key, *self.aliases.get(key, ())) if name in self.data]
        for name, value in given[1:]:
            if value != given[0][1]:
                raise self.error(name, value, f"contradicts {given[0][0]}={given[0][1]!r} (one setting, two names)")
        return given[0] if given else (key, None)

    def optional_integer(self, key: str, minimum: int = 1) -> int | None:
        name, value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, value, "must be an integer")
        if value < minimum:
            raise self.error(name, value, f"must be >= {minimum}")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        """The integer under ``key``; absent or null gives ``default``, or an error when there is none."""
        value = self.optional_integer(key)
        if value is not None:
            return value
        if default is None:
            raise self.error(key, None, f"is required in a {self.model_type} config.json")
        return default

    def boolean(self, key: str, default: bool) -> bool:
        name, value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(name, value, "must be true or false")
        return value

    def has_dropout(self, *keys: str, default: float = 0.0) -> bool:
        """Whether any of the dropout probabilities ``keys`` is above 0."""
        probabilities = []
        for key in keys:
            name, value = self.get(key)
            value = default if value is None else value
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise self.error(name, value, "must be a probability in [0, 1]")
            probabilities.append(value)
        return any(probability > 0 for probability in probabilities)

    def activation(self, keys: tuple[str, ...], default: str, *, is_gated: bool) -> FfnActivation:
        """pipesim's name for the FFN's activation given under the first of ``keys`` present."""
        given = [self.get(key) for key in keys]
        name, value = next(((name, value) for name, value in given if value is not None), (keys[0], default))
        result = ACTIVATIONS.get((FAMILY.get(value, ""), is_gated)) if isinstance(value, str) else None
        if result is None:
            known = [n for n, family in FAMILY.items() if (family, is_gated) in ACTIVATIONS]
            raise self.error(name, value, f"must be one of {', '.join(known)} for the "
                             f"{'gated ' if is_gated else ''}FFN of a {self.model_type} config.json")
        return result

    def heads(self, hidden: int, heads_key: str, kv_key: str | None,
              head_dim: int | None) -> tuple[int, int, int | None]:
        """``(a, g, head size)``: heads, KV heads (``kv_key`` absent: a) and d where it is not h / a."""
        heads = self.integer(heads_key)
        kv_heads = heads if kv_key is None else self.integer(kv_key, heads)
        if head_dim is None and hidden % heads:
            raise self.error(heads_key, heads, f"must divide the hidden size ({hidden})")
        if heads % kv_heads:
            raise self.error(kv_key or heads_key, kv_heads, f"must divide the attention heads ({heads})")
        return heads, kv_heads, None if head_dim is None or head_dim * heads == hidden else head_dim
