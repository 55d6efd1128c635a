"""The small expression language of ``tilearray plan``: ``@ + - * /``, a
``.T`` suffix, reductions (``.sum() .mean() .var() .std() .min() .max()
.prod()``, each with an optional ``axis=0|1|None``), parentheses and numbers
over array paths.

Parsed by hand into a tree (never ``eval``): ``"a.zarr.T @ a.zarr"``,
``"(a.zarr - b.zarr) * 0.5"``, ``"(a.zarr - b.zarr).sum(axis=0)"``.
``+ - * /`` must be separated from paths by spaces (paths contain ``-`` and
``/``); quote a path with spaces, ``@`` or parentheses.
"""

from __future__ import annotations

import re


class ExpressionError(ValueError):
    """A malformed ``plan`` expression (a usage error)."""


_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_OPS = ("+", "-", "*", "/")
REDUCTIONS = ("sum", "mean", "var", "std", "min", "max", "prod")
_METHOD = re.compile(r"^(.*)\.(" + "|".join(REDUCTIONS) + r")$")
_AXIS = re.compile(r"^(?:axis=)?(-?[0-9]+|None)$", re.IGNORECASE)  # none, as reduce --axis
_CALL = re.compile(r"^(.*)\.([A-Za-z_][A-Za-z_0-9]*)$")


def tokenize(text: str) -> list[tuple[str, str, int]]:
    """Split an expression into ``(kind, text, column)`` tokens.

    Kinds: ``path``, ``num``, ``op`` (``@ + - * /``), ``(``, ``)``, ``T``,
    ``method`` (a reduction name written ``.sum`` right before ``(``) and
    ``arg`` (what stands between a method's parentheses).
    ``@`` and parentheses split anywhere; ``+ - * /`` only as separate words.
    """
    out: list[tuple[str, str, int]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "()":
            out.append((c, c, i))
            i += 1
        elif c == "@":
            out.append(("op", "@", i))
            i += 1
        elif c in "'\"":
            j = text.find(c, i + 1)
            if j < 0:
                raise ExpressionError(f"unterminated quote at column {i + 1}")
            out.append(("path", text[i + 1 : j], i))
            i = j + 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "()@'\"":
                j += 1
            word = text[i:j]
            method = _METHOD.match(word) if j < n and text[j] == "(" else None
            call = _CALL.match(word) if j < n and text[j] == "(" and not method else None
            if call:  # a typo or a method the language does not have: name it
                known = " ".join(f".{r}()" for r in REDUCTIONS)
                raise ExpressionError(
                    f"unknown method .{call.group(2)}() at column {i + len(call.group(1)) + 1}; "
                    f"plan expressions know {known} (and the .T suffix)")
            if word in _OPS:
                out.append(("op", word, i))
            elif method:
                _word(out, method.group(1), i)
                k = text.find(")", j)
                if k < 0:
                    raise ExpressionError(f"unbalanced parenthesis at column {j + 1}")
                out.append(("method", method.group(2), i + len(method.group(1))))
                out.append(("arg", text[j + 1 : k].strip(), j + 1))
                j = k + 1
            else:
                _word(out, word, i)
            i = j
    return out


def _word(out: list, word: str, col: int) -> None:
    """A path or number, then one ``T`` token per ``.T`` suffix."""
    transposes = 0
    while word.endswith(".T"):
        word, transposes = word[:-2], transposes + 1
    if word:
        out.append(("num" if _NUMBER.fullmatch(word) else "path", word, col))
    out.extend(("T", ".T", col) for _ in range(transposes))


class _Parser:
    """Recursive descent with Python's precedence: ``* / @`` over ``+ -``;
    unary minus over those; ``.T`` binds tightest.

    Parsing builds a small tree of tuples and checks it without touching any
    file, so a malformed expression is a usage error even when its paths do
    not exist: ``("path", p)``, ``("num", v)``, ``("T", x)``, ``("neg", x)``,
    ``("bin", op, left, right)``, ``("call", name, axis, x)``.
    """

    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0

    def parse(self):
        if not self.tokens:
            raise ExpressionError("empty expression")
        tree = self.expr()
        if self.pos < len(self.tokens):
            kind, tok, col = self.tokens[self.pos]
            raise ExpressionError(f"unexpected {tok!r} at column {col + 1}")
        if _is_number(tree):
            raise ExpressionError("the expression has no arrays in it")
        return tree

    def peek(self):
        if self.pos < len(self.tokens):
            return self.tokens[self.pos]
        return (None, None, len(self.text))

    def take(self):
        tok = self.peek()
        self.pos += 1
        return tok

    def expr(self):
        left = self.term()
        while self.peek()[0] == "op" and self.peek()[1] in "+-":
            left = ("bin", self.take()[1], left, self.term())
        return left

    def term(self):
        left = self.unary()
        while self.peek()[0] == "op" and self.peek()[1] in "*/@":
            op = self.take()[1]
            right = self.unary()
            if op == "@" and (_is_number(left) or _is_number(right)):
                raise ExpressionError("@ needs arrays on both sides, not numbers")
            left = ("bin", op, left, right)
        return left

    def unary(self):
        kind, tok, _ = self.peek()
        if kind == "op" and tok in "+-":
            self.take()
            value = self.unary()
            return ("neg", value) if tok == "-" else value
        return self.postfix()

    def postfix(self):
        value = self.atom()
        while self.peek()[0] in ("T", "method"):
            kind, name, col = self.take()
            if kind == "T":
                if _is_number(value):
                    raise ExpressionError("cannot transpose a number (.T)")
                value = ("T", value)
                continue
            if _is_number(value):
                raise ExpressionError(f"cannot reduce a number (.{name}() at column {col + 1})")
            _, arg, acol = self.take()
            axis = None
            if arg:
                m = _AXIS.match(arg.replace(" ", ""))
                if not m:
                    raise ExpressionError(
                        f".{name}() takes axis=0, axis=1 or axis=None, got {arg!r} at column "
                        f"{acol + 1}")
                axis = None if m.group(1).lower() == "none" else int(m.group(1))
            value = ("call", name, axis, value)
        return value

    def atom(self):
        kind, tok, col = self.take()
        if kind == "(":
            value = self.expr()
            if self.take()[0] != ")":
                raise ExpressionError(f"unbalanced parenthesis at column {col + 1}")
            return value
        if kind == "num":
            return ("num", int(tok) if re.fullmatch(r"[+-]?[0-9]+", tok) else float(tok))
        if kind == "path":
            return ("path", tok)
        if kind is None:
            raise ExpressionError("expression ends early: expected a path, number or '('")
        raise ExpressionError(f"expected a path, number or '(' at column {col + 1}, got {tok!r}")


def _is_number(tree) -> bool:
    if tree[0] == "num":
        return True
    if tree[0] == "path":
        return False
    if tree[0] in ("T", "neg"):
        return _is_number(tree[1])
    if tree[0] == "call":
        return _is_number(tree[3])
    return _is_number(tree[2]) and _is_number(tree[3])


def _evaluate(tree, opener):
    kind = tree[0]
    if kind == "path":
        return opener(tree[1])
    if kind == "num":
        return tree[1]
    if kind == "T":
        return _evaluate(tree[1], opener).T
    if kind == "neg":
        return -_evaluate(tree[1], opener)
    if kind == "call":
        return getattr(_evaluate(tree[3], opener), tree[1])(axis=tree[2])
    op, left, right = tree[1], _evaluate(tree[2], opener), _evaluate(tree[3], opener)
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if op == "/":
        if isinstance(right, int | float) and isinstance(left, int | float) and not right:
            raise ExpressionError("division by zero")
        return left / right
    return left @ right


def parse_expression(text: str, opener):
    """Build the lazy TiledArray for a ``plan`` expression.

    Raises :class:`ExpressionError` for malformed text before opening
    anything; then opens each distinct path once with ``opener(path)``.
    """
    tree = _Parser(text).parse()
    cache: dict = {}

    def once(path):
        if path not in cache:
            cache[path] = opener(path)
        return cache[path]

    return _evaluate(tree, once)
