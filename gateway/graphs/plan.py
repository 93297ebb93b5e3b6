"""A graph (``output_ptr``) checked and resolved before any step runs.

The seed's shape is an adjacency object, each block naming the blocks that take its output::

    {"graph": {"blk-a": ["blk-b", "blk-c"], "blk-b": [], "blk-c": []}}

A block that appears only as a child is a leaf. Every fault is ``INVALID_ARGUMENT`` on
``output_ptr`` naming it, found in this order so a client sees the most telling one: the
shape, the bounds (nodes, fan-out: checked before any walk), a cycle (named node by node),
the head (in the graph, a root), reachability from the head, and last the blocks themselves,
resolved once each, concurrently, only when the structure is sound.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gateway.errors import InvalidArgument

B = TypeVar("B")
T = TypeVar("T")

FIELD = "output_ptr"


@dataclass(frozen=True, slots=True)
class GraphPlan(Generic[B]):
    """A valid graph: a DAG whose single root is ``head`` and which the head reaches whole."""

    head: str
    #: Every node, parents before children.
    order: tuple[str, ...]
    #: Each node's parents, in ``order``; the head's is empty.
    parents: Mapping[str, tuple[str, ...]]
    #: Each node's children, as the graph lists them (the graph's own node order).
    children: Mapping[str, tuple[str, ...]]
    #: What ``resolve`` answered for each node.
    resolved: Mapping[str, B]
    #: The nodes no node feeds: the head alone.
    roots: tuple[str, ...]
    #: The nodes that feed none, in ``order``: their outputs are the answer.
    leaves: tuple[str, ...]

    def describe(self) -> dict[str, Any]:
        """The graph in the seed's shape (every node a key), for echoing ``output_ptr``."""
        return {"graph": {node: list(kids) for node, kids in self.children.items()}}


async def plan_graph(
    output_ptr: Any,
    head: str,
    resolve: Callable[[str], Awaitable[B | None]],
    max_nodes: int = 32,
    max_fanout: int = 32,
) -> GraphPlan[B]:
    """The plan for ``output_ptr`` headed by ``head``, or :class:`InvalidArgument` naming the
    fault. ``resolve`` answers None for a block that is unknown or not visible to the caller;
    both are refused alike, so a graph cannot probe for blocks it may not use."""
    if not head:
        raise InvalidArgument("must name the graph's head block", "block_id")
    children = _adjacency(output_ptr)
    _check_bounds(children, max_nodes, max_fanout)
    _check_acyclic(children)
    parents: dict[str, list[str]] = {node: [] for node in children}
    for node, kids in children.items():
        for kid in kids:
            parents[kid].append(node)
    _check_head(children, parents, head)
    order = _topological_order(children, parents)
    position = {node: i for i, node in enumerate(order)}
    blocks = await _gather([resolve(node) for node in order])
    resolved: dict[str, B] = {}
    for node, block in zip(order, blocks, strict=True):
        if block is None:
            raise InvalidArgument(f"unknown block {node}", FIELD)
        resolved[node] = block
    return GraphPlan(
        head=head,
        order=tuple(order),
        parents={node: tuple(sorted(parents[node], key=position.__getitem__)) for node in order},
        children={node: tuple(kids) for node, kids in children.items()},
        resolved=resolved,
        roots=(head,),
        leaves=tuple(node for node in order if not children[node]),
    )


def _adjacency(output_ptr: Any) -> dict[str, list[str]]:
    """Node → children for every node (a child-only node gets ``[]``), in first-seen order."""
    if not isinstance(output_ptr, dict):
        raise InvalidArgument(
            f'must be a JSON object {{"graph": {{…}}}}, not {_kind(output_ptr)}', FIELD
        )
    graph = output_ptr.get("graph")
    if not isinstance(graph, dict):
        found = "missing" if "graph" not in output_ptr else _kind(graph)
        raise InvalidArgument(
            f'needs a "graph" object mapping each block to its children; "graph" is {found}',
            FIELD,
        )
    adjacency: dict[str, list[str]] = {}
    for node, kids in graph.items():
        if not node:
            raise InvalidArgument("a block id in the graph is empty", FIELD)
        adjacency[node] = _children(node, kids)
    for kids in graph.values():
        for kid in kids:
            adjacency.setdefault(kid, [])
    return adjacency


def _children(node: str, kids: Any) -> list[str]:
    if not isinstance(kids, list) or not all(isinstance(kid, str) for kid in kids):
        raise InvalidArgument(f"the children of {node} must be a list of block ids", FIELD)
    seen: set[str] = set()
    for kid in kids:
        if not kid:
            raise InvalidArgument(f"{node} lists an empty block id", FIELD)
        if kid in seen:
            raise InvalidArgument(f"{node} lists {kid} twice", FIELD)
        seen.add(kid)
    return list(kids)


def _check_bounds(children: Mapping[str, list[str]], max_nodes: int, max_fanout: int) -> None:
    if len(children) > max_nodes:
        raise InvalidArgument(f"the graph has {len(children)} blocks; at most {max_nodes}", FIELD)
    for node, kids in children.items():
        if len(kids) > max_fanout:
            raise InvalidArgument(f"{node} has {len(kids)} children; at most {max_fanout}", FIELD)


def _check_acyclic(children: Mapping[str, list[str]]) -> None:
    """Refuse the first cycle a depth-first walk finds, naming it node by node."""
    done: set[str] = set()
    on_path: dict[str, int] = {}  # node → its index in ``path``
    for start in children:
        if start in done:
            continue
        path = [start]
        on_path[start] = 0
        stack = [iter(children[start])]
        while stack:  # iterative, so a long chain cannot hit the recursion limit
            kid = next(stack[-1], None)
            if kid is None:
                stack.pop()
                node = path.pop()
                del on_path[node]
                done.add(node)
            elif kid in on_path:
                cycle = [*path[on_path[kid] :], kid]
                raise InvalidArgument(f"cycle {' -> '.join(cycle)}", FIELD)
            elif kid not in done:
                on_path[kid] = len(path)
                path.append(kid)
                stack.append(iter(children[kid]))


def _topological_order(
    children: Mapping[str, list[str]], parents: Mapping[str, list[str]]
) -> list[str]:
    """Kahn's order of an acyclic graph, ties broken by the graph's own order."""
    missing = {node: len(parents[node]) for node in children}
    ready = deque(node for node, count in missing.items() if count == 0)
    order: list[str] = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for kid in children[node]:
            missing[kid] -= 1
            if missing[kid] == 0:
                ready.append(kid)
    return order


def _check_head(
    children: Mapping[str, list[str]], parents: Mapping[str, list[str]], head: str
) -> None:
    if head not in children:
        raise InvalidArgument(f"the head {head} (block_id) is not in the graph", FIELD)
    if parents[head]:
        raise InvalidArgument(
            f"the head {head} must be a root; it is fed by {', '.join(parents[head])}", FIELD
        )
    reached = {head}
    frontier = [head]
    while frontier:
        for kid in children[frontier.pop()]:
            if kid not in reached:
                reached.add(kid)
                frontier.append(kid)
    unreached = [node for node in children if node not in reached]
    if unreached:
        raise InvalidArgument(f"not reachable from the head {head}: {', '.join(unreached)}", FIELD)


async def _gather(awaitables: list[Awaitable[T]]) -> list[T]:
    """Await all concurrently; when one raises, cancel the rest, await them, and raise its
    error itself (a task group would wrap it in an ``ExceptionGroup``)."""

    async def wrap(awaitable: Awaitable[T]) -> T:
        return await awaitable

    error: BaseException | None = None
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(wrap(awaitable)) for awaitable in awaitables]
    except BaseExceptionGroup as failed:
        error = failed.exceptions[0]
    if error is not None:
        raise error  # outside the handler, so the group is not its context
    return [task.result() for task in tasks]


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
