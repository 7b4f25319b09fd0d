"""Topology: devices and the links between them (pairwise, by hierarchy level, or one default)."""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from pipesim.errors import ConfigError
from pipesim.spec.validation import Bool, Float, FrozenModel, Int, build
from pipesim.spec.units import parse_bandwidth, parse_duration

TOPOLOGY_SCHEMA = "pipesim.topology/1"


class Device(FrozenModel):
    """One device (a GPU, or a CPU process in the harness).

    Attributes:
        name: label used in outputs.
        memory_bytes: memory capacity, bytes (``inf`` when unknown).
        speed: relative speed; op times are divided by it (1.0 = as profiled).
    """

    name: str
    memory_bytes: Float = Field(default=math.inf, gt=0, allow_inf_nan=True)
    speed: Float = Field(default=1.0, gt=0)


class Link(FrozenModel):
    """A point-to-point link between two devices.

    Attributes:
        src: device index of one end.
        dst: device index of the other end.
        bandwidth_bytes_per_s: bandwidth, bytes per second.
        latency_s: fixed cost of every transfer, seconds.
        bidirectional: when true (default) the link serves both directions, each at full speed.
    """

    src: Int = Field(ge=0)
    dst: Int = Field(ge=0)
    bandwidth_bytes_per_s: Float = Field(gt=0, allow_inf_nan=True)
    latency_s: Float = Field(default=0.0, ge=0)
    bidirectional: Bool = True


class Level(FrozenModel):
    """A level of a hierarchy: groups of ``group_size`` consecutive devices share this link class.

    Two devices talk over the innermost level whose group holds both (e.g. NVLink inside a
    server of 4, before the network between servers).

    Attributes:
        shared: when true, each group of the level below (each device, for the innermost
            level) reaches this level through one NIC of this bandwidth, in each direction:
            the flows leaving one group, and those entering one, share it (DES engine only).
    """

    group_size: Int = Field(ge=1)
    bandwidth_bytes_per_s: Float = Field(gt=0, allow_inf_nan=True)
    latency_s: Float = Field(default=0.0, ge=0)
    shared: Bool = False


class Topology(FrozenModel):
    """Devices and links.

    Attributes:
        schema_: ``"pipesim.topology/1"`` (``"schema"`` in JSON).
        devices: the devices, indexed from 0.
        bandwidth_bytes_per_s: bandwidth between devices no link or level covers (``inf``: free).
        latency_s: latency between devices no link or level covers.
        levels: hierarchy levels, innermost first.
        links: pairwise links; they take precedence over levels.
        shared: like ``Level.shared``, for the default network: each group of the outermost
            level (each device, without levels) reaches it through one shared NIC.
    """

    schema_: str = Field(default=TOPOLOGY_SCHEMA, alias="schema")
    devices: tuple[Device, ...] = Field(min_length=1)
    bandwidth_bytes_per_s: Float = Field(default=math.inf, gt=0, allow_inf_nan=True)
    latency_s: Float = Field(default=0.0, ge=0)
    levels: tuple[Level, ...] = ()
    links: tuple[Link, ...] = ()
    shared: Bool = False

    model_config = FrozenModel.model_config | {"populate_by_name": True}

    @model_validator(mode="after")
    def _check(self) -> Topology:
        if self.schema_ != TOPOLOGY_SCHEMA:
            raise ConfigError("schema", self.schema_, f"must be {TOPOLOGY_SCHEMA!r}")
        served: dict[tuple[int, int], int] = {}  # a directed device pair -> the link serving it
        for index, link in enumerate(self.links):
            for name, end in (("src", link.src), ("dst", link.dst)):
                if end >= len(self.devices):
                    raise ConfigError(f"links[{index}].{name}", end,
                                      f"must name a device (0 to {len(self.devices) - 1})")
            if link.src == link.dst:
                raise ConfigError(f"links[{index}].dst", link.dst, "must differ from src: a link joins two devices "
                                  "(a device sends to itself without one)")
            pairs = [(link.src, link.dst), (link.dst, link.src)] if link.bidirectional else [(link.src, link.dst)]
            for pair in pairs:
                if pair in served:
                    raise ConfigError(f"links[{index}]", f"{link.src}->{link.dst}",
                                      f"links[{served[pair]}] already joins device {pair[0]} to device {pair[1]}: "
                                      "give each pair of devices one link")
            served.update(dict.fromkeys(pairs, index))
        for index, level in enumerate(self.levels[1:], start=1):
            inner = self.levels[index - 1].group_size
            if level.group_size <= inner:
                raise ConfigError(f"levels[{index}].group_size", level.group_size,
                                  f"must be > levels[{index - 1}].group_size ({inner}): levels go from inner "
                                  "to outer, group sizes rising")
        return self

    @property
    def num_devices(self) -> int:
        """Number of devices."""
        return len(self.devices)

    def link_cost(self, src: int, dst: int) -> tuple[float, float]:
        """Return ``(latency_s, bandwidth_bytes_per_s)`` of the path from ``src`` to ``dst``."""
        for link in self.links:
            if (link.src, link.dst) == (src, dst) or (
                link.bidirectional and (link.dst, link.src) == (src, dst)
            ):
                return link.latency_s, link.bandwidth_bytes_per_s
        for level in self.levels:
            if src // level.group_size == dst // level.group_size:
                return level.latency_s, level.bandwidth_bytes_per_s
        return self.latency_s, self.bandwidth_bytes_per_s

    @property
    def has_contention(self) -> bool:
        """True when some flows share a NIC's bandwidth (a shared level or default network);
        only the DES engine models that."""
        return self.shared or any(level.shared for level in self.levels)

    def shared_nics(self, src: int, dst: int) -> tuple[str, str] | None:
        """The two NICs a transfer from ``src`` to ``dst`` crosses, when its path is shared.

        Returns:
            ``("out:L:g", "in:L:h")``: the egress NIC of the source's group g and the ingress
            NIC of the destination's group h at the level L the path uses (groups of the
            level below; devices for the innermost), or None for a dedicated path (a pairwise
            link, the same device, or a level that is not shared).
        """
        if src == dst:
            return None
        for link in self.links:
            if (link.src, link.dst) == (src, dst) or (link.bidirectional and (link.dst, link.src) == (src, dst)):
                return None
        inner = 1
        for index, level in enumerate((*self.levels, None)):
            if level is None or src // level.group_size == dst // level.group_size:
                is_shared = self.shared if level is None else level.shared
                if not is_shared:
                    return None
                return f"out:{index}:{src // inner}", f"in:{index}:{dst // inner}"
            inner = level.group_size
        return None

    def ring_bandwidth_bytes_per_s(self, first: int, last: int) -> float:
        """Bandwidth of a ring all-reduce over devices ``first..last``: its slowest link.

        The ring runs ``first -> first+1 -> ... -> last -> first``; with hierarchy levels this is
        the bandwidth of the innermost level whose group holds both ends. ``inf`` for one device.
        """
        if last <= first:
            return math.inf
        hops = [(device, device + 1) for device in range(first, last)] + [(last, first)]
        return min(self.link_cost(src, dst)[1] for src, dst in hops)

    def transfer_s(self, src: int, dst: int, num_bytes: float) -> float:
        """Seconds to move ``num_bytes`` from device ``src`` to ``dst`` (0 on the same device)."""
        return self.send_s(src, dst, num_bytes)[0]

    def send_s(self, src: int, dst: int, num_bytes: float) -> tuple[float, float]:
        """``(transfer_s, hold_s)`` of a message of ``num_bytes`` from ``src`` to ``dst``: seconds
        from leaving to arriving (latency + bytes / bandwidth), and how long its bytes hold the
        path (bytes / bandwidth: latency pipelines); both 0 on the same device."""
        if src == dst:
            return 0.0, 0.0
        latency_s, bandwidth = self.link_cost(src, dst)
        hold_s = num_bytes / bandwidth if num_bytes else 0.0
        return latency_s + hold_s, hold_s

    @classmethod
    def uniform(
        cls,
        *,
        num_devices: int,
        bandwidth: str | float = math.inf,
        latency: str | float = 0.0,
        memory_bytes: float = math.inf,
    ) -> Topology:
        """``num_devices`` identical devices, every pair joined at one bandwidth and latency.

        Args:
            bandwidth: bytes/s, or a string with a unit such as ``"25Gbit/s"``.
            latency: seconds, or a string with a unit such as ``"5us"``.
        """
        bandwidth_bytes_per_s = (
            parse_bandwidth(bandwidth) if isinstance(bandwidth, str) else float(bandwidth)
        )
        latency_s = parse_duration(latency) if isinstance(latency, str) else float(latency)
        devices = [{"name": f"device{index}", "memory_bytes": memory_bytes} for index in range(num_devices)]
        return build(
            cls,
            {
                "devices": devices,
                "bandwidth_bytes_per_s": bandwidth_bytes_per_s,
                "latency_s": latency_s,
            },
        )

    @classmethod
    def hierarchical(
        cls,
        *,
        num_devices: int,
        devices_per_server: int,
        intra_bandwidth: str | float,
        inter_bandwidth: str | float,
        latency: str | float = 0.0,
        memory_bytes: float = math.inf,
    ) -> Topology:
        """Servers of ``devices_per_server`` devices: one bandwidth inside a server, another between."""
        flat = cls.uniform(
            num_devices=num_devices, bandwidth=inter_bandwidth, latency=latency, memory_bytes=memory_bytes
        )
        intra = parse_bandwidth(intra_bandwidth) if isinstance(intra_bandwidth, str) else float(intra_bandwidth)
        level = Level(group_size=devices_per_server, bandwidth_bytes_per_s=intra, latency_s=flat.latency_s)
        return flat.model_copy(update={"levels": (level,)})
