"""Planning a graph (``output_ptr``): the seed's shape accepted, every bad graph refused before
a block is resolved, each block resolved once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import InvalidArgument, Unavailable
from gateway.graphs.plan import GraphPlan, plan_graph

SEED_GRAPH = {
    "graph": {
        "blk-ksshxpiy": ["blk-bfl3gbd5"],
        "blk-bfl3gbd5": ["blk-tsonq3qr"],
        "blk-tsonq3qr": [],
    }
}


class Blocks:
    """A resolver over a fixed set of blocks, recording what it was asked."""

    def __init__(self, known: set[str] | None = None) -> None:
        self.known = known
        self.asked: list[str] = []

    async def __call__(self, block_id: str) -> str | None:
        self.asked.append(block_id)
        if self.known is not None and block_id not in self.known:
            return None
        return f"resolved {block_id}"


async def plan_of(graph: Any, head: str, **bounds: int) -> GraphPlan[str]:
    return await plan_graph(graph, head, Blocks(), **bounds)


async def test_the_seeds_example_graph() -> None:
    blocks = Blocks()
    plan = await plan_graph(SEED_GRAPH, "blk-ksshxpiy", blocks)
    assert plan.head == "blk-ksshxpiy"
    assert plan.order == ("blk-ksshxpiy", "blk-bfl3gbd5", "blk-tsonq3qr")
    assert plan.roots == ("blk-ksshxpiy",)
    assert plan.leaves == ("blk-tsonq3qr",)
    assert plan.parents == {
        "blk-ksshxpiy": (),
        "blk-bfl3gbd5": ("blk-ksshxpiy",),
        "blk-tsonq3qr": ("blk-bfl3gbd5",),
    }
    assert plan.children["blk-ksshxpiy"] == ("blk-bfl3gbd5",)
    assert plan.resolved == {node: f"resolved {node}" for node in plan.order}
    assert sorted(blocks.asked) == sorted(plan.order)
    assert plan.describe() == SEED_GRAPH


async def test_the_design_example_fans_out() -> None:
    graph = {"graph": {"blk-a": ["blk-b", "blk-c"], "blk-b": [], "blk-c": []}}
    plan = await plan_graph(graph, "blk-a", Blocks())
    assert plan.order[0] == "blk-a"
    assert set(plan.order) == {"blk-a", "blk-b", "blk-c"}
    assert plan.leaves == ("blk-b", "blk-c")
    assert plan.describe() == graph


async def test_a_child_without_a_key_is_a_leaf_and_is_described_with_one() -> None:
    plan = await plan_of({"graph": {"h": ["a", "b"], "a": ["c"]}}, "h")
    assert set(plan.leaves) == {"b", "c"}
    assert plan.children["c"] == ()
    assert plan.describe() == {"graph": {"h": ["a", "b"], "a": ["c"], "b": [], "c": []}}


async def test_parents_come_before_children_whatever_the_keys_order() -> None:
    graph = {"graph": {"d": [], "c": ["d"], "b": ["d"], "h": ["c", "b"]}}
    plan = await plan_of(graph, "h")
    position = {node: i for i, node in enumerate(plan.order)}
    for node, kids in graph["graph"].items():
        assert all(position[node] < position[kid] for kid in kids)
    assert set(plan.parents["d"]) == {"b", "c"}
    assert plan.parents["d"] == tuple(sorted(plan.parents["d"], key=position.__getitem__))


async def test_a_single_block_graph() -> None:
    plan = await plan_of({"graph": {"blk-a": []}}, "blk-a")
    assert plan.order == plan.roots == plan.leaves == ("blk-a",)


async def test_the_bounds_are_inclusive() -> None:
    graph = {"graph": {"h": ["a", "b"], "a": [], "b": []}}
    assert len((await plan_of(graph, "h", max_nodes=3, max_fanout=2)).order) == 3


@pytest.mark.parametrize(
    ("output_ptr", "head", "message"),
    [
        ([], "a", 'must be a JSON object {"graph": {…}}, not list'),
        (None, "a", 'must be a JSON object {"graph": {…}}, not null'),
        ({}, "a", '"graph" is missing'),
        ({"blk-a": ["blk-b"]}, "blk-a", '"graph" is missing'),
        ({"graph": ["a"]}, "a", '"graph" is list'),
        ({"graph": {"a": "b"}}, "a", "the children of a must be a list of block ids"),
        ({"graph": {"a": [1]}}, "a", "the children of a must be a list of block ids"),
        ({"graph": {"a": {"outputs": ["b"]}}}, "a", "the children of a must be a list"),
        ({"graph": {"a": ["b", "b"]}}, "a", "a lists b twice"),
        ({"graph": {"a": [""]}}, "a", "a lists an empty block id"),
        ({"graph": {"": []}}, "a", "a block id in the graph is empty"),
        ({"graph": {"a": ["a"]}}, "a", "cycle a -> a"),
        ({"graph": {"a": ["b"], "b": ["a"]}}, "a", "cycle a -> b -> a"),
        (
            {"graph": {"h": ["a"], "a": ["b"], "b": ["c"], "c": ["a"]}},
            "h",
            "cycle a -> b -> c -> a",
        ),
        ({"graph": {"a": ["b"], "b": []}}, "x", "the head x (block_id) is not in the graph"),
        ({"graph": {"a": ["b"], "b": []}}, "b", "the head b must be a root; it is fed by a"),
        (
            {"graph": {"a": ["c"], "b": ["c"], "c": []}},
            "c",
            "the head c must be a root; it is fed by a, b",
        ),
        (
            {"graph": {"h": ["a"], "x": ["a", "y"]}},
            "h",
            "not reachable from the head h: x, y",
        ),
    ],
)
async def test_a_bad_graph_is_refused_naming_the_fault_before_any_block_is_resolved(
    output_ptr: Any, head: str, message: str
) -> None:
    blocks = Blocks()
    with pytest.raises(InvalidArgument) as refused:
        await plan_graph(output_ptr, head, blocks)
    assert refused.value.field == "output_ptr"
    assert refused.value.message.startswith("output_ptr: ")
    assert message in refused.value.message
    assert blocks.asked == []


async def test_the_cycle_is_named_in_order_whatever_node_it_is_entered_at() -> None:
    with pytest.raises(InvalidArgument) as refused:
        await plan_of({"graph": {"b": ["c"], "h": ["a"], "a": ["b"], "c": ["a"]}}, "h")
    assert refused.value.message == "output_ptr: cycle b -> c -> a -> b"


async def test_too_many_nodes_counting_the_child_only_ones() -> None:
    graph = {"graph": {"h": ["a", "b", "c"]}}
    with pytest.raises(InvalidArgument) as refused:
        await plan_of(graph, "h", max_nodes=3)
    assert refused.value.message == "output_ptr: the graph has 4 blocks; at most 3"


async def test_too_many_children() -> None:
    graph = {"graph": {"h": ["a"], "a": ["b", "c", "d"]}}
    with pytest.raises(InvalidArgument) as refused:
        await plan_of(graph, "h", max_fanout=2)
    assert refused.value.message == "output_ptr: a has 3 children; at most 2"


async def test_the_bounds_come_before_the_walk() -> None:
    cyclic_and_wide = {"graph": {"a": ["b", "c", "d"], "b": ["a"]}}
    with pytest.raises(InvalidArgument, match="a has 3 children; at most 2"):
        await plan_of(cyclic_and_wide, "a", max_fanout=2)


async def test_an_empty_head_is_refused_on_block_id() -> None:
    with pytest.raises(InvalidArgument) as refused:
        await plan_of(SEED_GRAPH, "")
    assert refused.value.field == "block_id"


@pytest.mark.parametrize("missing", ["blk-unknown", "blk-invisible"])
async def test_an_unknown_or_invisible_block_gets_the_same_refusal(missing: str) -> None:
    graph = {"graph": {"blk-a": [missing, "blk-b"], "blk-b": []}}
    blocks = Blocks(known={"blk-a", "blk-b"})
    with pytest.raises(InvalidArgument) as refused:
        await plan_graph(graph, "blk-a", blocks)
    assert refused.value.message == f"output_ptr: unknown block {missing}"
    assert sorted(blocks.asked) == sorted(["blk-a", missing, "blk-b"])


async def test_each_block_is_resolved_once_and_all_at_once() -> None:
    graph = {"graph": {"h": ["a", "b"], "a": ["c"], "b": ["c"]}}
    asked: list[str] = []
    everyone_asked = asyncio.Event()

    async def resolve(block_id: str) -> str:
        asked.append(block_id)
        if len(asked) == 4:
            everyone_asked.set()
        await everyone_asked.wait()  # only returns if all four are in flight together
        return block_id.upper()

    async with asyncio.timeout(30):
        plan = await plan_graph(graph, "h", resolve)
    assert sorted(asked) == ["a", "b", "c", "h"]
    assert plan.resolved == {"h": "H", "a": "A", "b": "B", "c": "C"}


async def test_a_resolver_error_propagates_and_the_other_lookups_are_canceled() -> None:
    graph = {"graph": {"h": ["a", "b"]}}
    waiting: set[str] = set()
    both_waiting = asyncio.Event()
    canceled: set[str] = set()

    async def resolve(block_id: str) -> str:
        if block_id == "a":
            await both_waiting.wait()
            raise Unavailable("the database is away")
        waiting.add(block_id)
        if len(waiting) == 2:
            both_waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            canceled.add(block_id)
            raise
        return block_id

    with pytest.raises(Unavailable, match="the database is away"):
        await plan_graph(graph, "h", resolve)
    assert canceled == {"h", "b"}
