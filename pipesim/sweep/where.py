"""The ``where:`` filter of a sweep: a small, safe expression language over a point's fields."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pipesim.errors import ConfigError

Evaluator = Callable[[Mapping[str, Any]], Any]

# Bounds on every intermediate value, so that no expression can exhaust memory or time:
# ``'a' * 999999999`` or ``[stages] * 10**8`` is refused before it is built.
MAX_ITEMS = 10_000
MAX_INT_BITS = 256
# Nesting of the expression tree (``not not ...``, ``- - ...``, ``1 + 1 + ...``): compiling and
# evaluating recurse once per level, so a deeper tree would exhaust the stack.
MAX_DEPTH = 100
LIMITS = (f"strings and lists up to {MAX_ITEMS:,} items (nested lists counted through), "
          f"integers up to {MAX_INT_BITS} bits")


class _TooLarge(Exception):
    """An operation would build a value over the bounds."""


def _size(value: Any) -> int:
    """Characters of a string, or items of a list counted through its nested lists (a list of 100
    lists of 100 is 10,100): every value that exists is within MAX_ITEMS, so this is cheap."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, tuple):
        return len(value) + sum(_size(item) for item in value)
    return 0


def _bounded(value: Any) -> Any:
    if _size(value) > MAX_ITEMS or (isinstance(value, int) and value.bit_length() > MAX_INT_BITS):
        raise _TooLarge
    return value


def _multiply(left: Any, right: Any) -> Any:
    for sequence, count in ((left, right), (right, left)):
        if isinstance(sequence, str | tuple) and isinstance(count, int) and _size(sequence) * max(count, 0) > MAX_ITEMS:
            raise _TooLarge
    if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
        raise _TooLarge
    return _bounded(operator.mul(left, right))


def _modulo(left: Any, right: Any) -> Any:
    if isinstance(left, str):  # printf-style formatting: '%0999999999d' % 1 builds a gigabyte
        raise TypeError("% of a string (formatting) is not supported")
    return operator.mod(left, right)


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: lambda left, right: _bounded(operator.add(left, right)),
    ast.Sub: lambda left, right: _bounded(operator.sub(left, right)),
    ast.Mult: _multiply,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: _modulo,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda left, right: left in right,
    ast.NotIn: lambda left, right: left not in right,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
ALLOWED = "names, numbers, strings, true/false, comparisons, and/or/not, + - * / // %, and [lists] for in"


def _depth(node: ast.AST) -> int:
    """Levels of the tree under ``node``, counted without recursion."""
    deepest = 0
    stack = [(node, 1)]
    while stack:
        current, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(current))
    return deepest


class Expression:
    """A parsed filter; call it with a point's fields to get True or False.

    Only names of known fields, constants (numbers, strings, booleans), comparisons
    (``== != < <= > >= in not in``), ``and``/``or``/``not``, arithmetic ``+ - * / // %`` and
    literal lists or tuples are accepted: no calls, attributes, subscripts or lambdas, so no
    code runs but the comparison itself. Every intermediate value is bounded (``LIMITS``): an
    expression that would build a larger one is refused, not left to exhaust memory.

    Args:
        text: the expression, e.g. ``"microbatches >= stages and microbatches <= 8 * stages"``.
        fields: the names a point has; any other name is an error.
        field: the spec field the text came from, for error messages.

    Raises:
        ConfigError: a syntax error, a forbidden construct or an unknown name.
    """

    def __init__(self, text: str, fields: Iterable[str], *, field: str = "where") -> None:
        self.text = text
        self.field = field
        self._fields = frozenset(fields)
        self.names: set[str] = set()  # the fields the expression reads
        too_deep = f"is nested too deeply (at most {MAX_DEPTH} levels of operators and lists)"
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ConfigError(field, text, f"is not a valid expression ({exc.msg} at column {exc.offset})") from None
        except (RecursionError, MemoryError):  # the parser's own stack: thousands of nested operators
            raise ConfigError(field, text, too_deep) from None
        if _depth(tree.body) > MAX_DEPTH:
            raise ConfigError(field, text, too_deep)
        self._evaluate = self._compile(tree.body)

    def __call__(self, point: Mapping[str, Any]) -> bool:
        """True when ``point`` passes the filter.

        Raises:
            ConfigError: the expression fails on this point (division by zero, a type mismatch,
                a value over the bounds).
        """
        try:
            return bool(self._evaluate(point))
        except _TooLarge:
            raise ConfigError(self.field, self.text,
                              f"builds a value too large to compare; allowed: {LIMITS}") from None
        except (ArithmeticError, TypeError) as exc:
            shown = {name: point[name] for name in sorted(self.names) if name in point}
            raise ConfigError(self.field, self.text, f"fails on point {shown}: {exc}") from None

    def _compile(self, node: ast.expr) -> Evaluator:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str | bool):
            value = node.value
            if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
                raise ConfigError(self.field, self.text, f"has a number too large; allowed: {LIMITS}")
            return lambda point: value
        if isinstance(node, ast.Name):
            if node.id in ("true", "false", "True", "False"):
                constant = node.id in ("true", "True")
                return lambda point: constant
            if node.id not in self._fields:
                raise ConfigError(self.field, node.id, f"unknown name; fields: {', '.join(sorted(self._fields))}")
            name = node.id
            self.names.add(name)
            return lambda point: point[name]
        if isinstance(node, ast.List | ast.Tuple):
            items = [self._compile(item) for item in node.elts]
            return lambda point: _bounded(tuple(item(point) for item in items))
        if isinstance(node, ast.BoolOp):
            parts = [self._compile(value) for value in node.values]
            if isinstance(node.op, ast.And):
                return lambda point: all(part(point) for part in parts)
            return lambda point: any(part(point) for part in parts)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            unary, operand = _UNARY[type(node.op)], self._compile(node.operand)
            return lambda point: unary(operand(point))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str):
            raise ConfigError(self.field, ast.unparse(node), "is not allowed: % formats a string")
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            binary = _BINARY[type(node.op)]
            left, right = self._compile(node.left), self._compile(node.right)
            return lambda point: binary(left(point), right(point))
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            return self._compile_compare(node)
        raise ConfigError(self.field, ast.unparse(node), f"is not allowed; allowed: {ALLOWED}")

    def _compile_compare(self, node: ast.Compare) -> Evaluator:
        operands = [self._compile(node.left), *(self._compile(item) for item in node.comparators)]
        comparisons = [_COMPARE[type(op)] for op in node.ops]

        def compare(point: Mapping[str, Any]) -> bool:
            left = operands[0](point)
            for compare_one, right_of in zip(comparisons, operands[1:], strict=True):
                right = right_of(point)
                if not compare_one(left, right):
                    return False
                left = right
            return True

        return compare
