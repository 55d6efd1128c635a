"""Pure tile and I/O-unit geometry of a 2-D tiled matrix.

A *tile* is a Zarr chunk (the inner chunk when the array is sharded). An
*I/O unit* is what one store request fetches: a shard, or a chunk when the
array is not sharded. Edges may be ragged: the last tile or unit along an
axis may be cut short by the array's shape. Nothing here does I/O.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

Range = tuple[int, int]
"""A half-open index range ``(start, stop)`` along one axis."""


def int_pair(value) -> tuple[int, int] | None:
    """``value`` as two Python ints, or None when it is not a pair of integers.

    Integers (Python or NumPy) and integral floats (``1e3``) are taken; a
    single number, a string or ``2.5`` are not (``int(2.5)`` would silently
    make a tile of 2). Callers raise their own error naming the argument."""
    try:
        items = tuple(value)
    except TypeError:
        return None
    if len(items) != 2:
        return None
    out = []
    for v in items:
        if isinstance(v, bool | str | bytes):
            return None
        try:
            out.append(operator.index(v))
            continue
        except TypeError:
            pass
        try:
            f = float(v)
        except (TypeError, ValueError):
            return None
        if not f.is_integer():
            return None
        out.append(int(f))
    return out[0], out[1]


def boundaries(n: int, step: int) -> tuple[int, ...]:
    """Return ``(0, step, 2*step, ..., n)``: the edges of ragged blocks of ``step``."""
    if step <= 0:
        raise ValueError(f"block size must be positive, got {step}")
    if n == 0:
        return (0,)
    return tuple(range(0, n, step)) + (n,)


@dataclass(frozen=True, slots=True)
class Grid:
    """Tile and I/O-unit grid of a 2-D array."""

    shape: tuple[int, int]
    """Array shape, in elements."""
    tile: tuple[int, int]
    """Chunk shape (inner chunk when sharded), in elements."""
    unit: tuple[int, int]
    """I/O unit shape (shard, or chunk when unsharded); a multiple of ``tile``."""
    within: tuple[int, int] | None = None
    """Set on a grid that reads a sharded array by its inner chunks (the
    units are the chunks, fetched by byte range through the shard's index):
    the stored shard shape. See :meth:`inner`."""
    row_slabs: int = field(default=0, compare=False)
    """Nonzero when its chunks can be decoded in row slabs without holding one
    whole (:mod:`tilearray.storage.stream`): the bytes one chunk's decode
    stream holds (zstd window + state), in bytes. Set from the array's
    metadata by :func:`~tilearray.storage.grid_of`; not geometry (not compared)."""

    def __post_init__(self) -> None:
        if len(self.shape) != 2 or len(self.tile) != 2 or len(self.unit) != 2:
            raise ValueError(f"a 2-D grid needs 2-D shape/tile/unit, got {self}")
        for t, u in zip(self.tile, self.unit, strict=True):
            if t <= 0 or u <= 0:
                raise ValueError(f"tile {self.tile} and unit {self.unit} must be positive")
            if u % t:
                raise ValueError(f"I/O unit {self.unit} is not a multiple of the tile {self.tile}")

    @classmethod
    def regular(cls, shape, tile, unit=None, row_slabs: int = 0) -> Grid:
        """Build a grid from plain sequences; ``unit`` defaults to the tile."""
        tile = tuple(int(t) for t in tile)
        unit = tile if unit is None else tuple(int(u) for u in unit)
        return cls(tuple(int(s) for s in shape), tile, unit, row_slabs=int(row_slabs))

    def inner(self) -> Grid:
        """This sharded array's grid read by inner chunks: each chunk its own
        unit, fetched by byte range (shards larger than a task holds)."""
        return Grid(self.shape, self.tile, self.tile, self.unit)

    @property
    def sharded(self) -> bool:
        return self.unit != self.tile

    @property
    def tile_grid(self) -> tuple[int, int]:
        """Number of tiles along each axis."""
        return tuple(math.ceil(s / t) for s, t in zip(self.shape, self.tile, strict=True))

    @property
    def unit_grid(self) -> tuple[int, int]:
        """Number of I/O units along each axis."""
        return tuple(math.ceil(s / u) for s, u in zip(self.shape, self.unit, strict=True))

    @property
    def n_units(self) -> int:
        return self.unit_grid[0] * self.unit_grid[1]

    def unit_edges(self, axis: int) -> tuple[int, ...]:
        """Boundaries of the I/O units along ``axis``."""
        return boundaries(self.shape[axis], self.unit[axis])

    def unit_range(self, axis: int, index: int) -> Range:
        """Element range covered by unit ``index`` along ``axis`` (clipped)."""
        u = self.unit[axis]
        return index * u, min((index + 1) * u, self.shape[axis])

    def units_touching(self, axis: int, rng: Range) -> range:
        """Indices of the units along ``axis`` that overlap ``rng``."""
        start, stop = rng
        self._check_range(axis, rng)
        if stop <= start:
            return range(0)
        u = self.unit[axis]
        return range(start // u, (stop - 1) // u + 1)

    def tiles_touching(self, axis: int, rng: Range) -> range:
        """Indices of the tiles along ``axis`` that overlap ``rng``."""
        start, stop = rng
        self._check_range(axis, rng)
        if stop <= start:
            return range(0)
        t = self.tile[axis]
        return range(start // t, (stop - 1) // t + 1)

    def expand_to_units(self, axis: int, rng: Range) -> Range:
        """Smallest unit-aligned range that covers ``rng`` (clipped to the shape)."""
        units = self.units_touching(axis, rng)
        if not units:
            return rng
        return self.unit_range(axis, units[0])[0], self.unit_range(axis, units[-1])[1]

    def is_aligned(self, axis: int, rng: Range) -> bool:
        """True when ``rng`` starts and ends on unit boundaries (or the array edge)."""
        return self.expand_to_units(axis, rng) == tuple(rng)

    def tiles_in_unit(self, i: int, j: int) -> int:
        """Number of tiles of unit ``(i, j)`` that lie inside the array."""
        (r0, r1), (c0, c1) = self.unit_range(0, i), self.unit_range(1, j)
        return math.ceil((r1 - r0) / self.tile[0]) * math.ceil((c1 - c0) / self.tile[1])

    def store_gets_per_unit(self, i: int, j: int) -> int:
        """Store requests a read of unit ``(i, j)`` makes: one, a chunk or a
        whole shard. (A ragged edge shard is not "total" to Zarr's sharding
        codec, which asks for its index and each chunk by byte range; the
        reads go through :class:`~tilearray.storage.io.WholeObjectReads`,
        which fetches the shard once and serves those ranges from it.)
        Read by inner chunks (:meth:`inner`): one ranged GET a chunk (and,
        not counted, one for the shard's index a request).
        """
        return 1

    def transpose(self) -> Grid:
        return Grid(self.shape[::-1], self.tile[::-1], self.unit[::-1],
                    None if self.within is None else self.within[::-1])

    def _check_range(self, axis: int, rng: Range) -> None:
        start, stop = rng
        if not 0 <= start <= stop <= self.shape[axis]:
            raise IndexError(
                f"range {rng} is outside axis {axis} of length {self.shape[axis]}"
            )
