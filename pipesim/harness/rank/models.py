"""Models the harness runs: synthetic MLP and transformer stacks, or a user's nn.Sequential, plus data."""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from dataclasses import dataclass, field

import torch
import torch.nn.functional as functional
from torch import nn

from pipesim.errors import ConfigError
from pipesim.harness.config import ModelSpec, user_model_file

__all__ = ["ModelBundle", "ModelSpec", "MSELossLayer", "Null", "TransformerBlock", "build_model", "load_callable"]


class MSELossLayer(nn.Module):
    """The loss as the model's last layer: mean squared error against ``target``, set per microbatch."""

    def __init__(self) -> None:
        super().__init__()
        self.target: torch.Tensor | None = None

    def forward(self, output: torch.Tensor) -> torch.Tensor:  # noqa: D102
        assert self.target is not None, "the runtime sets the target before the loss layer runs"
        return functional.mse_loss(output, self.target)


class Null(nn.Module):
    """A layer that does (almost) nothing: times the harness's own cost per op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x * 1.0


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: x + attention(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, width: int, heads: int, ffn_multiplier: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, ffn_multiplier * width)
        self.fc2 = nn.Linear(ffn_multiplier * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        batch, tokens, width = x.shape
        head_width = width // self.heads
        qkv = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, head_width).permute(2, 0, 3, 1, 4)
        query, key, value = qkv[0], qkv[1], qkv[2]
        scores = (query @ key.transpose(-2, -1)) * (1.0 / math.sqrt(head_width))
        mixed = (scores.softmax(dim=-1) @ value).transpose(1, 2).reshape(batch, tokens, width)
        x = x + self.proj(mixed)
        out: torch.Tensor = x + self.fc2(functional.gelu(self.fc1(self.norm2(x))))
        return out


@dataclass
class ModelBundle:
    """A built model: its layers (the loss last), their names, and the shapes of data and outputs.

    Attributes:
        layers: the layers in order; the last is the MSELossLayer.
        names: a label per layer.
        input_shape: per-sample input shape.
        output_shapes: per-sample output shape of each layer (the loss: ``()``).
        dtype: element type of activations.
        spec: what it was built from.
    """

    layers: list[nn.Module]
    names: list[str]
    input_shape: tuple[int, ...]
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    dtype: torch.dtype = torch.float32
    spec: ModelSpec = field(default_factory=ModelSpec)

    @property
    def num_layers(self) -> int:
        """Layers, the loss included."""
        return len(self.layers)

    @property
    def target_shape(self) -> tuple[int, ...]:
        """Per-sample shape of the loss's target (the last real layer's output)."""
        return self.output_shapes[-2] if len(self.output_shapes) >= 2 else self.input_shape

    def microbatch(self, index: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The input and target of global microbatch ``index``, deterministic in (seed, index)."""
        generator = torch.Generator().manual_seed(self.spec.seed * 1_000_003 + index)
        inputs = torch.randn((batch, *self.input_shape), generator=generator, dtype=self.dtype)
        target = torch.randn((batch, *self.target_shape), generator=generator, dtype=self.dtype)
        return inputs, target


def load_callable(reference: str) -> nn.Sequential:
    """Call ``MODULE:CALLABLE`` or ``FILE.py:CALLABLE`` and return the nn.Sequential it builds.

    Raises:
        ConfigError: the reference is malformed, cannot be imported, or returns no nn.Sequential.
    """
    module_name, sep, attribute = reference.rpartition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError("model", reference, "must be mlp, transformer, MODULE:CALLABLE or FILE.py:CALLABLE")
    try:
        path = user_model_file(reference)
        if path is not None:
            loader_spec = importlib.util.spec_from_file_location(f"pipesim_user_{path.stem}", path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[loader_spec.name] = module
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("model", reference, f"cannot be imported: {exc}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError("model", reference, f"{attribute!r} is not a callable of {module_name}")
    built = factory()
    if not isinstance(built, nn.Sequential) or len(built) == 0:
        raise ConfigError("model", reference, f"must return a non-empty nn.Sequential, got {type(built).__name__}")
    return built


def build_model(spec: ModelSpec, microbatch_size: int) -> ModelBundle:
    """Build the model of ``spec`` with seeded weights, the MSE loss appended as its last layer.

    Raises:
        ConfigError: a user model that cannot be loaded or run on its input shape (``ModelSpec``
            has checked the sizes).
    """
    torch.manual_seed(spec.seed)
    if spec.name == "mlp":
        layers: list[nn.Module] = [nn.Linear(spec.width, spec.width)]
        # Pre-activation blocks: ReLU saves its output, which the Linear saves as its input, so a
        # block keeps exactly one activation and no tensor is kept on both sides of a stage cut.
        layers += [nn.Sequential(nn.ReLU(), nn.Linear(spec.width, spec.width)) for _ in range(spec.depth - 1)]
        names = ["linear0", *(f"block{index}" for index in range(1, spec.depth))]
        input_shape: tuple[int, ...] = (spec.width,)
    elif spec.name == "transformer":
        layers = [TransformerBlock(spec.width, spec.heads) for _ in range(spec.depth)]
        names = [f"block{index}" for index in range(spec.depth)]
        input_shape = (spec.seq_len, spec.width)
    elif spec.name == "null":
        layers = [Null() for _ in range(spec.depth)]
        names = [f"null{index}" for index in range(spec.depth)]
        input_shape = (spec.width,)
    else:  # a user model: ModelSpec has checked its name's form and that it has an input shape
        sequential = load_callable(spec.name)
        layers = list(sequential)
        names = [f"{index}:{type(layer).__name__}" for index, layer in enumerate(layers)]
        input_shape = spec.input_shape
    layers.append(MSELossLayer())
    names.append("loss")
    bundle = ModelBundle(layers=layers, names=names, input_shape=input_shape, spec=spec)
    bundle.output_shapes = _output_shapes(bundle, microbatch_size)
    return bundle


def _output_shapes(bundle: ModelBundle, microbatch_size: int) -> list[tuple[int, ...]]:
    x = torch.zeros((microbatch_size, *bundle.input_shape), dtype=bundle.dtype)
    shapes: list[tuple[int, ...]] = []
    with torch.no_grad():
        for index, layer in enumerate(bundle.layers[:-1]):
            try:
                x = layer(x)
            except Exception as exc:  # a user model that does not fit its input shape
                raise ConfigError("model", bundle.names[index],
                                  f"fails on input shape {tuple(x.shape)}: {exc}") from None
            if not isinstance(x, torch.Tensor):
                raise ConfigError("model", bundle.names[index], "must return one tensor")
            shapes.append(tuple(x.shape[1:]))
    shapes.append(())
    return shapes
