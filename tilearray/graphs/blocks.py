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


class Ranges(Sequence):
    """The intervals ``[start + i*step, min(start + (i+1)*step, stop))``: a
    regular run of ranges described by three numbers, so a task's K panels
    cost the graph O(1) whatever their count (a sequence of ``(lo, hi)``)."""

    __slots__ = ("start", "stop", "step")

    def __init__(self, start: int, stop: int, step: int):
        if step <= 0 or stop < start:
            raise ValueError(f"bad ranges {start}:{stop}:{step}")
        self.start, self.stop, self.step = int(start), int(stop), int(step)

    def __len__(self) -> int:
        return -(-(self.stop - self.start) // self.step)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self)[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        lo = self.start + i * self.step
        return (lo, min(lo + self.step, self.stop))

    def __iter__(self):
        for lo in range(self.start, self.stop, self.step):
            yield (lo, min(lo + self.step, self.stop))

    def __eq__(self, other) -> bool:
        if isinstance(other, Ranges):
            return (self.start, self.stop, self.step) == (other.start, other.stop, other.step)
        return isinstance(other, tuple | list) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __reduce__(self):
        return (Ranges, (self.start, self.stop, self.step))

    def __repr__(self) -> str:
        return f"Ranges({self.start}, {self.stop}, {self.step})"

    def __dask_tokenize__(self):
        return ("Ranges", self.start, self.stop, self.step)


def compact(ranges: Sequence[tuple[int, int]]):
    """``ranges`` as :class:`Ranges` when regular (all one width, the last
    possibly shorter), else as a tuple."""
    ranges = tuple(ranges)
    if len(ranges) < 3:
        return ranges
    step = ranges[0][1] - ranges[0][0]
    if step > 0 and all(b[0] == a[1] and b[1] - b[0] == step
                        for a, b in zip(ranges[:-2], ranges[1:-1], strict=True)) \
            and ranges[-1][0] == ranges[-2][1] and 0 < ranges[-1][1] - ranges[-1][0] <= step:
        out = Ranges(ranges[0][0], ranges[-1][1], step)
        assert tuple(out) == ranges
        return out
    return ranges
