"""A named graph's spec, read and checked for what it says on its own (no block looked up).

The spec (JSON)::

    {"name": "caption-translate",
     "steps": [
       {"id": "caption", "block": "blk-aaaaaaaa", "input": {"image": "input.image"},
        "timeout": 30},
       {"id": "translate", "block": "blk-bbbbbbbb",
        "input": {"text": "steps.caption.output.text", "lang": "'fr'"},
        "when": "input.translate", "after": []}],
     "output": "steps.translate.output",
     "return_steps": false}

Each ``input`` value, ``when`` and ``output`` is a JMESPath expression over the context
``{"input": <task data>, "steps": {<id>: {"output": ...}}}`` (:mod:`blocks.graphs.expressions`).
A step needs the steps its expressions read, and those it lists in ``after``; it starts once
they have all ended. ``output`` defaults to the last listed step's output.

:func:`parse_spec` answers the spec with *every* fault it finds, each a
:class:`~tracker.input_checks.FieldError` naming its field (``steps[1].input.text``,
``steps[2].when``, ``output``): the shape, duplicate ids, more than :data:`MAX_STEPS` steps, a
bad expression, a read of an unknown step or of the step itself, and a cycle (named step by
step). What the blocks' schemas say of the mappings is :mod:`blocks.graphs.schemas`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from blocks.graphs.expressions import BadExpression, Expression, compile_expression
from tracker.input_checks import FieldError, FieldErrors

MAX_STEPS = 32
#: A step's own ``timeout``, in seconds, is at most this (the graph's deadline bounds it too).
MAX_TIMEOUT = 24 * 3600.0
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: A step id reads plainly in an expression: ``steps.<id>.output``.
STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_GRAPH_KEYS = frozenset({"name", "steps", "output", "return_steps"})
_STEP_KEYS = frozenset({"id", "block", "input", "when", "timeout", "after"})


@dataclass(frozen=True, slots=True)
class StepSpec:
    #: Where the step is listed (``steps[index]``).
    index: int
    id: str
    block: str
    #: Each input field of the block, and the expression that gives it.
    input: Mapping[str, Expression]
    when: Expression | None
    timeout: float | None
    after: tuple[str, ...]
    #: Every step this one waits for (read or listed in ``after``), in the graph's order.
    needs: tuple[str, ...] = ()

    @property
    def field(self) -> str:
        return f"steps[{self.index}]"


@dataclass(frozen=True, slots=True)
class GraphSpec:
    name: str
    #: As listed.
    steps: tuple[StepSpec, ...]
    #: Step ids, each after every step it needs (ties: as listed).
    order: tuple[str, ...]
    #: None: the last listed step's output.
    output: Expression | None
    return_steps: bool

    def step(self, step_id: str) -> StepSpec:
        return next(step for step in self.steps if step.id == step_id)


class RefusedGraph(FieldErrors):
    """The graph cannot be registered (or run)."""


def parse_spec(raw: Any) -> tuple[GraphSpec, list[FieldError]]:
    """The spec and every fault found in it. With faults, the spec holds what could be read
    (a step whose ``id`` or ``block`` is unusable is left out, and so is a bad expression)
    and must not be run."""
    reader = _Reader()
    spec = reader.graph(raw)
    return spec, reader.errors


def checked_spec(raw: Any) -> GraphSpec:
    """:func:`parse_spec`, or :class:`RefusedGraph` with its faults."""
    spec, errors = parse_spec(raw)
    if errors:
        raise RefusedGraph(errors)
    return spec


class _Reader:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def refuse(self, field: str, message: str) -> None:
        self.errors.append(FieldError(field, message))

    def graph(self, raw: Any) -> GraphSpec:
        empty = GraphSpec("", (), (), None, False)
        if not isinstance(raw, dict):
            self.refuse("spec", f"must be a JSON object, not {_kind(raw)}")
            return empty
        for key in raw:
            if key not in _GRAPH_KEYS:
                self.refuse(str(key), "unknown field")
        name = self.name(raw.get("name"))
        raw_steps = raw.get("steps")
        if not isinstance(raw_steps, list) or not raw_steps:
            self.refuse("steps", "must be a non-empty list of steps")
            return empty
        if len(raw_steps) > MAX_STEPS:
            self.refuse("steps", f"the graph has {len(raw_steps)} steps; at most {MAX_STEPS}")
            return empty
        steps = [s for i, item in enumerate(raw_steps) if (s := self.step(i, item)) is not None]
        ids = self.unique_ids(steps)
        output = self.expression("output", raw["output"]) if "output" in raw else None
        if output is not None:
            self.check_reads("output", output, ids, None)
        return_steps = raw.get("return_steps", False)
        if not isinstance(return_steps, bool):
            self.refuse("return_steps", f"must be true or false, not {_kind(return_steps)}")
            return_steps = False
        steps = [self.with_needs(step, ids) for step in steps]
        order = self.order(steps) if len(ids) == len(steps) else ()
        if order:
            position = {step_id: i for i, step_id in enumerate(order)}
            steps = [
                replace(step, needs=tuple(sorted(step.needs, key=position.__getitem__)))
                for step in steps
            ]
        return GraphSpec(name, tuple(steps), order, output, return_steps)

    def name(self, name: Any) -> str:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            self.refuse(
                "name",
                "must be 1 to 100 letters, digits, '.', '_' or '-', starting with a letter "
                "or digit",
            )
            return ""
        return name

    def step(self, index: int, raw: Any) -> StepSpec | None:
        at = f"steps[{index}]"
        if not isinstance(raw, dict):
            self.refuse(at, f"must be a JSON object, not {_kind(raw)}")
            return None
        for key in raw:
            if key not in _STEP_KEYS:
                self.refuse(f"{at}.{key}", "unknown field")
        step_id, block = raw.get("id"), raw.get("block")
        if not isinstance(step_id, str) or not STEP_ID.fullmatch(step_id):
            self.refuse(
                f"{at}.id", "must be 1 to 64 letters, digits or '_', not starting with a digit"
            )
            step_id = None
        if not isinstance(block, str) or not block:
            self.refuse(f"{at}.block", "must name a block (its id)")
            block = None
        mapping = self.mapping(at, raw.get("input", {}))
        when = self.expression(f"{at}.when", raw["when"]) if "when" in raw else None
        timeout = self.timeout(at, raw.get("timeout"))
        after = self.after(at, raw.get("after", []))
        if step_id is None or block is None:
            return None
        return StepSpec(index, step_id, block, mapping, when, timeout, after)

    def mapping(self, at: str, raw: Any) -> dict[str, Expression]:
        if not isinstance(raw, dict):
            self.refuse(f"{at}.input", "must map each input field to a JMESPath expression")
            return {}
        mapping = {}
        for name, text in raw.items():
            if not name:
                self.refuse(f"{at}.input", "an input field's name is empty")
                continue
            expression = self.expression(f"{at}.input.{name}", text)
            if expression is not None:
                mapping[name] = expression
        return mapping

    def expression(self, field: str, text: Any) -> Expression | None:
        try:
            return compile_expression(text)
        except BadExpression as bad:
            self.refuse(field, str(bad))
            return None

    def timeout(self, at: str, raw: Any) -> float | None:
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw:
            self.refuse(f"{at}.timeout", "must be a number of seconds above 0")
            return None
        if raw > MAX_TIMEOUT:
            self.refuse(f"{at}.timeout", f"must be at most {MAX_TIMEOUT:.0f} seconds")
            return None
        return float(raw)

    def after(self, at: str, raw: Any) -> tuple[str, ...]:
        if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
            self.refuse(f"{at}.after", "must be a list of step ids")
            return ()
        return tuple(dict.fromkeys(raw))

    def unique_ids(self, steps: list[StepSpec]) -> dict[str, StepSpec]:
        ids: dict[str, StepSpec] = {}
        for step in steps:
            first = ids.setdefault(step.id, step)
            if first is not step:
                self.refuse(f"{step.field}.id", f"duplicate step id {step.id} ({first.field})")
        return ids

    def check_reads(
        self, field: str, expression: Expression, ids: Mapping[str, StepSpec], own: str | None
    ) -> tuple[str, ...]:
        """The steps ``expression`` reads that exist; refuses each unknown one, and itself."""
        known = []
        for step_id in expression.reads:
            if step_id == own:
                self.refuse(field, f"a step cannot read its own output (steps.{own})")
            elif step_id not in ids:
                self.refuse(field, f"reads steps.{step_id}, which is not a step of the graph")
            else:
                known.append(step_id)
        return tuple(known)

    def with_needs(self, step: StepSpec, ids: Mapping[str, StepSpec]) -> StepSpec:
        needs: dict[str, None] = {}
        for name, expression in step.input.items():
            needs.update(
                dict.fromkeys(
                    self.check_reads(f"{step.field}.input.{name}", expression, ids, step.id)
                )
            )
        if step.when is not None:
            needs.update(
                dict.fromkeys(self.check_reads(f"{step.field}.when", step.when, ids, step.id))
            )
        for position, other in enumerate(step.after):
            field = f"{step.field}.after[{position}]"
            if other == step.id:
                self.refuse(field, "a step cannot come after itself")
            elif other not in ids:
                self.refuse(field, f"{other} is not a step of the graph")
            else:
                needs[other] = None
        return replace(step, needs=tuple(needs))

    def order(self, steps: list[StepSpec]) -> tuple[str, ...]:
        """Steps in an order that puts each after those it needs (ties: as listed); refuses
        a cycle, naming it and the field that closes it."""
        cycle = _find_cycle(steps)
        if cycle is not None:
            path, field = cycle
            self.refuse(field, f"cycle {' -> '.join(path)} (each step needs the next)")
            return ()
        done: set[str] = set()
        order: list[str] = []
        pending = list(steps)
        while pending:  # at most 32 steps: the quadratic walk is plenty
            ready = next(s for s in pending if all(n in done for n in s.needs))
            pending.remove(ready)
            done.add(ready.id)
            order.append(ready.id)
        return tuple(order)


def _find_cycle(steps: list[StepSpec]) -> tuple[list[str], str] | None:
    """The first cycle of the ``needs`` edges a depth-first walk finds, with the field of the
    edge that closes it."""
    by_id = {step.id: step for step in steps}
    done: set[str] = set()
    for start in steps:
        if start.id in done:
            continue
        path: list[str] = [start.id]
        stack = [iter(start.needs)]
        while stack:
            other = next(stack[-1], None)
            if other is None:
                stack.pop()
                done.add(path.pop())
            elif other in path:
                cycle = [*path[path.index(other) :], other]
                return cycle, _edge_field(by_id[path[-1]], other)
            elif other not in done:
                path.append(other)
                stack.append(iter(by_id[other].needs))
    return None


def _edge_field(step: StepSpec, other: str) -> str:
    """The first field of ``step`` that makes it need ``other``."""
    for name, expression in step.input.items():
        if other in expression.reads:
            return f"{step.field}.input.{name}"
    if step.when is not None and other in step.when.reads:
        return f"{step.field}.when"
    return f"{step.field}.after[{step.after.index(other)}]"


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
