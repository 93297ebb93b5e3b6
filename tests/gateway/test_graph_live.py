"""Graphs (``output_ptr``) on a live stack: every step a prediction on the durable path, linked
to its graph run (``predictions.graph``); fan-out and fan-in; a failed step fails the graph
naming it; a bad graph runs nothing; a director killed mid-graph costs a retry of its step,
never a lost or a doubled one."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.admin import Admin
from tests.fixtures.gateway_stack import INSPECT_ENV, Live, serving
from tests.fixtures.inspect_model import GRAPH_BLOCKS
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import until

A, B, C, D = GRAPH_BLOCKS[:4]


@pytest.fixture
async def stub(live: Live) -> AsyncIterator[BlockInferenceServiceStub]:
    async with grpc.aio.insecure_channel(live.address) as channel:
        yield BlockInferenceServiceStub(channel)


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def graph_task(graph: dict[str, list[str]], data: dict[str, Any], head: str = A) -> Any:
    return BlockInferencePacket(
        block_id=head, data=json.dumps(data), output_ptr=json.dumps({"graph": graph})
    )


async def steps(live: Live, token: str, engine: AsyncEngine) -> list[dict[str, Any]]:
    """The account's predictions, oldest first, each with its ``graph`` link."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=live.api_url, headers=headers) as client:
        listed = (await client.get("/v1/predictions")).json()["results"]
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT id, graph, attempt FROM predictions WHERE id = ANY(:ids)"),
            {"ids": [p["id"] for p in listed]},
        )
        links = {row.id: (row.graph, row.attempt) for row in rows}
    return [
        {**p, "graph": links[p["id"]][0], "attempt": links[p["id"]][1]} for p in reversed(listed)
    ]


async def test_fan_out_and_fan_in(
    stub: BlockInferenceServiceStub, live: Live, token: str, engine: AsyncEngine
) -> None:
    graph = {A: [B, C], B: [D], C: [D], D: []}
    answer = await stub.infer(graph_task(graph, {"prompt": "x"}), metadata=auth(token))
    assert json.loads(answer.output_ptr) == {"graph": graph}
    head = {"got": {"prompt": "x"}}
    assert json.loads(answer.data) == {"got": {B: {"got": head}, C: {"got": head}}}
    made = await steps(live, token, engine)
    assert sorted(s["graph"]["step"] for s in made) == sorted([A, B, C, D])
    assert len({s["graph"]["id"] for s in made}) == 1
    assert all(s["graph"]["head"] == A and s["source"] == "gateway" for s in made)
    assert made[0]["graph"]["step"] == A and made[-1]["graph"]["step"] == D


async def test_several_leaves_answer_by_block(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    answer = await stub.infer(graph_task({A: [B, C]}, {"prompt": "y"}), metadata=auth(token))
    head = {"got": {"prompt": "y"}}
    assert json.loads(answer.data) == {B: {"got": head}, C: {"got": head}}


async def test_a_failed_step_fails_the_graph_naming_it(
    stub: BlockInferenceServiceStub, live: Live, token: str, engine: AsyncEngine
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await stub.infer(
            graph_task({A: [B], B: [C], C: []}, {"fail_depth": 1}), metadata=auth(token)
        )
    assert failed.value.code() is grpc.StatusCode.ABORTED
    assert failed.value.details().startswith(f"step {B} failed: ")
    assert "inspect failed as asked" in failed.value.details()
    made = await steps(live, token, engine)
    assert [(s["graph"]["step"], s["status"]) for s in made] == [
        (A, "succeeded"),
        (B, "failed"),
    ]


@pytest.mark.parametrize(
    ("graph", "fault"),
    [
        ({A: [B], B: [A]}, "cycle"),
        ({A: ["blk-nosuch99"]}, "unknown block blk-nosuch99"),
        ({B: [A], A: []}, "must be a root"),
    ],
)
async def test_a_bad_graph_runs_nothing(
    stub: BlockInferenceServiceStub,
    live: Live,
    token: str,
    engine: AsyncEngine,
    graph: dict[str, list[str]],
    fault: str,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.infer(graph_task(graph, {}), metadata=auth(token))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("output_ptr: ")
    assert fault in refused.value.details()
    assert await steps(live, token, engine) == []


async def test_the_graphs_deadline_cancels_the_running_step(
    stub: BlockInferenceServiceStub, live: Live, token: str, engine: AsyncEngine
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await stub.infer(
            graph_task({A: [B], B: []}, {"slow_depth": 1, "slow_seconds": 60}),
            metadata=auth(token),
            timeout=3,
        )
    assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED

    async def ended() -> list[tuple[str, str]]:
        return [(s["graph"]["step"], s["status"]) for s in await steps(live, token, engine)]

    await until(
        lambda: _equals(ended(), [(A, "succeeded"), (B, "canceled")]),
        "the slow step canceled",
        timeout=30,
    )


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def test_a_director_killed_mid_graph_costs_a_retry_of_its_step(
    live: Live,
    launcher: Launcher,
    admin: Admin,
    redis_url: str,
    token: str,
    engine: AsyncEngine,
    tmp_path: Path,
) -> None:
    """SIGKILL the director while the middle step runs; a new director reclaims the step and
    runs it again; every step ends once, and the graph answers as if nothing happened. The
    middle step is held running until the test has seen it (and killed the director), so a
    slow machine cannot let it finish first."""
    gate = tmp_path / "release-the-middle-step"
    name = f"gwk{uuid.uuid4().hex[:6]}/inspect"
    admin.create_model(name, live.runner_url)
    admin.create_deployment(name, name, shards=1, visibility="public", max_attempts=2)
    chain = [admin.create_block(name) for _ in range(3)]
    settings = {"visibility_timeout": "3", "claim_interval": "0.5"}
    first = launcher.director(name, live.runner_url, concurrency=2, **settings)
    await until(lambda: serving(redis_url, name), "the director advertising its runner", timeout=90)
    graph = {chain[0]: [chain[1]], chain[1]: [chain[2]], chain[2]: []}
    async with grpc.aio.insecure_channel(live.address) as channel:
        call = BlockInferenceServiceStub(channel).infer(
            graph_task(graph, {"slow_depth": 1, "slow_until": str(gate)}, head=chain[0]),
            metadata=auth(token),
            timeout=120,
        )

        async def middle_running() -> bool:
            made = await steps(live, token, engine)
            return len(made) == 2 and made[1]["status"] == "processing"

        await until(middle_running, "the middle step running", timeout=60)
        first.kill()
        second = launcher.director(name, live.runner_url, concurrency=2, **settings)
        gate.touch()
        try:
            answer = await call
        finally:
            second.stop()
    assert json.loads(answer.data) == {
        "got": {"got": {"got": {"slow_depth": 1, "slow_until": str(gate)}}}
    }
    made = await steps(live, token, engine)
    assert [(s["graph"]["step"], s["status"]) for s in made] == [
        (chain[0], "succeeded"),
        (chain[1], "succeeded"),
        (chain[2], "succeeded"),
    ]
    assert made[1]["attempt"] >= 2  # the killed director's step ran again


async def test_a_runner_killed_mid_graph_costs_a_retry_of_its_step(
    live: Live,
    launcher: Launcher,
    admin: Admin,
    redis_url: str,
    token: str,
    engine: AsyncEngine,
    tmp_path: Path,
) -> None:
    """SIGKILL the runner while the middle step runs, and start it again on its port: the
    director runs the step again; every step ends once. The middle step is held running until
    the runner has been killed."""
    gate = tmp_path / "release-the-middle-step"
    runner, runner_url = launcher.runner("inspect", concurrency=2, env=INSPECT_ENV)
    name = f"gwr{uuid.uuid4().hex[:6]}/inspect"
    admin.create_model(name, runner_url)
    admin.create_deployment(name, name, shards=1, visibility="public", max_attempts=2)
    chain = [admin.create_block(name) for _ in range(3)]
    director = launcher.director(name, runner_url, concurrency=2)
    try:
        await until(
            lambda: serving(redis_url, name), "the director advertising its runner", timeout=90
        )
        graph = {chain[0]: [chain[1]], chain[1]: [chain[2]], chain[2]: []}
        async with grpc.aio.insecure_channel(live.address) as channel:
            call = BlockInferenceServiceStub(channel).infer(
                graph_task(graph, {"slow_depth": 1, "slow_until": str(gate)}, head=chain[0]),
                metadata=auth(token),
                timeout=120,
            )

            async def middle_running() -> bool:
                made = await steps(live, token, engine)
                return len(made) == 2 and made[1]["status"] == "processing"

            await until(middle_running, "the middle step running", timeout=60)
            runner.restart()
            gate.touch()
            answer = await call
    finally:
        director.stop()
        runner.stop()
    carried = {"slow_depth": 1, "slow_until": str(gate)}
    assert json.loads(answer.data) == {"got": {"got": {"got": carried}}}
    made = await steps(live, token, engine)
    assert [(s["graph"]["step"], s["status"]) for s in made] == [
        (chain[0], "succeeded"),
        (chain[1], "succeeded"),
        (chain[2], "succeeded"),
    ]
    assert made[1]["attempt"] >= 2  # the step the killed runner held ran again
