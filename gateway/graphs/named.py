"""Running a named graph (:mod:`blocks.named_graphs`): each step's input computed from its
mappings, on :func:`gateway.graphs.run.run_graph`'s scheduler and shell.

The steps become the nodes of a :class:`~gateway.graphs.plan.GraphPlan` under one extra head,
:data:`INPUT` (which answers at once), each step a child of the steps it needs (the head's, if
it needs none). So a step starts as soon as everything it reads has ended, independent steps
run concurrently, at most ``max_inflight`` at once, one deadline bounds the whole run, and a
failed step cancels the rest and fails the graph naming the step, exactly as for a seed graph.

Per step, once the steps it needs have ended:

* its ``when`` is evaluated over the context ``{"input": data, "steps": {<id>: {"output":
  ...}}}`` (holding the steps it needs); false by JMESPath's truth (false, null, empty
  string, array or object) skips the step: its output is null, and the steps that need it
  still run, reading null;
* each input field's expression is evaluated over that context; a field whose value is null
  is left out of the step's input, so the block's default applies (a field the block
  requires is then refused by the block's own check: map it from a step that is not skipped,
  or give it a fallback, ``steps.a.output.text || 'none'``);
* it runs by ``min(deadline, now + timeout)``; past its own ``timeout`` it fails the graph
  (``DEADLINE_EXCEEDED``, naming the step).

The answer is ``output`` over the context of every step (default: the last listed step's
output), or with ``return_steps``, ``{"output": ..., "steps": {<id>: output, ...}}``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable
from typing import Any, Generic, TypeVar

from jmespath.exceptions import JMESPathError

from blocks.graphs.expressions import Expression, truthy
from blocks.graphs.schemas import StepBlock
from blocks.graphs.specs import GraphSpec, RefusedGraph, StepSpec
from blocks.named_graphs import GRAPH_ID, CompiledGraph, compile_graph, explain
from gateway.errors import DeadlineExceeded, InvalidArgument
from gateway.graphs.plan import GraphPlan
from gateway.graphs.run import StepFailed, StepRunner, run_graph

__all__ = [
    "GRAPH_ID",
    "INPUT",
    "CompiledGraph",
    "RefusedGraph",
    "StepFailed",
    "compile_graph",
    "explain",
    "run_named_graph",
]

B = TypeVar("B", bound=StepBlock)

#: The plan's head: the task's data, before any step (not a valid step id).
INPUT = "(input)"


async def run_named_graph(
    compiled: CompiledGraph[B],
    data: dict[str, Any],
    run_step: StepRunner[B],
    deadline: float,
    max_inflight: int = 8,
) -> Any:
    """The graph's answer (see the module's docstring).

    ``run_step(step_id, block, input, until)`` runs one step (``until``: a ``time.monotonic()``
    instant). Raises :class:`StepFailed` naming the first step that raised (its own timeout:
    a :class:`DeadlineExceeded` inside), :class:`DeadlineExceeded` when the graph's deadline
    passed, :class:`InvalidArgument` when ``output`` cannot be evaluated."""
    if time.monotonic() >= deadline:
        raise DeadlineExceeded("the graph's deadline passed before any step started")
    run = _NamedRun(compiled, data, run_step)
    await run_graph(run.plan(), data, run.step, deadline, max_inflight)
    return run.answer()


class _NamedRun(Generic[B]):
    """One run: the outputs of the steps that have ended, and the plan's step runner."""

    def __init__(
        self, compiled: CompiledGraph[B], data: dict[str, Any], run_step: StepRunner[B]
    ) -> None:
        self.spec: GraphSpec = compiled.spec
        self.blocks = compiled.blocks
        self.data = data
        self.run_step = run_step
        self.outputs: dict[str, Any] = {}

    def plan(self) -> GraphPlan[B | None]:
        spec = self.spec
        children: dict[str, list[str]] = {INPUT: [], **{step_id: [] for step_id in spec.order}}
        parents: dict[str, tuple[str, ...]] = {INPUT: ()}
        for step_id in spec.order:
            needs = spec.step(step_id).needs or (INPUT,)
            parents[step_id] = needs
            for parent in needs:
                children[parent].append(step_id)
        resolved: dict[str, B | None] = {INPUT: None, **self.blocks}
        return GraphPlan(
            head=INPUT,
            order=(INPUT, *spec.order),
            parents=parents,
            children={node: tuple(kids) for node, kids in children.items()},
            resolved=resolved,
            roots=(INPUT,),
            leaves=tuple(node for node, kids in children.items() if not kids),
        )

    async def step(self, step_id: str, block: B | None, _: Any, deadline: float) -> Any:
        if step_id == INPUT:
            return None
        assert block is not None
        step = self.spec.step(step_id)
        context = self.context(step.needs)
        if step.when is not None and not truthy(_search(step.when, context, f"{step.field}.when")):
            self.outputs[step_id] = None
            return None
        input = _input(step, context)
        if step.timeout is None:
            output = await self.run_step(step_id, block, input, deadline)
        else:
            until = min(deadline, time.monotonic() + step.timeout)
            output = await _within(step, self.run_step(step_id, block, input, until))
        self.outputs[step_id] = output
        return output

    def context(self, steps: Iterable[str]) -> dict[str, Any]:
        return {
            "input": self.data,
            "steps": {step_id: {"output": self.outputs.get(step_id)} for step_id in steps},
        }

    def answer(self) -> Any:
        listed = [step.id for step in self.spec.steps]
        context = self.context(listed)
        if self.spec.output is None:
            output = self.outputs.get(listed[-1])
        else:
            output = _search(self.spec.output, context, "output")
        if not self.spec.return_steps:
            return output
        return {
            "output": output,
            "steps": {step_id: self.outputs.get(step_id) for step_id in listed},
        }


def _input(step: StepSpec, context: dict[str, Any]) -> dict[str, Any]:
    input = {}
    for name, expression in step.input.items():
        value = _search(expression, context, f"{step.field}.input.{name}")
        if value is not None:
            input[name] = value
    return input


def _search(expression: Expression, context: dict[str, Any], field: str) -> Any:
    try:
        return expression.search(context)
    except JMESPathError as error:  # e.g. a function given an argument of the wrong type
        raise InvalidArgument(f"{expression.text!r} failed: {error}", field) from None


async def _within(step: StepSpec, running: Awaitable[Any]) -> Any:
    """``running`` bounded by the step's own timeout (the graph's deadline bounds it too,
    by :func:`run_graph`)."""
    assert step.timeout is not None
    timeout = step.timeout
    try:
        async with asyncio.timeout(timeout) as scope:
            return await running
    except TimeoutError:
        if scope.expired():
            raise DeadlineExceeded(
                f"step {step.id} ran past its timeout of {timeout:g} seconds"
            ) from None
        raise
