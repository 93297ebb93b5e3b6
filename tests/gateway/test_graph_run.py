"""Running a planned graph with in-process steps: data flow, concurrency, the in-flight bound,
failure, the deadline and the caller's cancellation — and a property test against a
sequential reference interpreter."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.shell import ArmTimer, Tick
from gateway.errors import DeadlineExceeded, InvalidArgument
from gateway.graphs.core import (
    Answer,
    Begin,
    GraphRun,
    RunStep,
    StepFailure,
    StepRaised,
    StepSucceeded,
    TimedOut,
)
from gateway.graphs.plan import GraphPlan, plan_graph
from gateway.graphs.run import StepFailed, run_graph
from tests.fixtures.loop import loop_turns
from tests.fixtures.waiting import until

HEAD_DATA = {"prompt": "hello"}
#: Far enough never to pass in a test that is not about the deadline.
LATER = 3600.0

Behaviour = Callable[[str, Any], Awaitable[Any]]


async def plan_of(graph: dict[str, list[str]], head: str) -> GraphPlan[str]:
    async def resolve(block_id: str) -> str:
        return f"block {block_id}"

    return await plan_graph({"graph": graph}, head, resolve)


async def echo(step: str, data: Any) -> Any:
    return {step: data}


async def forever(step: str, data: Any) -> Any:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


class Steps:
    """A step runner: each step echoes (``{step: data}``) unless given another behaviour;
    records every call, which steps are running now, and which were canceled."""

    def __init__(self, **behaviours: Behaviour) -> None:
        self.behaviours = behaviours
        self.calls: list[tuple[str, str, Any, float]] = []
        self.started = {step: asyncio.Event() for step in "abcdefgh"}
        self.active: set[str] = set()
        self.peak = 0
        self.canceled: set[str] = set()

    async def __call__(self, step: str, block: str, data: Any, deadline: float) -> Any:
        self.calls.append((step, block, data, deadline))
        self.active.add(step)
        self.peak = max(self.peak, len(self.active))
        self.started[step].set()
        try:
            return await self.behaviours.get(step, echo)(step, data)
        except asyncio.CancelledError:
            self.canceled.add(step)
            raise
        finally:
            self.active.discard(step)

    def called(self) -> list[str]:
        return [step for step, *_ in self.calls]


async def run(
    plan: GraphPlan[str], steps: Steps, deadline: float | None = None, max_inflight: int = 8
) -> Any:
    """``run_graph``, checking that nothing it started is still running when it ends."""
    until_ = time.monotonic() + LATER if deadline is None else deadline
    try:
        return await run_graph(plan, HEAD_DATA, steps, until_, max_inflight)
    finally:
        assert steps.active == set()


async def test_a_chain_passes_each_output_on() -> None:
    plan = await plan_of({"a": ["b"], "b": ["c"], "c": []}, "a")
    steps = Steps()
    deadline = time.monotonic() + LATER
    answer = await run(plan, steps, deadline)
    assert answer == {"c": {"b": {"a": HEAD_DATA}}}
    assert steps.calls == [
        ("a", "block a", HEAD_DATA, deadline),
        ("b", "block b", {"a": HEAD_DATA}, deadline),
        ("c", "block c", {"b": {"a": HEAD_DATA}}, deadline),
    ]


async def test_a_single_step_graph_answers_with_its_output() -> None:
    plan = await plan_of({"a": []}, "a")
    assert await run(plan, Steps()) == {"a": HEAD_DATA}


async def test_a_fan_out_runs_its_branches_together_and_answers_per_leaf() -> None:
    steps = Steps()

    def waits_for(other: str) -> Behaviour:
        async def behaviour(step: str, data: Any) -> Any:
            await steps.started[other].wait()  # never returns if the branches ran in turn
            return await echo(step, data)

        return behaviour

    steps.behaviours = {"b": waits_for("c"), "c": waits_for("b")}
    plan = await plan_of({"a": ["b", "c"]}, "a")
    answer = await run(plan, steps, time.monotonic() + 30)
    assert answer == {"b": {"b": {"a": HEAD_DATA}}, "c": {"c": {"a": HEAD_DATA}}}


async def test_a_fan_in_step_gets_every_parents_output_by_name_once_all_finished() -> None:
    release_c = asyncio.Event()

    async def slow_c(step: str, data: Any) -> Any:
        await release_c.wait()
        return await echo(step, data)

    steps = Steps(c=slow_c)
    plan = await plan_of({"a": ["b", "c"], "b": ["d"], "c": ["d"]}, "a")
    running = asyncio.create_task(run(plan, steps))
    await until(_async(lambda: "b" not in steps.active and steps.started["b"].is_set()), "b")
    assert "d" not in steps.called()
    release_c.set()
    answer = await running
    from_a = {"a": HEAD_DATA}
    assert answer == {"d": {"b": {"b": from_a}, "c": {"c": from_a}}}
    assert Counter(steps.called()) == {"a": 1, "b": 1, "c": 1, "d": 1}


@pytest.mark.parametrize("max_inflight", [1, 2, 3, 4, 8])
async def test_at_most_max_inflight_steps_run_at_once(max_inflight: int) -> None:
    async def a_while(step: str, data: Any) -> Any:
        await loop_turns(5)
        return step

    steps = Steps(b=a_while, c=a_while, d=a_while, e=a_while)
    plan = await plan_of({"a": ["b", "c", "d", "e"]}, "a")
    answer = await run(plan, steps, max_inflight=max_inflight)
    assert answer == {"b": "b", "c": "c", "d": "d", "e": "e"}
    assert steps.peak == min(max_inflight, 4)


async def test_max_inflight_must_allow_a_step() -> None:
    plan = await plan_of({"a": []}, "a")
    with pytest.raises(ValueError, match="max_inflight"):
        await run_graph(plan, HEAD_DATA, Steps(), time.monotonic() + LATER, 0)


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (InvalidArgument("bad input", "data"), grpc.StatusCode.INVALID_ARGUMENT, "data: bad input"),
        (RuntimeError("the model broke"), grpc.StatusCode.ABORTED, "the model broke"),
    ],
)
async def test_a_failed_step_cancels_the_running_ones_and_fails_the_graph(
    error: Exception, code: grpc.StatusCode, message: str
) -> None:
    steps = Steps()

    async def fails(step: str, data: Any) -> Any:
        await steps.started["c"].wait()
        raise error

    steps.behaviours = {"b": fails, "c": forever}
    plan = await plan_of({"a": ["b", "c"], "b": ["d"], "c": ["d"]}, "a")
    with pytest.raises(StepFailed) as failed:
        await run(plan, steps, time.monotonic() + 30)
    assert failed.value.step == "b"
    assert failed.value.code == code
    assert failed.value.message == f"step b failed: {message}"
    assert failed.value.__cause__ is error
    assert steps.canceled == {"c"}
    assert "d" not in steps.called()


async def test_a_step_canceled_from_elsewhere_fails_the_graph_as_canceled() -> None:
    async def canceled(step: str, data: Any) -> Any:
        raise asyncio.CancelledError

    plan = await plan_of({"a": ["b"]}, "a")
    with pytest.raises(StepFailed) as failed:
        await run(plan, Steps(b=canceled))
    assert failed.value.code == grpc.StatusCode.CANCELLED
    assert failed.value.message.startswith("step b failed: ")


async def test_the_deadline_cancels_the_running_steps_and_names_them() -> None:
    steps = Steps(b=forever, c=forever)
    plan = await plan_of({"a": ["b", "c"], "b": ["d"], "c": ["d"]}, "a")
    deadline = time.monotonic() + 0.2
    with pytest.raises(DeadlineExceeded) as exceeded:
        await run(plan, steps, deadline)
    assert time.monotonic() >= deadline
    assert exceeded.value.message == "the graph's deadline passed; still running: b, c"
    assert exceeded.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert steps.canceled == {"b", "c"}
    assert {deadline} == {given for *_, given in steps.calls}


async def test_a_deadline_already_past_runs_nothing() -> None:
    steps = Steps()
    plan = await plan_of({"a": ["b"]}, "a")
    with pytest.raises(DeadlineExceeded, match="not started: a"):
        await run(plan, steps, time.monotonic() - 1)
    assert steps.calls == []


async def test_an_answer_after_the_deadline_starts_no_other_step() -> None:
    # The sans-IO core on its own: a step that answers after the deadline, before the timer
    # has fired, must not start its children on it.
    plan = await plan_of({"a": ["b"], "b": ["c"]}, "a")
    core = GraphRun(plan, HEAD_DATA, deadline=10.0, max_inflight=8)
    assert core.handle(Begin(now=0.0)) == [ArmTimer(10.0), RunStep("a", HEAD_DATA)]
    assert core.handle(StepSucceeded("a", "out", now=5.0)) == [RunStep("b", "out")]
    assert core.handle(StepSucceeded("b", "late", now=10.0)) == [TimedOut((), ("c",))]
    assert core.handle(Tick(now=10.0)) == []


async def test_the_last_answer_wins_over_a_passed_deadline() -> None:
    plan = await plan_of({"a": ["b"]}, "a")
    core = GraphRun(plan, HEAD_DATA, deadline=10.0, max_inflight=8)
    core.handle(Begin(now=0.0))
    core.handle(StepSucceeded("a", "out", now=1.0))
    assert core.handle(StepSucceeded("b", "done", now=11.0)) == [Answer("done")]


async def test_the_run_ends_once() -> None:
    plan = await plan_of({"a": ["b", "c"]}, "a")
    core = GraphRun(plan, HEAD_DATA, deadline=10.0, max_inflight=8)
    core.handle(Begin(now=0.0))
    assert core.handle(StepSucceeded("a", 1, now=1.0)) == [RunStep("b", 1), RunStep("c", 1)]
    error = RuntimeError("no")
    assert core.handle(StepRaised("b", error)) == [StepFailure("b", error)]
    assert core.handle(StepSucceeded("c", 2, now=2.0)) == []
    assert core.handle(Tick(now=10.0)) == []


async def test_the_callers_cancellation_cancels_every_running_step() -> None:
    steps = Steps(b=forever, c=forever)
    plan = await plan_of({"a": ["b", "c"]}, "a")
    running = asyncio.create_task(run(plan, steps))
    await until(_async(lambda: {"b", "c"} <= steps.active), "b and c running")
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running  # ``run`` itself checks that no step is still running
    assert steps.canceled == {"b", "c"}


async def test_a_second_cancellation_still_waits_for_the_steps_to_end() -> None:
    cleaning_up = asyncio.Event()
    clean_up_done = asyncio.Event()

    async def slow_to_stop(step: str, data: Any) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cleaning_up.set()
            await clean_up_done.wait()
            raise
        raise AssertionError("unreachable")

    steps = Steps(b=slow_to_stop)
    plan = await plan_of({"a": ["b"]}, "a")
    running = asyncio.create_task(run(plan, steps))
    await until(_async(lambda: "b" in steps.active), "b running")
    running.cancel()
    await until(_async(cleaning_up.is_set), "b cleaning up")
    running.cancel()
    await loop_turns(10)  # room for the run to end early, were it to stop waiting for b
    assert not running.done()
    assert "b" in steps.active
    clean_up_done.set()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert steps.canceled == {"b"}


def _async(probe: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def wrapped() -> bool:
        return probe()

    return wrapped


# -- the property: run_graph against a sequential reference ----------------------------------

#: A node's kind and how many times it yields to the loop before answering or raising.
Kind = tuple[str, int]


@st.composite
def dags(draw: st.DrawFn) -> tuple[dict[str, list[str]], dict[str, Kind]]:
    """A random DAG whose one root ``n0`` reaches every node (each later node has at least
    one earlier parent), listed in a random order, some leaves only as children."""
    size = draw(st.integers(1, 10))
    names = [f"n{i}" for i in range(size)]
    children: dict[str, list[str]] = {name: [] for name in names}
    for i in range(1, size):
        first = draw(st.integers(0, i - 1))
        more = draw(st.sets(st.integers(0, i - 1), max_size=3))
        for parent in sorted({first} | more):
            children[names[parent]].append(names[i])
    graph: dict[str, list[str]] = {}
    for name in draw(st.permutations(names)):
        if name != "n0" and not children[name] and draw(st.booleans()):
            continue  # a leaf named only as a child
        graph[name] = draw(st.permutations(children[name]))
    kinds = {
        name: (draw(st.sampled_from(["echo", "echo", "echo", "fail"])), draw(st.integers(0, 4)))
        for name in names
    }
    return graph, kinds


def reference(
    plan: GraphPlan[Kind], head_data: Any
) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """Run the graph one step at a time: each step's input, each output, and the failing steps
    that run (a step runs only when all its parents succeeded)."""
    inputs: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    failing: set[str] = set()
    for node in plan.order:
        parents = plan.parents[node]
        if not all(parent in outputs for parent in parents):
            continue
        if not parents:
            inputs[node] = head_data
        elif len(parents) == 1:
            inputs[node] = outputs[parents[0]]
        else:
            inputs[node] = {parent: outputs[parent] for parent in parents}
        if plan.resolved[node][0] == "fail":
            failing.add(node)
        else:
            outputs[node] = {node: inputs[node]}
    return inputs, outputs, failing


class PropertySteps:
    def __init__(self, plan: GraphPlan[Kind]) -> None:
        self.plan = plan
        self.calls: list[tuple[str, Any]] = []
        self.succeeded: set[str] = set()
        #: Steps called before all their parents had succeeded.
        self.early: list[str] = []
        self.active: set[str] = set()
        self.peak = 0

    async def __call__(self, step: str, kind: Kind, data: Any, deadline: float) -> Any:
        # Recorded, not asserted: an assertion here would only fail the step, not the test.
        if not all(parent in self.succeeded for parent in self.plan.parents[step]):
            self.early.append(step)
        self.calls.append((step, data))
        self.active.add(step)
        self.peak = max(self.peak, len(self.active))
        try:
            behaviour, yields = kind
            await loop_turns(yields)
            if behaviour == "fail":
                raise RuntimeError(f"{step} fails")
            self.succeeded.add(step)
            return {step: data}
        finally:
            self.active.discard(step)


@settings(max_examples=300, deadline=None)
@given(dag=dags(), max_inflight=st.integers(1, 4))
def test_run_graph_agrees_with_a_sequential_reference(
    dag: tuple[dict[str, list[str]], dict[str, Kind]], max_inflight: int
) -> None:
    graph, kinds = dag

    async def scenario() -> None:
        async def resolve(node: str) -> Kind:
            return kinds[node]

        plan = await plan_graph({"graph": graph}, "n0", resolve)
        assert {node: set(kids) for node, kids in plan.describe()["graph"].items()} == {
            node: set(graph.get(node, [])) for node in kinds
        }
        inputs, outputs, failing = reference(plan, HEAD_DATA)
        steps = PropertySteps(plan)
        try:
            answer = await run_graph(plan, HEAD_DATA, steps, time.monotonic() + LATER, max_inflight)
        except StepFailed as failed:
            assert failed.step in failing
            assert failed.step in {step for step, _ in steps.calls}
            assert failed.code == grpc.StatusCode.ABORTED
        else:
            assert not failing
            leaves = plan.leaves
            expected = outputs[leaves[0]] if len(leaves) == 1 else {n: outputs[n] for n in leaves}
            assert answer == expected
            assert sorted(step for step, _ in steps.calls) == sorted(plan.order)
        assert steps.active == set()  # every step it started has ended
        assert steps.early == []
        called = Counter(step for step, _ in steps.calls)
        assert max(called.values(), default=1) == 1
        for step, data in steps.calls:
            assert data == inputs[step]
        assert steps.peak <= max_inflight

    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        runner.run(scenario())
