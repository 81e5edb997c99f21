"""Collective times from nccl-tests' bus-bandwidth definitions.

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.comm`.
"""

from __future__ import annotations

from collections.abc import Iterable

from tunecost.errors import TunecostError


def all_reduce_bus_factor(num_ranks: int) -> float:
    return 2.0 * (num_ranks - 1) / num_ranks


def all_gather_bus_factor(num_ranks: int) -> float:
    return (num_ranks - 1) / num_ranks


reduce_scatter_bus_factor = all_gather_bus_factor
all_to_all_bus_factor = all_gather_bus_factor


def broadcast_bus_factor(num_ranks: int) -> float:
    return 1.0


def send_bus_factor(num_ranks: int) -> float:
    """nccl-tests' sendrecv: bus bandwidth = algorithm bandwidth (one send between two ranks)."""
    return 1.0


BUS_FACTORS = {
    "all_reduce": all_reduce_bus_factor,
    "all_gather": all_gather_bus_factor,
    "reduce_scatter": reduce_scatter_bus_factor,
    "all_to_all": all_to_all_bus_factor,
    "broadcast": broadcast_bus_factor,
    "send": send_bus_factor,
}


def collective_seconds(
    op: str, nbytes: float, num_ranks: int, bus_bandwidth_bytes_per_s: float, latency_seconds: float = 0.0
) -> float:
    """Time of one collective `op` over `num_ranks` ranks moving a buffer of `nbytes` (see docs/multi-gpu.md).
    One rank communicates with nobody: 0 seconds."""
    factor = BUS_FACTORS.get(op)
    if factor is None:
        raise TunecostError(f"unknown collective {op!r}; known: {', '.join(BUS_FACTORS)}")
    if num_ranks < 1 or bus_bandwidth_bytes_per_s <= 0 or nbytes < 0:
        raise TunecostError("a collective needs at least 1 rank, a positive bandwidth and non-negative bytes")
    if num_ranks == 1:
        return 0.0
    return nbytes * factor(num_ranks) / bus_bandwidth_bytes_per_s + latency_seconds


def all_reduce_seconds(nbytes: float, num_ranks: int, bus_bandwidth_bytes_per_s: float, latency_seconds=0.0) -> float:
    return collective_seconds("all_reduce", nbytes, num_ranks, bus_bandwidth_bytes_per_s, latency_seconds)


def all_gather_seconds(nbytes: float, num_ranks: int, bus_bandwidth_bytes_per_s: float, latency_seconds=0.0) -> float:
    return collective_seconds("all_gather", nbytes, num_ranks, bus_bandwidth_bytes_per_s, latency_seconds)


def reduce_scatter_seconds(
    nbytes: float, num_ranks: int, bus_bandwidth_bytes_per_s: float, latency_seconds=0.0
) -> float:
    return collective_seconds("reduce_scatter", nbytes, num_ranks, bus_bandwidth_bytes_per_s, latency_seconds)


def all_to_all_seconds(nbytes: float, num_ranks: int, bus_bandwidth_bytes_per_s: float, latency_seconds=0.0) -> float:
    return collective_seconds("all_to_all", nbytes, num_ranks, bus_bandwidth_bytes_per_s, latency_seconds)


def inter_node_bus_bandwidth_bytes_per_s(nic_bus_bandwidth_bytes_per_s: float, nics_per_node: int) -> float:
    """A node's bus bandwidth to other nodes: NCCL spreads its rings over the node's NICs."""
    if nics_per_node < 1:
        raise TunecostError(f"NICs per node must be at least 1, got {nics_per_node}")
    return nic_bus_bandwidth_bytes_per_s * nics_per_node


def collectives_seconds(collectives: Iterable, bus_bandwidth_bytes_per_s: float, latency_seconds: float = 0.0):
    """Per-phase total time of recorded collectives (objects with op, nbytes, group_size, phase): phase -> s."""
    out: dict[str, float] = {}
    for c in collectives:
        t = collective_seconds(c.op, c.nbytes, c.group_size, bus_bandwidth_bytes_per_s, latency_seconds)
        out[c.phase] = out.get(c.phase, 0.0) + t
    return out
