"""Profile: measured per-layer times and sizes of one model at one microbatch size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import Field, model_validator

from pipesim.errors import ConfigError
from pipesim.spec.validation import Bool, Float, FrozenModel, Int

PROFILE_SCHEMA = "pipesim.profile/1"


class Layer(FrozenModel):
    """One layer of a model, as measured for one microbatch.

    Attributes:
        name: the layer's label (free text).
        forward_s: forward time of one microbatch, seconds.
        backward_s: full backward time, seconds.
        backward_input_s: optional backward-for-inputs part (split backward), seconds.
        backward_weight_s: optional backward-for-weights part, seconds.
        activation_bytes: bytes of the output sent to the next layer.
        stash_bytes: bytes kept for this layer's backward; defaults to ``activation_bytes``.
        weight_stash_bytes: with split backward, the part of the stash the weight gradient (W)
            still needs once the input gradient (I) has run: I frees the rest, W frees this.
            Defaults to the whole stash for a layer with weights and to 0 for one without
            (it has no weight gradient). The zero-bubble paper's Table 1 puts a transformer
            layer's share at 32bsh of 34bsh + 5as^2b bytes.
        selective_recompute: whether selective recomputation drops this layer's stash and
            re-runs its forward during the backward. Defaults to true for layers without
            weights (activations, dropout, pooling, softmax: cheap to recompute, costly to
            keep) and false for layers with weights.
        recomputed_bytes: bytes this layer's backward re-creates by re-running part of its own
            forward, held while that backward runs (recomputation inside the layer, as a profile
            built with recomputation has it: ``transformer_profile(recompute=...)``); 0 if unset.
        param_bytes: bytes of the layer's weights (what one GPU keeps of them: with ZeRO-3 its shard).
        gradient_bytes: optional bytes of the layer's gradient buffer on one GPU; unset means
            ``param_bytes`` (ZeRO-2 and 3 shard it over the data-parallel group). Given on every
            layer or on none.
        optimizer_bytes: optional bytes of the layer's optimizer state on one GPU; unset means the
            plan's ``optimizer_state_multiplier`` x ``param_bytes`` (a profile built with ZeRO-2 or
            3, or with experts sharded differently from the rest, gives it). Given on every layer
            or on none.
        gathered_bytes: optional bytes of the layer's whole weights while it computes, gathered
            from their shards (ZeRO-3 / FSDP); a stage holds the two largest of its layers' at
            once (the layer computing and the one prefetched). 0 if unset.
        update_s: optional time of the optimizer step on this layer's weights, seconds (0 if unset).
        forward_std_s: optional spread of the forward time (standard deviation), seconds.
        backward_std_s: optional spread of the backward time, seconds.
        gradient_allreduce_s: optional all-reduce of this layer's gradients across data-parallel
            pipelines that overlaps the stage's last backward (``data_parallel_profile(...,
            overlap=True)``): it starts once the layer's gradient is ready and the NIC is free,
            and only what outlasts the backward adds to the stage's update, seconds.
        param_gather_s: optional all-gather of this layer's updated weights from their data-parallel
            shards (ZeRO-1's distributed optimizer, overlapped): it runs after the optimizer step, in
            layer order, and the layer's next forward waits for it; only what it holds back the
            stage's first forward adds to the stage's update, seconds.
        inputs: optional indices of the earlier layers whose outputs this layer reads, for a
            model that is a DAG (PipeDream's graph.txt); unset means the layer before it. Only
            ``pipesim plan --cost-model pipedream`` reads it, to cut at the DAG's antichains.
    """

    name: str
    forward_s: Float = Field(ge=0)
    backward_s: Float = Field(ge=0)
    backward_input_s: Float | None = Field(default=None, ge=0)
    backward_weight_s: Float | None = Field(default=None, ge=0)
    activation_bytes: Float = Field(ge=0)
    stash_bytes: Float | None = Field(default=None, ge=0)
    weight_stash_bytes: Float | None = Field(default=None, ge=0)
    selective_recompute: Bool | None = None
    recomputed_bytes: Float | None = Field(default=None, ge=0)
    param_bytes: Float = Field(ge=0)
    gradient_bytes: Float | None = Field(default=None, ge=0)
    optimizer_bytes: Float | None = Field(default=None, ge=0)
    gathered_bytes: Float | None = Field(default=None, ge=0)
    update_s: Float | None = Field(default=None, ge=0)
    forward_std_s: Float | None = Field(default=None, ge=0)
    backward_std_s: Float | None = Field(default=None, ge=0)
    gradient_allreduce_s: Float | None = Field(default=None, ge=0)
    param_gather_s: Float | None = Field(default=None, ge=0)
    inputs: tuple[Int, ...] | None = None

    @model_validator(mode="after")
    def _split_backward_pairs(self) -> Layer:
        has_input = self.backward_input_s is not None
        has_weight = self.backward_weight_s is not None
        if has_input != has_weight:
            given, other = ("backward_input_s", "backward_weight_s") if has_input else \
                ("backward_weight_s", "backward_input_s")
            raise ConfigError(given, getattr(self, given), f"must be given together with {other}")
        if self.weight_stash_bytes is not None and self.weight_stash_bytes > self.stashed_bytes:
            raise ConfigError("weight_stash_bytes", self.weight_stash_bytes, f"must be <= the stash "
                              f"({self.stashed_bytes}): W keeps part of what the layer stashed")
        return self

    @property
    def stashed_bytes(self) -> float:
        """Bytes kept for the backward: ``stash_bytes`` or, if unset, ``activation_bytes``."""
        return self.activation_bytes if self.stash_bytes is None else self.stash_bytes

    @property
    def weight_stashed_bytes(self) -> float:
        """Bytes W keeps after I: ``weight_stash_bytes`` or its default (see the class)."""
        if self.weight_stash_bytes is not None:
            return self.weight_stash_bytes
        return self.stashed_bytes if self.param_bytes > 0 else 0.0

    @property
    def is_selectively_recomputed(self) -> bool:
        """Whether selective recomputation drops this layer's stash (see the class)."""
        return self.param_bytes == 0 if self.selective_recompute is None else self.selective_recompute


@dataclass(frozen=True)
class LayerColumns:
    """The layers' numbers that stage costs add up, one list per number in the layers' order
    (``Profile.columns``): a stage's sum is the sum of a slice, the same additions in the same
    order as a sum over its layers. Unset optional times count 0; ``*_var`` are the squared stds."""

    forward_s: list[float]
    backward_s: list[float]
    backward_input_s: list[float]
    backward_weight_s: list[float]
    update_s: list[float]
    forward_var: list[float]
    backward_var: list[float]
    gradient_allreduce_s: list[float]
    param_gather_s: list[float]
    activation_bytes: list[float]
    param_bytes: list[float]
    stashed_bytes: list[float]
    weight_stashed_bytes: list[float]
    recomputed_bytes: list[float]
    selective: list[bool]
    gradient_bytes: list[float] | None = None
    optimizer_bytes: list[float] | None = None
    gathered_bytes: list[float] | None = None


class Profile(FrozenModel):
    """A model's layers in execution order, with where and how they were measured.

    Attributes:
        schema_: format tag, ``"pipesim.profile/1"`` (``"schema"`` in JSON).
        name: model name.
        layers: the layers in order; stage boundaries cut this list.
        microbatch_size: samples per microbatch the times were measured at.
        dtype: element type of the measurement, e.g. ``"float32"``.
        device: what it ran on, e.g. ``"V100 (assumed)"``.
        source: provenance in one line.
        forward_overhead_s, backward_overhead_s, update_overhead_s: optional fixed cost of one F,
            B or U op of a stage on top of its layers' times (the runtime's dispatch and
            bookkeeping and the handling of the op's messages), seconds; counted once per op.
        input_bytes: optional bytes of one microbatch's model input (token ids, images), which
            stage 0 keeps from a microbatch's forward to the end of its backward, whatever its
            recomputation (a profile whose first layers are the input, like PipeDream's
            ``Input`` node, counts it there instead).
        loss_bytes: optional bytes the last stage keeps per microbatch for the loss (its logits,
            in fp32 for a language model's cross-entropy), outside any recomputation.
    """

    schema_: str = Field(default=PROFILE_SCHEMA, alias="schema")
    name: str = "model"
    layers: tuple[Layer, ...] = Field(min_length=1)
    microbatch_size: Int = Field(default=1, ge=1)
    dtype: str = "float32"
    device: str = "unknown"
    source: str = ""
    forward_overhead_s: Float | None = Field(default=None, ge=0)
    backward_overhead_s: Float | None = Field(default=None, ge=0)
    update_overhead_s: Float | None = Field(default=None, ge=0)
    input_bytes: Float | None = Field(default=None, ge=0)
    loss_bytes: Float | None = Field(default=None, ge=0)

    model_config = FrozenModel.model_config | {"populate_by_name": True}

    @model_validator(mode="after")
    def _known_schema(self) -> Profile:
        if self.schema_ != PROFILE_SCHEMA:
            raise ConfigError("schema", self.schema_, f"must be {PROFILE_SCHEMA!r}")
        for index, layer in enumerate(self.layers):
            for source in layer.inputs or ():
                if not 0 <= source < index:
                    earlier = f"0 to {index - 1}" if index else "none before layer 0"
                    raise ConfigError(f"layers[{index}].inputs", source,
                                      f"a layer reads only earlier layers ({earlier})")
        for field in ("gradient_bytes", "optimizer_bytes"):
            given = [getattr(layer, field) is not None for layer in self.layers]
            if any(given) and not all(given):
                index = given.index(False)
                raise ConfigError(f"layers[{index}].{field}", None, "must be given on every layer or on none")
        return self

    def __repr__(self) -> str:
        # The default (every field of every layer) runs to tens of kilobytes for a real model.
        forward = sum(layer.forward_s for layer in self.layers)
        backward = sum(layer.backward_s for layer in self.layers)
        params = sum(layer.param_bytes for layer in self.layers)
        return (f"<Profile {self.name!r}: {self.num_layers} layers, microbatch {self.microbatch_size}, forward "
                f"{forward * 1e3:.4g} ms + backward {backward * 1e3:.4g} ms, parameters {params / 1e9:.4g} GB, "
                f"{self.dtype} on {self.device!r}>")

    __str__ = __repr__

    @property
    def is_dag(self) -> bool:
        """True when some layer names its inputs (a DAG profile rather than a chain)."""
        return any(layer.inputs is not None for layer in self.layers)

    @property
    def num_layers(self) -> int:
        """Number of layers."""
        return len(self.layers)

    @property
    def has_split_backward(self) -> bool:
        """True when every layer carries ``backward_input_s`` and ``backward_weight_s``."""
        return all(layer.backward_input_s is not None for layer in self.layers)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Profile:
        """``BaseModel.model_copy`` without the cached ``columns``, which an update of the layers
        would leave stale (pydantic copies an instance's ``__dict__``, cached values included)."""
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("columns", None)
        return copied

    @cached_property
    def columns(self) -> LayerColumns:
        """The layers' numbers by column (``LayerColumns``), made once per profile."""
        layers = self.layers
        return LayerColumns(
            forward_s=[layer.forward_s for layer in layers],
            backward_s=[layer.backward_s for layer in layers],
            backward_input_s=[layer.backward_input_s or 0.0 for layer in layers],
            backward_weight_s=[layer.backward_weight_s or 0.0 for layer in layers],
            update_s=[layer.update_s or 0.0 for layer in layers],
            forward_var=[(layer.forward_std_s or 0.0) ** 2 for layer in layers],
            backward_var=[(layer.backward_std_s or 0.0) ** 2 for layer in layers],
            gradient_allreduce_s=[layer.gradient_allreduce_s or 0.0 for layer in layers],
            param_gather_s=[layer.param_gather_s or 0.0 for layer in layers],
            activation_bytes=[layer.activation_bytes for layer in layers],
            param_bytes=[layer.param_bytes for layer in layers],
            stashed_bytes=[layer.stashed_bytes for layer in layers],
            weight_stashed_bytes=[layer.weight_stashed_bytes for layer in layers],
            recomputed_bytes=[layer.recomputed_bytes or 0.0 for layer in layers],
            selective=[layer.is_selectively_recomputed for layer in layers],
            gradient_bytes=None if layers[0].gradient_bytes is None
            else [layer.gradient_bytes or 0.0 for layer in layers],
            optimizer_bytes=None if layers[0].optimizer_bytes is None
            else [layer.optimizer_bytes or 0.0 for layer in layers],
            gathered_bytes=None if all(layer.gathered_bytes is None for layer in layers)
            else [layer.gathered_bytes or 0.0 for layer in layers],
        )


# The most layers a synthetic profile may have: real models have at most thousands, and each
# layer costs the simulation time and memory.
MAX_UNIFORM_LAYERS = 100_000


def uniform_profile(
    *,
    num_layers: int,
    forward_s: float,
    backward_s: float,
    activation_bytes: float = 0.0,
    param_bytes: float = 0.0,
    stash_bytes: float | None = None,
    microbatch_size: int = 1,
    name: str = "uniform",
    backward_input_s: float | None = None,
    backward_weight_s: float | None = None,
    weight_stash_bytes: float | None = None,
    forward_std_s: float | None = None,
    backward_std_s: float | None = None,
    input_bytes: float | None = None,
    loss_bytes: float | None = None,
) -> Profile:
    """A synthetic profile of ``num_layers`` identical layers, for what-if work and closed forms.

    ``backward_input_s`` and ``backward_weight_s`` (given together) split the backward into I
    and W; the std fields give each layer's measured spread for stochastic runs; ``input_bytes``
    and ``loss_bytes`` are the model input stage 0 keeps and the loss buffer the last stage keeps
    per microbatch (see Profile).

    Raises:
        ConfigError: a negative time or size, or ``num_layers`` outside 1..``MAX_UNIFORM_LAYERS``.
    """
    from pipesim.spec.validation import build

    layer = {
        "name": "layer",
        "forward_s": forward_s,
        "backward_s": backward_s,
        "activation_bytes": activation_bytes,
        "param_bytes": param_bytes,
        "stash_bytes": stash_bytes,
        "backward_input_s": backward_input_s,
        "backward_weight_s": backward_weight_s,
        "weight_stash_bytes": weight_stash_bytes,
        "forward_std_s": forward_std_s,
        "backward_std_s": backward_std_s,
    }
    if not 1 <= num_layers <= MAX_UNIFORM_LAYERS:
        from pipesim.errors import ConfigError

        raise ConfigError("num_layers", num_layers, f"must be from 1 to {MAX_UNIFORM_LAYERS:,}")
    layers = [dict(layer, name=f"layer{index}") for index in range(num_layers)]
    return build(
        Profile,
        {
            "name": name,
            "layers": layers,
            "microbatch_size": microbatch_size,
            "device": "synthetic",
            "source": "pipesim.uniform_profile",
            "input_bytes": input_bytes,
            "loss_bytes": loss_bytes,
        },
    )
