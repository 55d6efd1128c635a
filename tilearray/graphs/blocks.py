"""Pure block-edge arithmetic shared by the planner and graph builders."""

from __future__ import annotations

from collections.abc import Sequence


def group_edges(edges: Sequence[int], max_len: int) -> tuple[int, ...]:
    """Merge consecutive intervals of ``edges`` into blocks of at most ``max_len``.

    A single interval longer than ``max_len`` stays one block (units are never
    split). Returns the kept edges, first and last included.
    """
    edges = list(edges)
    if len(edges) <= 1:
        return tuple(edges)
    out = [edges[0]]
    for prev, e in zip(edges[1:-1], edges[2:], strict=True):
        if e - out[-1] > max_len:
            out.append(prev)
    out.append(edges[-1])
    return tuple(out)


def intervals(edges: Sequence[int]) -> list[tuple[int, int]]:
    return list(zip(edges[:-1], edges[1:], strict=True))


def max_interval(edges: Sequence[int]) -> int:
    return max((b - a for a, b in intervals(edges)), default=0)


def split_points(a_edges: Sequence[int], b_edges: Sequence[int], parts: int) -> tuple[int, ...]:
    """Up to ``parts`` contiguous K segments whose boundaries are edges of both lists."""
    common = sorted(set(a_edges) & set(b_edges))
    if parts <= 1 or len(common) <= 2:
        return (common[0], common[-1]) if common else ()
    n = common[-1]
    out = [common[0]]
    for p in range(1, parts):
        target = n * p / parts
        best = min(common, key=lambda e: abs(e - target))
        if best > out[-1] and best < n:
            out.append(best)
    out.append(n)
    return tuple(out)


def tree(keys: list, split_every: int, make_key, make_task, graph: dict) -> object:
    """Add a tree of combine tasks over ``keys`` with fan-in ``split_every``.

    ``make_key(level, i)`` names a combine task and ``make_task(children)``
    builds its task tuple. Returns the root key (``keys[0]`` for one key).
    """
    level = 0
    while len(keys) > 1:
        level += 1
        nxt = []
        for i in range(0, len(keys), split_every):
            children = keys[i : i + split_every]
            if len(children) == 1:
                nxt.append(children[0])
                continue
            k = make_key(level, i // split_every)
            graph[k] = make_task(children)
            nxt.append(k)
        keys = nxt
    return keys[0]
