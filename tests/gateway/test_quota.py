"""The gateway's quota (``gateway.quota``) against the suite's Redis: the windows' arithmetic at
an injected clock, refunds between scopes, and over gRPC: ``RESOURCE_EXHAUSTED`` with
``retry-after`` trailing metadata and nothing run, per-session and per-block totals, shadow
mode, and one total shared by two gateway processes."""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.records import AccountInfo
from core.ports import free_port
from gateway.executor import TaskResult
from gateway.proto.grpc_service_pb2 import ModelInferRequest
from gateway.proto.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from gateway.quota import SECOND_US, OverQuota, Quota, QuotaLimits, Window
from gateway.server import Gateway, start, token_auth
from gateway.settings import GatewaySettings
from gateway.task import Task
from tests.fixtures.admin import Admin
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import let_pass
from tests.gateway.test_oip import tensor as oip_tensor
from tracker import gateway_keys
from tracker.redis_connect import connect

T0 = 1_700_000_000 * SECOND_US


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect(redis_url)
    await client.delete(gateway_keys.quota_total_keys().rate)  # the one key every quota shares
    yield client
    await client.aclose()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * SECOND_US)


def ids() -> tuple[int, str, str]:
    """An account id, a session id and a block id no other test counts under."""
    return random.randrange(10**9, 10**10), f"s-{uuid.uuid4().hex}", f"blk-{uuid.uuid4().hex[:8]}"


def quota_at(redis: Redis, limits: QuotaLimits, clock: Clock, shadow: bool = False) -> Quota:
    return Quota(redis, lambda: limits, shadow=shadow, clock=clock)


# --- The limits --------------------------------------------------------------------------


def test_limits_from_the_seeds_quota_management_data() -> None:
    data = {
        "requests_per_second_total": 100,
        "requests_per_second_per_session": 10,
        "requests_per_second_per_block_id": 10,
        "requests_per_session_id": 1000,
        "requests_per_block_id": 100,
        "something_else": "ignored",
    }
    limits = QuotaLimits.from_mapping(data)
    assert limits == QuotaLimits(100, None, 10, 10, 1000, 100, 86400.0)
    assert QuotaLimits.from_mapping({}).empty
    with pytest.raises(ValueError, match="requests_per_block_id"):
        QuotaLimits.from_mapping({"requests_per_block_id": "many"})
    with pytest.raises(ValueError, match="requests_per_second_total"):
        QuotaLimits(requests_per_second_total=0)


def test_limits_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert QuotaLimits.from_settings(GatewaySettings()).empty
    monkeypatch.setenv("CONDUIT_GATEWAY_QUOTA_REQUESTS_PER_SESSION_ID", "7")
    monkeypatch.setenv("CONDUIT_GATEWAY_QUOTA_WINDOW", "3600")
    limits = QuotaLimits.from_settings(GatewaySettings())
    assert (limits.requests_per_session_id, limits.window) == (7, 3600.0)
    assert limits.requests_per_second_total is None


async def test_no_limits_no_redis_call() -> None:
    # Nothing listens on this port: any call would fail (and fail open, logging).
    unreachable = Redis(port=free_port(), socket_connect_timeout=0.5)
    try:
        for provider in (lambda: QuotaLimits(), lambda: None):
            quota = Quota(unreachable, provider)
            assert await quota.admit(1, "s", "blk-a") is None
            assert quota._failing is False  # no call was tried
    finally:
        await unreachable.aclose()


async def test_redis_unreachable_fails_open() -> None:
    unreachable = Redis(port=free_port(), socket_connect_timeout=0.5)
    try:
        quota = Quota(unreachable, lambda: QuotaLimits(requests_per_second_total=1))
        assert await quota.admit(1, "s", "blk-a") is None
        assert quota._failing
    finally:
        await unreachable.aclose()


# --- The windows' arithmetic, at an injected clock ----------------------------------------


async def test_rate_per_session_and_its_retry_after(redis: Redis) -> None:
    account, session, block = ids()
    clock = Clock()
    quota = quota_at(redis, QuotaLimits(requests_per_second_per_session=3), clock)
    for _ in range(3):
        assert await quota.admit(account, session, block) is None
    refusal = await quota.admit(account, session, block)
    assert refusal is not None
    assert refusal.window.name == "requests_per_second_per_session"
    # T0 is on a bucket boundary: the three leave the window when their bucket (0.1 s) does.
    assert refusal.retry_after == pytest.approx(1.1)
    assert await quota.admit(account, f"{session}-other", block) is None  # another session
    clock.advance(1.1 - 1e-6)
    assert await quota.admit(account, session, block) is not None  # not yet
    clock.advance(1e-6)
    assert await quota.admit(account, session, block) is None


async def test_total_per_block_over_its_window(redis: Redis) -> None:
    account, session, block = ids()
    clock = Clock()
    limits = QuotaLimits(requests_per_block_id=2, window=60.0)  # buckets of one second
    quota = quota_at(redis, limits, clock)
    assert await quota.admit(account, session, block) is None
    clock.advance(10)
    assert await quota.admit(account + 1, f"{session}-2", block) is None  # any account
    clock.advance(10)
    refusal = await quota.admit(account, session, block)
    assert refusal is not None and refusal.window.name == "requests_per_block_id"
    assert refusal.retry_after == pytest.approx(41.0)  # when the first one's bucket leaves
    assert await quota.admit(account, session, f"{block}-other") is None
    clock.advance(41)
    assert await quota.admit(account, session, block) is None
    assert await quota.admit(account, session, block) is not None  # the second still counts


async def test_no_window_ever_holds_more_than_the_limit(redis: Redis) -> None:
    """Arrivals at random instants: every admitted one has at most ``limit`` admitted in the
    window of the limit's length ending at it, and a refusal's retry-after is when it fits."""
    account, session, block = ids()
    clock = Clock()
    limit = 5
    quota = quota_at(redis, QuotaLimits(requests_per_second_per_account=limit), clock)
    rng = random.Random(7)
    admitted: list[int] = []
    for _ in range(400):
        clock.advance(rng.expovariate(12))  # about twice the rate
        refusal = await quota.admit(account, session, block)
        if refusal is None:
            admitted.append(clock.now)
            inside = [t for t in admitted if t > clock.now - SECOND_US]
            assert len(inside) <= limit
        else:
            assert 0 < refusal.retry_after <= 1.1
    assert len(admitted) > 100  # the limit admits, it does not only refuse


#: How a check reaches Redis: every scope in one script call (one Redis, or Sentinel), or a
#: call per scope with refunds (what a Redis Cluster needs).
CALL_MODES = pytest.mark.parametrize("one_call", [True, False], ids=["one call", "per scope"])


@CALL_MODES
async def test_a_wider_refusal_gives_the_narrower_scopes_their_count_back(
    redis: Redis, one_call: bool
) -> None:
    account, session, block = ids()
    clock = Clock()
    limits = QuotaLimits(requests_per_second_per_session=1, requests_per_second_total=1)
    current: list[QuotaLimits] = [limits]
    quota = Quota(redis, lambda: current[0], clock=clock)
    quota.one_call = one_call
    assert await quota.admit(account, f"{session}-a", block) is None
    refusal = await quota.admit(account, f"{session}-b", block)
    assert refusal is not None and refusal.window.name == "requests_per_second_total"
    # Session b's count was given back: without the total, it is admitted at the same instant.
    current[0] = QuotaLimits(requests_per_second_per_session=1)
    assert await quota.admit(account, f"{session}-b", block) is None
    assert await quota.admit(account, f"{session}-b", block) is not None


@CALL_MODES
async def test_a_narrow_refusal_never_counts_in_the_wider_scopes(
    redis: Redis, one_call: bool
) -> None:
    account, session, block = ids()
    clock = Clock()
    limits = QuotaLimits(requests_per_second_per_session=1, requests_per_second_total=2)
    quota = quota_at(redis, limits, clock)
    quota.one_call = one_call
    assert await quota.admit(account, f"{session}-a", block) is None
    for _ in range(5):  # session a floods: refused by its own limit
        refused = await quota.admit(account, f"{session}-a", block)
        assert refused is not None
        assert refused.window.name == "requests_per_second_per_session"
    assert await quota.admit(account, f"{session}-b", block) is None  # the total had room
    refused = await quota.admit(account, f"{session}-c", block)
    assert refused is not None and refused.window.name == "requests_per_second_total"


def test_a_refusal_names_its_limit_and_carries_retry_after() -> None:
    error = OverQuota(Window.of("requests_per_session_id", "k", 1000, 86400), 0.2501).error()
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "requests_per_session_id" in error.message and "1000" in error.message
    assert dict(error.trailing) == {"retry-after": "1", "retry-after-ms": "251"}


# --- Over gRPC: one gateway in the test's loop ---------------------------------------------


class CountingExecutor:
    """Answers ``{}``; counts what it ran."""

    def __init__(self) -> None:
        self.ran = 0
        #: The quota of the gateway it serves (its metrics are read from it).
        self.quota: Quota | None = None

    async def run(self, account: AccountInfo, task: Task, deadline: float | None) -> TaskResult:
        self.ran += 1
        return TaskResult({})

    async def stream(self, account: AccountInfo, task: Task, deadline: float | None) -> Any:
        raise NotImplementedError


@pytest.fixture
async def serve_with(engine: AsyncEngine, redis: Redis) -> AsyncIterator[Any]:
    """Serves gateways with the given quota (and a :class:`CountingExecutor`) until the test
    ends."""
    served: list[Gateway] = []

    async def serve(limits: QuotaLimits, shadow: bool = False) -> tuple[str, CountingExecutor]:
        executor = CountingExecutor()
        settings = GatewaySettings(default_deadline=5.0)
        executor.quota = Quota(redis, lambda: limits, shadow=shadow)
        gateway = await start(
            settings, executor, token_auth(engine, settings), free_port(), quota=executor.quota
        )
        served.append(gateway)
        return f"127.0.0.1:{gateway.port}", executor

    yield serve
    for gateway in served:
        await gateway.stop(None)


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


async def infer(
    address: str, token: str, block_id: str, session_id: str = "", seq_no: int = 0
) -> tuple[grpc.StatusCode, dict[str, str]]:
    """The call's status, and its trailing metadata."""
    async with grpc.aio.insecure_channel(address) as channel:
        packet = BlockInferencePacket(block_id=block_id, session_id=session_id, seq_no=seq_no)
        try:
            await BlockInferenceServiceStub(channel).infer(packet, metadata=auth(token))
        except grpc.aio.AioRpcError as error:
            trailing = error.trailing_metadata() or ()
            return error.code(), {str(k): str(v) for k, v in trailing}
        return grpc.StatusCode.OK, {}


async def test_over_quota_is_resource_exhausted_with_retry_after_and_nothing_runs(
    serve_with: Any, admin: Admin
) -> None:
    token = admin.create_account(f"q{uuid.uuid4().hex[:10]}")
    _, session, block = ids()
    address, executor = await serve_with(QuotaLimits(requests_per_session_id=2, window=3600))
    assert (await infer(address, token, block, session, 1))[0] == grpc.StatusCode.OK
    assert (await infer(address, token, block, session, 2))[0] == grpc.StatusCode.OK
    code, trailing = await infer(address, token, block, session, 3)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(trailing["retry-after"]) >= 1
    assert 0 < int(trailing["retry-after-ms"]) <= 3600 * 1000 + 60 * 1000
    assert executor.ran == 2
    assert (await infer(address, token, block, f"{session}-2", 1))[0] == grpc.StatusCode.OK
    assert executor.ran == 3


async def test_per_block_total_over_grpc(serve_with: Any, admin: Admin) -> None:
    token = admin.create_account(f"q{uuid.uuid4().hex[:10]}")
    _, session, block = ids()
    address, executor = await serve_with(QuotaLimits(requests_per_block_id=3))
    for seq in range(3):
        assert (await infer(address, token, block, f"{session}-{seq}"))[0] == grpc.StatusCode.OK
    code, trailing = await infer(address, token, block, f"{session}-9")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry-after-ms" in trailing
    assert (await infer(address, token, f"{block}x", session))[0] == grpc.StatusCode.OK
    assert executor.ran == 4


def refusals(quota: Quota, limit: str, mode: str) -> float:
    value = quota.registry.get_sample_value(
        "conduit_gateway_quota_refusals_total", {"limit": limit, "mode": mode}
    )
    return value or 0.0


async def test_shadow_mode_admits_everything_and_counts_would_be_refusals(
    serve_with: Any, admin: Admin
) -> None:
    token = admin.create_account(f"q{uuid.uuid4().hex[:10]}")
    _, session, block = ids()
    address, executor = await serve_with(QuotaLimits(requests_per_session_id=2), True)
    for seq in range(5):
        code, _ = await infer(address, token, block, session, seq + 1)
        assert code == grpc.StatusCode.OK
    assert executor.ran == 5
    assert executor.quota is not None
    assert refusals(executor.quota, "requests_per_session_id", "shadow") == 3


# --- Two gateway processes share one count ------------------------------------------------


@pytest.mark.e2e
async def test_two_gateways_share_one_total(launcher: Launcher, admin: Admin, redis: Redis) -> None:
    """50/s over two replicas, 200 attempts at once. The block is unknown: an admitted task
    answers NOT_FOUND (the quota comes before the block is looked up), a refused one
    RESOURCE_EXHAUSTED."""
    env = {"CONDUIT_GATEWAY_QUOTA_REQUESTS_PER_SECOND_TOTAL": "50"}
    addresses = [launcher.gateway(env)[1], launcher.gateway(env)[1]]
    await redis.delete(gateway_keys.quota_total_keys().rate)
    token = admin.create_account(f"q{uuid.uuid4().hex[:10]}")
    block = f"blk-{uuid.uuid4().hex[:8]}"
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    for channel in channels:
        await channel.channel_ready()
    stubs = [BlockInferenceServiceStub(c) for c in channels]

    async def attempt(i: int) -> tuple[grpc.StatusCode, dict[str, str]]:
        packet = BlockInferencePacket(block_id=block, session_id=f"s{i}", seq_no=1)
        try:
            await stubs[i % 2].infer(packet, metadata=auth(token))
        except grpc.aio.AioRpcError as error:
            return error.code(), {str(k): str(v) for k, v in error.trailing_metadata() or ()}
        return grpc.StatusCode.OK, {}

    try:
        began = time.monotonic()
        results = await asyncio.gather(*(attempt(i) for i in range(200)))
        spanned = time.monotonic() - began
        admitted = [r for r in results if r[0] == grpc.StatusCode.NOT_FOUND]
        refused = [r for r in results if r[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert len(admitted) + len(refused) == 200, {r[0] for r in results}
        # No window of one second holds more than 50: the attempts spanned `spanned` seconds.
        assert 1 <= len(admitted) <= 50 * math.ceil(spanned)
        assert refused, "200 attempts at 50/s: some must be refused"
        waits = [int(t["retry-after-ms"]) for _, t in refused]
        assert all(int(t["retry-after"]) >= 1 for _, t in refused)
        assert all(0 < w <= 1100 for w in waits)  # a one-second window, 0.1 s buckets
        # The retry-after is honest: once the longest one told has passed, a task is admitted.
        await let_pass(max(waits) / 1000)
        assert (await attempt(0))[0] == grpc.StatusCode.NOT_FOUND
    finally:
        for channel in channels:
            await channel.close()


async def test_the_open_inference_protocol_counts_against_the_same_quota(
    serve_with: Any, admin: Admin
) -> None:
    """A block's total is one count whichever face a task came by: ``infer`` then
    ``ModelInfer`` exhaust it together, and the refusal carries retry-after."""
    token = admin.create_account(f"q{uuid.uuid4().hex[:10]}")
    _, _, block = ids()
    address, executor = await serve_with(QuotaLimits(requests_per_block_id=2, window=3600))
    assert (await infer(address, token, block))[0] == grpc.StatusCode.OK
    request = ModelInferRequest(
        model_name=block, inputs=[oip_tensor("x", "INT64", [1], int64_contents=[1])]
    )
    async with grpc.aio.insecure_channel(address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        await stub.ModelInfer(request, metadata=auth(token))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ModelInfer(request, metadata=auth(token))
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    trailing = {str(k): str(v) for k, v in refused.value.trailing_metadata() or ()}
    assert int(trailing["retry-after"]) >= 1
    assert executor.ran == 2
