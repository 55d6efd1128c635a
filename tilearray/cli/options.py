"""Argument types of the ``tilearray`` command line, and its wording: the
library's errors name Python arguments (``overwrite=True``, ``name=``), the
command line names its flags (``--overwrite``, ``--name``)."""

from __future__ import annotations

import argparse
import re

from tilearray._config import parse_bytes_arg


def _int_at_least(text: str, least: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what} ({least} or more), got {text!r}") \
            from None
    if v < least:
        raise argparse.ArgumentTypeError(f"must be {what} ({least} or more), got {text!r}")
    return v


def nonneg_int(text: str) -> int:
    return _int_at_least(text, 0, "a non-negative integer")


def pos_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def byte_size_arg(text: str) -> int:
    return parse_bytes_arg(text, None, argparse.ArgumentTypeError,
                           hint="use e.g. 1GiB, 512MiB, 2e9")


def dtype_arg(text: str):
    import numpy as np

    from tilearray.storage.array import SUPPORTED_KINDS

    try:
        dt = np.dtype(text)
    except TypeError:
        raise argparse.ArgumentTypeError(f"not a NumPy dtype: {text!r}") from None
    if dt.kind not in SUPPORTED_KINDS:
        raise argparse.ArgumentTypeError(
            f"unsupported dtype {text!r} ({dt}): tilearray handles bool, integer and "
            "floating-point matrices")
    return dt


def axis_arg(text: str):
    t = text.strip().lower()
    if t in ("none", "all"):
        return None
    if t in ("0", "1"):
        return int(t)
    raise argparse.ArgumentTypeError(f"axis must be 0, 1 or none, got {text!r}")


def ord_arg(text: str):
    t = text.strip().lower()
    if t in ("fro", "none", "nuc"):
        return None if t == "none" else t
    if t in ("inf", "+inf", "-inf"):
        return float("-inf") if t.startswith("-") else float("inf")
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a norm order: {text!r}") from None
    return int(v) if v.is_integer() else v


_CLI_WORDS = [
    # the library's errors name Python arguments; on the command line, name flags
    (r"to_zarr\(\.\.\., resume=True\)", "--resume"),
    (r"\boverwrite=True\b", "--overwrite"),
    (r"\bresume=True\b", "--resume"),
    (r"open it with allow_incomplete=True to inspect it", "inspect it with 'tilearray info'"),
    (r"\bname=(?=[\s)])", "--name"),
    (r"\btile=/shard=", "--tile/--shard"),
    (r"\b(tile|shard)=\((\d+), (\d+)\)", r"--\1 \2 \3"),
    (r"e\.g\. ta\.open\(path, name\)", "e.g. GROUP.zarr/NAME"),
    (r"\bmemory_per_worker[=≥ ]+[\"']?([0-9.]+ ?[KMGTP]?i?B)[\"']?", r"--memory-per-worker \1"),
    (r"\bmemory_per_worker\b", "--memory-per-worker"),
    (r"\bn_workers\b", "--workers"),
    (r"\bthreads_per_worker\b", "--threads-per-worker"),
]


def cli_words(msg: str) -> str:
    for pattern, repl in _CLI_WORDS:
        msg = re.sub(pattern, repl, msg)
    return msg


_NEGATIVE = re.compile(r"^-(\d|\.\d|inf\b|nan\b)", re.IGNORECASE)
"""A token that is a negative number or size (``-1``, ``-1GiB``, ``-.5``,
``-inf``), never one of our options (they are words)."""


def _actions(parser: argparse.ArgumentParser):
    """Every action of ``parser`` and of its subcommands."""
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            else:
                yield action


def value_options(parser: argparse.ArgumentParser) -> frozenset[str]:
    """The option strings, in ``parser`` and all its subcommands, that take
    one value (argparse itself takes a plain negative number among several:
    ``--shape -5 3``; joined, ``--shape=-5`` would be one of two)."""
    return frozenset(o for action in _actions(parser) if action.nargs in (None, "?", 1)
                     for o in action.option_strings)


def option_strings(parser: argparse.ArgumentParser) -> frozenset[str]:
    """Every option string of ``parser`` and its subcommands (``-o``, ``--quiet``)."""
    return frozenset(o for action in _actions(parser) for o in action.option_strings)


def join_option_values(argv: list[str], takes_value=frozenset({"--ord"})) -> list[str]:
    """``--memory-per-worker -1GiB`` as ``--memory-per-worker=-1GiB``: argparse
    takes a value that starts with ``-`` (other than a plain negative number)
    for an option, and says "expected one argument" instead of checking the
    value. Joined after an option of ``takes_value`` (see
    :func:`value_options`): a negative-looking value; after ``--ord``, any
    (``-inf``, ``-fro``)."""
    out: list[str] = []
    for tok in argv:
        prev = out[-1] if out else ""
        if prev in takes_value and prev.startswith("--") and tok.startswith("-") and tok != "--" \
                and (prev == "--ord" or _NEGATIVE.match(tok)):
            out[-1] = f"{prev}={tok}"
        else:
            out.append(tok)
    return out


def expression_not_option(argv: list[str], options: frozenset[str],
                          takes_value: frozenset[str]) -> list[str]:
    """``tilearray plan "-a.zarr"``: an expression that starts with ``-`` is
    taken by argparse for an unknown option, and the user read "the
    following arguments are required: EXPR". A token after ``plan`` that
    starts with one ``-`` and is no option (nor ``-o<value>``), nor the
    value of an option of ``takes_value`` before it, is the expression:
    given with a leading space, which argparse takes as a positional and
    the expression parser ignores."""
    if argv[:1] != ["plan"]:
        return argv
    out = list(argv)
    for i in range(1, len(out)):
        tok = out[i]
        if tok.startswith("-") and not tok.startswith("--") and len(tok) > 1 \
                and tok[:2] not in options and out[i - 1] not in takes_value:
            out[i] = " " + tok
    return out


def unknown_long_options(argv: list[str], options: frozenset[str]) -> list[str]:
    """The ``--words`` before ``--`` that no option is (nor abbreviates, as
    argparse allows): argparse names them only after its check of required
    arguments, so a typo in one (``--outptu``) read "the following
    arguments are required: -o/--output"."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    return [t for t in words if t.startswith("--") and len(t) > 2
            and not any(o.startswith(t.partition("=")[0]) for o in options)]
