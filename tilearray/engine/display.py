"""Rich display of TiledArrays for Jupyter (kept apart from planning)."""

from __future__ import annotations

import html

from dask.utils import format_bytes


def tiled_html(x) -> str:
    g = x.grid
    if g is None:
        return f"<pre>{html.escape(repr(x))}</pre>"
    rows = [
        ("path", html.escape(str(x.path))),
        ("shape", x.shape),
        ("dtype", x.dtype),
        ("tile (chunk)", g.tile),
        ("I/O unit (shard)" if g.sharded else "I/O unit", g.unit),
        ("tile grid", g.tile_grid),
        ("unit grid", g.unit_grid),
        ("bytes", format_bytes(x.nbytes)),
    ]
    table = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<div><b>tilearray.TiledArray</b><table>{table}</table>{_grid_svg(g)}</div>"


def _grid_svg(g, size: int = 120) -> str:
    m, n = g.shape
    if not m or not n:
        return ""
    scale = size / max(m, n)
    w, h = max(n * scale, 2), max(m * scale, 2)
    lines = []
    for axis, edges in ((0, g.unit_edges(0)), (1, g.unit_edges(1))):
        if len(edges) > 40:
            continue
        for e in edges:
            if axis == 0:
                lines.append(f"<line x1='0' y1='{e * scale:.1f}' x2='{w:.1f}' y2='{e * scale:.1f}' />")
            else:
                lines.append(f"<line x1='{e * scale:.1f}' y1='0' x2='{e * scale:.1f}' y2='{h:.1f}' />")
    return (
        f"<svg width='{w + 2:.0f}' height='{h + 2:.0f}' style='stroke:black;stroke-width:1'>"
        f"<rect width='{w:.1f}' height='{h:.1f}' style='fill:#ECB172A0' />{''.join(lines)}</svg>"
    )
