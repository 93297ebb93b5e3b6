"""Running a named graph with in-process steps: inputs mapped from the context, ``when``
skipping a step (its dependants still run, reading null), per-step timeouts, the answer's
``output`` and ``return_steps``, and a failure naming its step."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest

from blocks.blocks import BlockInfo
from blocks.versions import BlockVersion
from catalog.records import VersionInfo
from gateway.errors import Aborted, DeadlineExceeded, InvalidArgument
from gateway.graphs.named import (
    INPUT,
    CompiledGraph,
    StepFailed,
    compile_graph,
    explain,
    run_named_graph,
)
from tests.fixtures.loop import loop_turns
from tests.fixtures.waiting import until

#: Far enough never to pass in a test that is not about the deadline.
LATER = 3600.0
NOW = datetime(2026, 12, 4, tzinfo=UTC)

Behaviour = Callable[[str, dict[str, Any]], Awaitable[Any]]


def _block(block_id: str) -> BlockVersion:
    """A block whose version declares no schema: every mapping is taken on trust."""
    block = BlockInfo(block_id, 1, "o", None, None, f"v-{block_id}", "o/m", {}, False, NOW)
    return BlockVersion(block, VersionInfo(f"v-{block_id}", "o/m", {}, None, 1, NOW, True), None)


async def _resolve(block_id: str) -> BlockVersion:
    return _block(block_id)


async def compiled(spec: dict[str, Any]) -> CompiledGraph[BlockVersion]:
    return await compile_graph({"name": "g", **spec}, _resolve)


class Steps:
    """A step runner: each step answers ``{"ran": step, "got": input}`` unless given another
    behaviour; records each call's input and ``until``, and which steps run now."""

    def __init__(self, **behaviours: Behaviour) -> None:
        self.behaviours = behaviours
        self.inputs: dict[str, dict[str, Any]] = {}
        self.untils: dict[str, float] = {}
        self.running: set[str] = set()
        self.canceled: set[str] = set()

    async def __call__(self, step: str, block: BlockVersion, data: Any, deadline: float) -> Any:
        assert block.block.id == f"blk-{step}"
        self.inputs[step] = data
        self.untils[step] = deadline
        self.running.add(step)
        try:
            behaviour = self.behaviours.get(step)
            if behaviour is None:
                return {"ran": step, "got": data}
            return await behaviour(step, data)
        except asyncio.CancelledError:
            self.canceled.add(step)
            raise
        finally:
            self.running.discard(step)


def step(step_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": step_id, "block": f"blk-{step_id}", **fields}


async def forever(step: str, data: Any) -> Any:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_each_step_gets_its_mapped_input_and_the_answer_is_output() -> None:
    graph = await compiled(
        {
            "steps": [
                step("caption", input={"image": "input.image", "size": "`512`"}),
                step(
                    "translate",
                    input={"text": "steps.caption.output.got.image", "lang": "'fr'"},
                ),
            ],
            "output": "{caption: steps.caption.output.ran, text: steps.translate.output.got}",
        }
    )
    steps = Steps()
    answer = await run_named_graph(graph, {"image": "cat.png"}, steps, time.monotonic() + LATER)
    assert steps.inputs == {
        "caption": {"image": "cat.png", "size": 512},
        "translate": {"text": "cat.png", "lang": "fr"},
    }
    assert answer == {"caption": "caption", "text": {"text": "cat.png", "lang": "fr"}}


async def test_without_output_the_answer_is_the_last_listed_steps_and_return_steps_adds_all() -> (
    None
):
    spec = {
        "steps": [step("b", after=["a"]), step("a", input={"x": "input.x"})],
    }
    plain = await run_named_graph(await compiled(spec), {"x": 1}, Steps(), time.monotonic() + LATER)
    assert plain == {"ran": "a", "got": {"x": 1}}  # a is listed last, though it runs first
    everything = await run_named_graph(
        await compiled({**spec, "return_steps": True, "output": "steps.b.output.ran"}),
        {"x": 1},
        Steps(),
        time.monotonic() + LATER,
    )
    assert everything == {
        "output": "b",
        "steps": {"b": {"ran": "b", "got": {}}, "a": {"ran": "a", "got": {"x": 1}}},
    }


async def test_a_step_whose_when_is_false_is_skipped_and_its_dependants_read_null() -> None:
    graph = await compiled(
        {
            "steps": [
                step("gate", input={"q": "input.q"}),
                step("maybe", input={"v": "steps.gate.output.got.q"}, when="input.go"),
                step(
                    "after",
                    input={
                        "seen": "steps.maybe.output",
                        "fallback": "steps.maybe.output.ran || 'skipped'",
                    },
                ),
            ],
            "return_steps": True,
        }
    )
    falsy_values: list[Any] = [False, None, "", [], {}]
    for falsy in falsy_values:
        steps = Steps()
        answer = await run_named_graph(
            graph, {"q": 1, "go": falsy}, steps, time.monotonic() + LATER
        )
        assert "maybe" not in steps.inputs  # never called
        # A field whose value is null is left out: the block's default applies.
        assert steps.inputs["after"] == {"fallback": "skipped"}
        assert answer["steps"]["maybe"] is None
        assert answer["output"] == {"ran": "after", "got": {"fallback": "skipped"}}
    steps = Steps()
    await run_named_graph(graph, {"q": 1, "go": 0}, steps, time.monotonic() + LATER)
    assert steps.inputs["maybe"] == {"v": 1}  # 0 is true to JMESPath
    assert steps.inputs["after"]["seen"] == {"ran": "maybe", "got": {"v": 1}}


async def test_independent_steps_run_at_once_and_a_step_waits_for_all_it_reads() -> None:
    both = asyncio.Event()

    async def meet(step: str, data: Any) -> Any:
        if {"left", "right"} <= steps.running:
            both.set()
        await both.wait()
        return step

    steps = Steps(left=meet, right=meet)
    graph = await compiled(
        {
            "steps": [
                step("left"),
                step("right"),
                step("join", input={"l": "steps.left.output", "r": "steps.right.output"}),
            ]
        }
    )
    answer = await run_named_graph(graph, {}, steps, time.monotonic() + LATER)
    assert answer == {"ran": "join", "got": {"l": "left", "r": "right"}}


async def test_a_step_past_its_own_timeout_fails_the_graph_naming_it() -> None:
    steps = Steps(slow=forever, sibling=forever)
    graph = await compiled(
        {"steps": [step("slow", timeout=0.05), step("sibling"), step("next", after=["slow"])]}
    )
    deadline = time.monotonic() + LATER
    with pytest.raises(StepFailed) as failed:
        await run_named_graph(graph, {}, steps, deadline)
    assert failed.value.step == "slow"
    assert failed.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert isinstance(failed.value.error, DeadlineExceeded)
    assert "step slow failed: step slow ran past its timeout of 0.05 seconds" in str(failed.value)
    assert steps.untils["slow"] < deadline and steps.untils["sibling"] == deadline
    assert steps.canceled == {"slow", "sibling"} and steps.running == set()
    assert "next" not in steps.inputs


async def test_a_failed_step_fails_the_graph_naming_it_and_cancels_the_rest() -> None:
    async def broken(step: str, data: Any) -> Any:
        await until(lambda: _true("other" in steps.running), "the other step running")
        raise Aborted("block blk-broken failed: boom")

    steps = Steps(broken=broken, other=forever)
    graph = await compiled({"steps": [step("broken"), step("other")]})
    with pytest.raises(StepFailed) as failed:
        await run_named_graph(graph, {}, steps, time.monotonic() + LATER)
    assert failed.value.step == "broken"
    assert failed.value.code is grpc.StatusCode.ABORTED
    assert str(failed.value) == "step broken failed: block blk-broken failed: boom"
    assert steps.canceled == {"other"}


async def test_an_expression_that_fails_when_it_runs_names_the_step_and_field() -> None:
    graph = await compiled({"steps": [step("count", input={"n": "length(input.number)"})]})
    with pytest.raises(StepFailed) as failed:
        await run_named_graph(graph, {"number": 3}, Steps(), time.monotonic() + LATER)
    assert failed.value.step == "count"
    assert failed.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(failed.value.error, InvalidArgument)
    assert failed.value.error.field == "steps[0].input.n"

    bad_output = await compiled({"steps": [step("one")], "output": "abs(steps.one.output)"})
    with pytest.raises(InvalidArgument) as refused:
        await run_named_graph(bad_output, {}, Steps(), time.monotonic() + LATER)
    assert refused.value.field == "output"


async def test_the_graphs_deadline_ends_the_run() -> None:
    steps = Steps(slow=forever)
    graph = await compiled({"steps": [step("slow")]})
    with pytest.raises(DeadlineExceeded, match="still running: slow"):
        await run_named_graph(graph, {}, steps, time.monotonic() + 0.05)
    assert steps.canceled == {"slow"}
    with pytest.raises(DeadlineExceeded, match="before any step started"):
        await run_named_graph(graph, {}, Steps(), time.monotonic() - 1)


async def test_the_bound_on_steps_in_flight_holds() -> None:
    most = 0

    async def count(step: str, data: Any) -> Any:
        nonlocal most
        most = max(most, len(steps.running))
        await loop_turns()
        return step

    names = [f"s{i}" for i in range(6)]
    steps = Steps(**dict.fromkeys(names, count))
    graph = await compiled({"steps": [step(name) for name in names]})
    await run_named_graph(graph, {}, steps, time.monotonic() + LATER, max_inflight=2)
    assert set(steps.inputs) == set(names) and 1 <= most <= 2


async def test_explain_shows_the_plan_and_never_the_synthetic_head() -> None:
    graph = await compiled({"steps": [step("b", input={"x": "steps.a.output"}), step("a")]})
    plan = explain(graph, lambda target: target.block.id == "blk-a")
    assert [(s["id"], s["needs"], s["served"]) for s in plan["steps"]] == [
        ("a", [], True),
        ("b", ["a"], False),
    ]
    assert INPUT not in str(plan)


async def _true(value: bool) -> bool:
    return value
