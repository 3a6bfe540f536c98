"""The seam between the reservation service and placement.

The service gathers the pool's free GPUs for a window and asks `choose_whole_gpus`
which ones to take. This is the foundation's first fit; the placement engine
(`allocations/placement/`) replaces the body of this function and nothing else.
Plain data in, plain data out: no Django here.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class FreeGpu:
    id: int
    node_id: int
    node_name: str
    index: int


class Unplaceable(Exception):
    """No set of GPUs satisfies the request; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def choose_whole_gpus(free: Sequence[FreeGpu], count: int, *, largest_node: int) -> list[int]:
    """Pick `count` GPUs from `free` (GPUs free for the whole window, in node order).

    A request that fits on one node of the pool (count <= largest_node, the most GPUs any
    node of the pool has) is placed on one node — the first that has enough free, lowest
    indexes first — because multi-GPU jobs want NVLink/PCIe locality. A larger request
    takes whole nodes, the emptiest first, to touch as few nodes as possible.
    """
    by_node: dict[int, list[FreeGpu]] = defaultdict(list)
    for gpu in free:
        by_node[gpu.node_id].append(gpu)
    total_free = len(free)
    if total_free < count:
        raise Unplaceable(
            "insufficient_capacity",
            f"{count} GPUs requested but only {total_free} are free for the whole window.",
        )
    if count <= largest_node:
        for gpus in by_node.values():
            if len(gpus) >= count:
                return [gpu.id for gpu in sorted(gpus, key=lambda g: g.index)[:count]]
        most = max(len(gpus) for gpus in by_node.values())
        raise Unplaceable(
            "fragmented",
            f"{total_free} GPUs are free in total but no node has {count} free (the most on one node is {most}).",
        )
    chosen: list[int] = []
    for gpus in sorted(by_node.values(), key=lambda g: (-len(g), g[0].node_id)):
        chosen.extend(gpu.id for gpu in sorted(gpus, key=lambda g: g.index)[: count - len(chosen)])
        if len(chosen) == count:
            break
    return chosen
