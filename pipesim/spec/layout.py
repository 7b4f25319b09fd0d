"""Where a training job's GPUs sit: TP x CP x DP x PP degrees, their order, and the groups each collective runs on.

Megatron-Core numbers GPUs tensor-parallel fastest, then context-parallel, then data-parallel,
then pipeline (``tp-in-node``): a TP group is neighbours, a CP group TP apart, the data-parallel
group TP x CP apart, a pipeline's stages TP x CP x DP apart. ``pp-in-node`` puts the pipeline
fastest instead (a pipeline's stages share a node), then TP, CP and DP. Dense weights are
replicated over DP x CP (both see other tokens of the same weights), so their gradients reduce
and ZeRO shards over that group; expert parallelism (EP) splits the routed experts over EP of
its ranks (consecutive, as Megatron-Core forms expert groups over the CP x DP ranks with expert
TP = TP), and the experts' own data-parallel group is the DP x CP / EP ranks holding the same
experts, EP apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipesim.errors import ConfigError
from pipesim.spec.collectives import Group

PLACEMENTS = ("tp-in-node", "pp-in-node")


@dataclass(frozen=True)
class Parallelism:
    """Degrees and placement of a TP x CP x PP x DP job (module docstring); EP divides DP x CP."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    placement: str = "tp-in-node"
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for field in ("tp", "pp", "dp", "cp", "ep"):
            if getattr(self, field) < 1:
                raise ConfigError(field, getattr(self, field), "must be >= 1")
        if self.placement not in PLACEMENTS:
            raise ConfigError("placement", self.placement, f"must be one of {', '.join(PLACEMENTS)}")
        if (self.dp * self.cp) % self.ep:
            raise ConfigError("ep", self.ep, f"must divide dp x cp ({self.dp} x {self.cp} = {self.dp * self.cp}): "
                              "expert parallelism splits the data-parallel ranks")

    @property
    def num_gpus(self) -> int:
        """TP x CP x PP x DP."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def strides(self) -> tuple[int, int, int]:
        """GPUs between neighbours of (TP, PP, DP)."""
        if self.placement == "tp-in-node":
            return 1, self.tp * self.cp * self.dp, self.tp * self.cp
        return self.pp, 1, self.pp * self.tp * self.cp

    @property
    def cp_stride(self) -> int:
        """GPUs between neighbouring context-parallel ranks (and the start of the DP x CP block)."""
        return self.tp if self.placement == "tp-in-node" else self.pp * self.tp

    @property
    def data_group(self) -> Group:
        """The ranks holding the same dense weights: DP x CP of them, CP's stride apart."""
        return Group(self.dp * self.cp, self.cp_stride)

    @property
    def expert_group(self) -> Group:
        """An expert-parallel group: EP consecutive ranks of the DP x CP block."""
        return Group(self.ep, self.cp_stride)

    @property
    def expert_data_group(self) -> Group:
        """The ranks holding the same experts: DP x CP / EP of them, EP groups apart."""
        return Group(self.dp * self.cp // self.ep, self.cp_stride * self.ep)
