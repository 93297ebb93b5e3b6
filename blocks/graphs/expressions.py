"""The JMESPath expressions of a named graph: compiled once, read for what they depend on.

Every mapping, ``when`` and ``output`` of a graph is a JMESPath expression over the context
``{"input": <task data>, "steps": {<id>: {"output": ...}}}``. JMESPath only reads: it cannot
call out, assign, or run code (there is no ``eval`` anywhere on this path).

A step depends on the steps its expressions read, and the scheduler must know them before
anything runs, so every read of ``steps`` has to name its step: ``steps.<id>`` (then any
path). :func:`compile_expression` walks the compiled syntax tree, following which parts are
evaluated against the context itself (the left of a subexpression, pipe, projection; the
arguments of a function; both sides of a comparison) and which against something derived
from it (the right of those, a filter's condition, an ``&expression``): ``steps.a`` in a
filter's condition is a field of each element, not a step. It refuses what cannot be
followed: ``steps`` read whole (``steps.*``, ``steps[0]``, ``@``, ``*``), a name at the top
other than ``input`` and ``steps`` (the usual slip: ``"fr"`` is a field, the string is
``'fr'``), and a function JMESPath does not have or called with the wrong number of
arguments (JMESPath itself finds those only when it runs). An expression nests at most
``core.nesting.MAX_DEPTH`` deep (JMESPath parses and evaluates by recursion).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jmespath
from jmespath import functions
from jmespath.exceptions import JMESPathError, ParseError
from jmespath.parser import ParsedResult

from core.nesting import MAX_DEPTH

#: The names the context holds at its top.
CONTEXT_NAMES = ("input", "steps")
#: Longest expression text accepted.
MAX_EXPRESSION = 1024

_FUNCTIONS: dict[str, Any] = functions.Functions().FUNCTION_TABLE
#: Node kinds whose first child is read against the node's own value and every other child
#: against what the first produced (or against each element of it).
_CHAINED = {
    "index_expression",
    "projection",
    "value_projection",
    "filter_projection",
    "pipe",
}


class BadExpression(ValueError):
    """The text is not an expression a graph may hold; the message says why."""


@dataclass(frozen=True, slots=True)
class OutputPath:
    """An expression that is a plain path into one step's output: ``steps.<step>.output``
    then zero or more field names."""

    step: str
    path: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Expression:
    text: str
    compiled: ParsedResult
    #: The steps it reads, in the order it names them first.
    reads: tuple[str, ...]
    #: Set when the expression is a plain path into a step's output.
    source: OutputPath | None = None
    #: Set (to a 1-tuple of the value) when the expression is a literal.
    literal: tuple[Any] | None = None

    def search(self, context: dict[str, Any]) -> Any:
        """The expression's value over ``context`` (raises ``JMESPathError`` for a function
        given arguments of the wrong type)."""
        return self.compiled.search(context)


def compile_expression(text: Any) -> Expression:
    """``text`` compiled and checked, or :class:`BadExpression`."""
    if not isinstance(text, str):
        raise BadExpression(f"must be a JMESPath expression (a string), not {_kind(text)}")
    if not text.strip():
        raise BadExpression("must be a JMESPath expression, not empty")
    if len(text) > MAX_EXPRESSION:
        raise BadExpression(f"is {len(text)} characters long; at most {MAX_EXPRESSION}")
    too_deep = f"is nested deeper than {MAX_DEPTH} levels"
    try:
        compiled = jmespath.compile(text)
    except ParseError as error:
        raise BadExpression(f"is not valid JMESPath: {_parse_message(error)}") from None
    except JMESPathError as error:  # pragma: no cover - every compile error is a ParseError
        raise BadExpression(f"is not valid JMESPath: {error}") from None
    except RecursionError:  # the parser recurses once per nested (, [, {, ! ...
        raise BadExpression(too_deep) from None
    if _depth(compiled.parsed) > MAX_DEPTH:  # the walk below, and every search, recurse
        raise BadExpression(too_deep)
    walk = _Walk()
    walk.node(compiled.parsed, True)
    node = compiled.parsed
    literal = (node["value"],) if node["type"] == "literal" else None
    return Expression(text, compiled, tuple(walk.reads), _output_path(node), literal)


def _depth(tree: Any) -> int:
    """How deep a syntax tree nests (counted without recursion)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(tree, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in node.get("children", ()))
    return deepest


def truthy(value: Any) -> bool:
    """JMESPath's truth: false, null, and an empty string, array or object are false (and
    0 is true, unlike Python's)."""
    if value is None or value is False:
        return False
    return not (isinstance(value, str | list | dict) and not value)


def _parse_message(error: ParseError) -> str:
    first = str(error).splitlines()[0].removesuffix(", for expression:").removesuffix(":")
    for prefix in ("Invalid jmespath expression: ", "Bad jmespath expression: "):
        first = first.removeprefix(prefix)
    return f"{first} (at column {error.lex_position})" if "column" not in first else first


def _output_path(node: Any) -> OutputPath | None:
    if node["type"] != "subexpression":
        return None
    children = node["children"]
    if len(children) < 3 or any(child["type"] != "field" for child in children):
        return None
    names = [child["value"] for child in children]
    if names[0] != "steps" or names[2] != "output":
        return None
    return OutputPath(names[1], tuple(names[3:]))


class _Walk:
    """Collects the steps a syntax tree reads; raises :class:`BadExpression` for a read it
    cannot follow. ``at_top`` says whether a node is evaluated against the context itself."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def node(self, node: Any, at_top: bool) -> None:
        if not isinstance(node, dict):  # a slice's bounds are plain numbers
            return
        kind = node["type"]
        children = node["children"]
        if kind == "subexpression":
            self.chain(children, at_top)
        elif kind in _CHAINED:
            self.node(children[0], at_top)
            for child in children[1:]:
                self.node(child, False)
        elif kind == "expref":
            self.node(children[0], False)
        else:
            if kind == "function_expression":
                _check_function(node["value"], children)
            if at_top:
                self.top(node)
            for child in children:
                self.node(child, at_top)

    def top(self, node: Any) -> None:
        """A node evaluated against the context itself (its children are walked apart)."""
        kind = node["type"]
        if kind == "field":
            self.top_field(node["value"])
        elif kind in ("current", "identity"):
            raise BadExpression(
                "reads the whole context; name what it reads (input..., steps.<id>...)"
            )

    def chain(self, children: list[Any], at_top: bool) -> None:
        """``a.b.c``: ``a`` against the value, each next against what the previous gave;
        ``@`` passes the value on."""
        for index, child in enumerate(children):
            if at_top and child["type"] == "current" and index + 1 < len(children):
                continue  # ``@.x`` is ``x``
            if at_top and child["type"] == "field" and child["value"] == "steps":
                step = _leading_field(children[index + 1]) if index + 1 < len(children) else None
                if step is None:
                    raise BadExpression(_WHOLE_STEPS)
                if step not in self.reads:
                    self.reads.append(step)
                for rest in children[index + 1 :]:
                    self.node(rest, False)
                return
            self.node(child, at_top)
            at_top = False

    def top_field(self, name: str) -> None:
        if name == "steps":
            raise BadExpression(_WHOLE_STEPS)
        if name not in CONTEXT_NAMES:
            raise BadExpression(
                f"reads {name!r}, which the context does not hold (it holds input and "
                f"steps); a string literal is written in single quotes: '{name}'"
            )


_WHOLE_STEPS = "reads steps without naming one; read a step's output as steps.<id>.output"


def _leading_field(node: Any) -> str | None:
    """The field a chained node starts with (``a`` of ``a[0]``, ``a[*].b``), if any."""
    while isinstance(node, dict):
        if node["type"] == "field":
            return str(node["value"])
        if node["type"] not in (*_CHAINED, "subexpression", "flatten"):
            return None
        node = node["children"][0]
    return None


def _check_function(name: str, arguments: list[Any]) -> None:
    entry = _FUNCTIONS.get(name)
    if entry is None:
        raise BadExpression(f"calls {name}(), which JMESPath does not have")
    signature = entry["signature"]
    variadic = bool(signature) and bool(signature[-1].get("variadic"))
    if (variadic and len(arguments) < len(signature)) or (
        not variadic and len(arguments) != len(signature)
    ):
        wanted = f"at least {len(signature)}" if variadic else str(len(signature))
        raise BadExpression(f"calls {name}() with {len(arguments)} arguments; it takes {wanted}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
