"""Defaults in the ``tilearray.*`` namespace of :mod:`dask.config`.

Read values at call time with :func:`get`; never freeze them in default
arguments. Override with ``dask.config.set({"tilearray.x.y": ...})`` or
environment variables ``DASK_TILEARRAY__X__Y``. Every value read is checked
against ``tilearray-schema.yaml``; a bad one is a :class:`ConfigError`
naming the key, the value and what the key takes.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes

from .errors import TilearrayError, type_error_of

_here = os.path.dirname(__file__)
_fn = os.path.join(_here, "tilearray.yaml")
with open(_fn) as f:
    _defaults = yaml.safe_load(f)
with open(os.path.join(_here, "tilearray-schema.yaml")) as f:
    _schema = yaml.safe_load(f)

dask.config.update_defaults(_defaults)


class ConfigError(TilearrayError, ValueError):
    """A ``tilearray.*`` configuration value outside what its key takes."""


def get(key: str) -> Any:
    """Return the configured value of ``tilearray.<key>``, checked against the schema.

    Raises
    ------
    ConfigError
        The value does not fit the key's type or range (the message names
        the key, the value and how to set it).
    """
    return _check(key, dask.config.get(f"tilearray.{key}"))


def get_bytes(key: str) -> int:
    """Return ``tilearray.<key>`` parsed as a byte count ("2GiB" -> int)."""
    return parse_bytes_arg(get(key), f"tilearray.{key}", ConfigError, minimum=0)


BYTES_HINT = "give bytes as a positive integer or a string such as '2GiB' or '512MiB'"


def parse_bytes_arg(value, argument: str | None = "memory_per_worker", error=ValueError, *,
                    minimum: int | None = 1, hint: str = BYTES_HINT) -> int:
    """The one byte parser of tilearray: an int, a whole float or a string
    such as ``"2GiB"`` / ``"1e9"`` (:func:`dask.utils.parse_bytes`) -> bytes.

    Refuses (raising ``error``; for a bool or another type its TypeError twin,
    :func:`~tilearray.errors.type_error_of`) a string that is not a byte
    size, a fractional or non-finite number, and a count below ``minimum``
    (None: no bound). The message names ``argument`` and the
    value, ``"memory_per_worker='lots' is not a byte size: <hint>"``; with
    ``argument=None`` it is worded for an argparse option, whose flag
    argparse prefixes: ``"not a byte size: 'lots' (<hint>)"``.
    """
    n, why = None, None
    if isinstance(value, bool) or not isinstance(value, str | numbers.Real):
        why, error = "is not a byte size", type_error_of(error)
    elif isinstance(value, str):
        try:
            n = int(parse_bytes(value))
        except (ValueError, TypeError):
            why = "is not a byte size"
    elif not math.isfinite(value) or value != int(value):
        why = "is not a whole number of bytes"
    else:
        n = int(value)
    if why is None and minimum is not None and n < minimum:
        why = {1: "must be positive", 0: "must not be negative"}.get(minimum,
                                                                      f"must be >= {minimum}")
    if why is None:
        return n
    if argument is not None:
        raise error(f"{argument}={value!r} {why}: {hint}")
    if why.startswith("is "):
        raise error(f"{why[3:]}: {value!r} ({hint})")
    raise error(f"{why}, got {value!r} ({hint})")


def positive_int_arg(value, argument: str, error=ValueError) -> int:
    """``value`` as an int of 1 or more; else ``error`` (its TypeError twin
    for a bool, a float or another type) naming ``argument`` and the value."""
    msg = f"{argument}={value!r} must be a positive integer (1 or more)"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise type_error_of(error)(msg)
    if value < 1:
        raise error(msg)
    return int(value)


def _key_schema(key: str) -> dict | None:
    node = _schema["properties"]["tilearray"]
    for part in key.split("."):
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return None
    return node


def _resolve(schema: dict) -> dict:
    ref = schema.get("$ref")
    if ref:
        node = _schema
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        return {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _problem(value, schema: dict) -> tuple[str | None, Any]:
    """(what is wrong or None, the value coerced: numeric strings of numeric keys)."""
    kind = _resolve({"$ref": schema["$ref"]}) if "$ref" in schema else schema
    schema = _resolve(schema)
    if "oneOf" in schema:
        for option in schema["oneOf"]:
            why, v = _problem(value, option)
            if why is None:
                if option.get("pattern") and isinstance(v, str):  # a byte string: must parse
                    try:
                        if parse_bytes_arg(v, "", ValueError, minimum=None) < 0:
                            return "must not be negative", value
                    except ValueError:
                        return "is not a byte size such as '2GiB'", value
                return None, v
        desc = kind.get("description", "one of the allowed values").rstrip(".")
        return f"must be {desc[:1].lower()}{desc[1:]}", value
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    if types:
        v, ok = value, False
        for t in types:
            if t == "null" and value is None or t == "string" and isinstance(value, str):
                ok = True
            elif t == "boolean":
                words = {"true": True, "false": False}
                if isinstance(value, bool):
                    ok = True
                elif isinstance(value, str) and value.lower() in words:
                    v, ok = words[value.lower()], True
            elif t in ("integer", "number") and not isinstance(value, bool):
                if isinstance(value, str):
                    try:
                        cand = int(value) if t == "integer" else float(value)
                    except ValueError:
                        continue
                else:
                    cand = value
                if t == "integer" and isinstance(cand, float) and cand.is_integer():
                    cand = int(cand)
                if (t == "integer" and isinstance(cand, int)) or (
                        t == "number" and isinstance(cand, int | float) and math.isfinite(cand)):
                    v, ok = cand, True
            if ok:
                break
        if not ok:
            names = {"integer": "an integer", "number": "a number", "string": "a string",
                     "null": "null", "boolean": "true or false"}
            return "must be " + " or ".join(names.get(t, t) for t in types), value
        value = v
    if "enum" in schema and value not in schema["enum"]:
        return "must be one of " + ", ".join(map(str, schema["enum"])), value
    if isinstance(value, int | float) and not isinstance(value, bool):
        for bound, ok, text in (("minimum", lambda b: value >= b, ">="),
                                ("maximum", lambda b: value <= b, "<="),
                                ("exclusiveMinimum", lambda b: value > b, ">"),
                                ("exclusiveMaximum", lambda b: value < b, "<")):
            if bound in schema and not ok(schema[bound]):
                return f"must be {text} {schema[bound]}", value
    if isinstance(value, str) and schema.get("pattern") and not re.match(schema["pattern"], value):
        return "does not look like a byte size such as '2GiB'", value
    return None, value


def _check(key: str, value: Any) -> Any:
    schema = _key_schema(key)
    if schema is None or isinstance(value, dict):
        return value
    why, value_ok = _problem(value, schema)
    if why is None:
        return value_ok
    env = "DASK_TILEARRAY__" + key.upper().replace(".", "__").replace("-", "_")
    what = _resolve(schema).get("description", "")
    raise ConfigError(
        f"config tilearray.{key}={value!r} {why}"
        + (f" ({what.rstrip('.')})" if what else "")
        + f"; set it with dask.config.set({{'tilearray.{key}': ...}}) or the environment "
        f"variable {env}"
    )


def check_all() -> None:
    """Check every ``tilearray.*`` key the schema describes (an Engine does,
    before it starts a cluster), raising :class:`ConfigError` for the first bad one."""

    def walk(node: dict, prefix: str):
        for name, sub in (node.get("properties") or {}).items():
            key = f"{prefix}{name}"
            if sub.get("type") == "object" and "properties" in sub:
                yield from walk(sub, key + ".")
            else:
                yield key

    for key in walk(_schema["properties"]["tilearray"], ""):
        get(key)


class SharedSetting:
    """A process-wide setting that nested and concurrent users share: the
    first to enter applies it (``apply()`` returns what undoes it), the last
    to leave restores it with ``restore(saved)``. A plain set-and-restore
    block per user could restore the old value while another thread still
    relies on the new one. Use as ``with setting(): ...``."""

    def __init__(self, apply: Callable[[], Any], restore: Callable[[Any], None]):
        self._apply, self._restore = apply, restore
        self._lock = threading.Lock()
        self._users, self._saved = 0, None

    @contextmanager
    def __call__(self):
        with self._lock:
            if self._users == 0:
                self._saved = self._apply()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._restore(self._saved)
                    self._saved = None
