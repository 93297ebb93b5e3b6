"""The account's limits the gateway shares with the api (``tracker.rate_limits``,
``catalog.token_checks``), on a gateway of the test's own in front of the live stack: the rate
of creates counts every prediction a task makes, a graph's each; made-up tokens past an
address's failed-auth budget are refused with a retry hint, and cost no query."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import pytest

from catalog.records import AccountInfo
from catalog.token_checks import TokenChecks
from gateway.auth import TokenAuth
from gateway.errors import ResourceExhausted, Unauthenticated
from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.gateway_stack import Live
from tests.fixtures.inspect_model import GRAPH_BLOCKS
from tests.fixtures.processes import Launcher

A, B, C, D = GRAPH_BLOCKS[:4]


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def made_up() -> str:
    return "r8_" + secrets.token_urlsafe(30)


@pytest.fixture
def limited(launcher: Launcher, live: Live) -> Iterator[str]:
    """A gateway whose accounts may create 3 predictions a minute, 3 at once, and whose
    addresses may fail authentication 3 times (then once a minute)."""
    env = {
        "CONDUIT_GATEWAY_CREATE_RATE_LIMIT": "3/min",
        "CONDUIT_GATEWAY_AUTH_FAILURES_PER_MINUTE": "1",
        "CONDUIT_GATEWAY_AUTH_FAILURE_BURST": "3",
    }
    proc, address = launcher.gateway(env)
    try:
        yield address
    finally:
        proc.stop()


@pytest.fixture
async def stub(limited: str) -> AsyncIterator[BlockInferenceServiceStub]:
    async with grpc.aio.insecure_channel(limited) as channel:
        yield BlockInferenceServiceStub(channel)


async def predictions(live: Live, token: str) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=live.api_url, headers=headers) as client:
        answer = await client.get("/v1/predictions")
        answer.raise_for_status()
        results: list[dict[str, Any]] = answer.json()["results"]
        return results


def task(block_id: str, graph: dict[str, list[str]] | None = None) -> BlockInferencePacket:
    return BlockInferencePacket(
        block_id=block_id,
        data=json.dumps({"prompt": "x"}),
        output_ptr=json.dumps({"graph": graph}) if graph else "",
    )


async def test_the_task_past_the_accounts_rate_is_refused_with_a_retry_hint(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    await stub.infer(task(A), metadata=auth(token))
    with pytest.raises(grpc.aio.AioRpcError) as too_big:
        # Three predictions and then four: a graph larger than the burst never fits.
        await stub.infer(task(A, {A: [B, C, D]}), metadata=auth(token))
    assert too_big.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    await stub.infer(task(A, {A: [B]}), metadata=auth(token))  # two more: three made
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.infer(task(A), metadata=auth(token))
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Too many predictions created" in refused.value.details()
    trailing = dict(refused.value.trailing_metadata() or ())
    assert 1 <= int(trailing["retry-after"]) <= 20
    assert len(await predictions(live, token)) == 3  # nothing of the refused tasks was made


async def test_made_up_tokens_past_the_budget_are_refused_with_a_retry_hint(
    stub: BlockInferenceServiceStub, token: str
) -> None:
    await stub.infer(task(A), metadata=auth(token))  # verified before the flood
    codes = []
    for _ in range(6):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.infer(task(A), metadata=auth(made_up()))
        codes.append(refused.value.code())
    unauthenticated, exhausted = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED
    assert codes == [unauthenticated] * 3 + [exhausted] * 3
    trailing = dict(refused.value.trailing_metadata() or ())
    assert 1 <= int(trailing["retry-after"]) <= 60
    await stub.infer(task(A), metadata=auth(token))  # a verified token is never refused


async def test_made_up_tokens_cost_no_query_past_the_budget_nor_evict_valid_ones() -> None:
    """The gateway's tokens, checked by the api's rule: unknown tokens in a cache of their
    own, and past the address's budget no query at all."""
    queries: list[str] = []
    alice = AccountInfo(1, "alice", True, "whsec_x")
    good = made_up()

    async def load(token: str) -> AccountInfo | None:
        queries.append(token)
        return alice if token == good else None

    tokens = TokenAuth(
        TokenChecks(load, ttl=300, max_unknown=2, failures_per_minute=1, failure_burst=5)
    )
    assert await tokens.account(auth(good), "ipv4:10.0.0.1:5000") == alice
    for _ in range(5):
        with pytest.raises(Unauthenticated):
            await tokens.account(auth(made_up()), "ipv4:10.0.0.1:5001")
    for _ in range(20):
        with pytest.raises(ResourceExhausted) as refused:
            await tokens.account(auth(made_up()), "ipv4:10.0.0.1:5002")
    assert refused.value.trailing[0][0] == "retry-after"
    assert len(queries) == 6  # the good token and the budget's five: none past it
    assert await tokens.account(auth(good), "ipv4:10.0.0.1:5003") == alice  # still known
    assert len(queries) == 6
    with pytest.raises(Unauthenticated):  # another address has its own budget
        await tokens.account(auth(made_up()), "ipv6:[2001:db8::1]:5000")


async def test_an_account_over_its_rate_on_rest_is_over_it_on_the_gateway(
    launcher: Launcher, live: Live, token: str
) -> None:
    """One rule, one schedule: an api and a gateway both given ``CONDUIT_API_CREATE_RATE_LIMIT``
    count an account's creates together; once REST answers 429, the gateway refuses too."""
    env = {"CONDUIT_API_CREATE_RATE_LIMIT": "3/min"}
    proc, address = launcher.gateway(env)
    try:
        with launcher.own_api(env) as api_url:
            headers = {"Authorization": f"Bearer {token}"}
            path = f"/v1/deployments/{live.deployment}/predictions"
            async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=30) as rest:
                answers = [
                    (await rest.post(path, json={"input": {"prompt": "r"}})).status_code
                    for _ in range(4)
                ]
            assert answers == [201, 201, 201, 429]
            async with grpc.aio.insecure_channel(address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await BlockInferenceServiceStub(channel).infer(task(A), metadata=auth(token))
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "retry-after" in dict(refused.value.trailing_metadata() or ())
            assert len(await predictions(live, token)) == 3
    finally:
        proc.stop()
