"""Defaults in the ``tilearray.*`` namespace of :mod:`dask.config`.

Read values at call time with :func:`get`; never freeze them in default
arguments. Override with ``dask.config.set({"tilearray.x.y": ...})`` or
environment variables ``DASK_TILEARRAY__X__Y``.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes

_fn = os.path.join(os.path.dirname(__file__), "tilearray.yaml")
with open(_fn) as f:
    _defaults = yaml.safe_load(f)

dask.config.update_defaults(_defaults)


def get(key: str) -> Any:
    """Return the configured value of ``tilearray.<key>``."""
    return dask.config.get(f"tilearray.{key}")


def get_bytes(key: str) -> int:
    """Return ``tilearray.<key>`` parsed as a byte count ("2GiB" -> int)."""
    value = get(key)
    return int(value) if isinstance(value, int | float) else parse_bytes(value)
