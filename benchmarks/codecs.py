"""What each codec costs: one 2048 x 2048 float64 chunk, one thread.

    python benchmarks/codecs.py [--side 2048] [--repeats 5]

For the codecs tilearray can write (``tilearray.storage.compressor``: ``lz4`` =
blosc lz4 + byte shuffle, the default; ``zstd`` at the configured level;
``none``) and for Zarr's own default (zstd level 0, what plain-Zarr inputs
carry), encodes and decodes one chunk with numcodecs -- the calls tilearray's
direct reads make -- and prints compression ratio and MB/s (decoded bytes per
second of one thread; median of ``--repeats``). Three kinds of data: standard
normal noise (incompressible mantissas), a 2-D random walk (smooth), and a
rank-8 matrix plus 1e-3 noise. crc32c, which every tilearray chunk carries,
is timed on its own.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _common import markdown_table


def _data(side: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    walk = np.cumsum(np.cumsum(rng.standard_normal((side, side)), axis=0), axis=1)
    u, v = rng.standard_normal((side, 8)), rng.standard_normal((8, side))
    return {
        "normal": rng.standard_normal((side, side)),
        "random walk": walk,
        "rank 8 + 1e-3 noise": u @ v + 1e-3 * rng.standard_normal((side, side)),
    }


def _codecs() -> dict:
    import numcodecs

    from tilearray import _config

    level = int(_config.get("storage.zstd-level"))
    return {
        "none (memcpy)": None,
        "blosc lz4 + shuffle (tilearray default)": numcodecs.Blosc(
            cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
        f"zstd {level} (tilearray storage.compressor: zstd)": numcodecs.Zstd(level=level),
        "zstd 0 (Zarr's default)": numcodecs.Zstd(level=0),
    }


def _time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)

    from numcodecs import blosc
    blosc.set_nthreads(1)  # one thread, like a decode inside a task

    data = _data(args.side)
    rows = []
    for name, codec in _codecs().items():
        ratios, enc, dec = [], [], []
        for x in data.values():
            out = np.empty_like(x)
            if codec is None:
                te = _time(lambda x=x, out=out: np.copyto(out, x), args.repeats)
                ratios.append(1.0)
                enc.append(x.nbytes / te)
                dec.append(x.nbytes / te)
                continue
            buf = codec.encode(x)
            te = _time(lambda c=codec, x=x: c.encode(x), args.repeats)
            td = _time(lambda c=codec, b=buf, o=out: c.decode(b, out=o), args.repeats)
            assert np.array_equal(out, x), name
            ratios.append(x.nbytes / len(buf))
            enc.append(x.nbytes / te)
            dec.append(x.nbytes / td)
        rows.append([name, " / ".join(f"{r:.2f}" for r in ratios),
                     " / ".join(f"{v / 1e6:,.0f}" for v in enc),
                     " / ".join(f"{v / 1e6:,.0f}" for v in dec)])

    from crc32c import crc32c
    x = data["normal"]
    tc = _time(lambda: crc32c(memoryview(x).cast("B")), args.repeats)
    print(f"### codecs: one {args.side}x{args.side} float64 chunk "
          f"({x.nbytes / 2**20:.0f} MiB), one thread, median of {args.repeats}\n")
    print("cells: " + " / ".join(data) + f"; crc32c {x.nbytes / tc / 1e9:.1f} GB/s\n")
    print(markdown_table(["codec", "ratio", "encode MB/s", "decode MB/s"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
