"""The gateway running tasks on a live stack: ``conduit gateway`` against the session's api,
a director and a runner of the ``inspect`` fixture model (``tests.fixtures.inspect_model``),
Redis and Postgres. Each task is a prediction on the durable path; what reached the model is
what the model answers."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest

from gateway.proto.inference_pb2 import AIOSPacket, BlockInferencePacket, FileInfo
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.gateway_stack import Live
from tests.fixtures.waiting import until

MIB = 1024 * 1024


@pytest.fixture
async def stub(live: Live) -> AsyncIterator[BlockInferenceServiceStub]:
    limit = 128 * MIB
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    async with grpc.aio.insecure_channel(live.address, options=options) as channel:
        yield BlockInferenceServiceStub(channel)


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def task(block_id: str, data: dict[str, Any] | None = None, **fields: Any) -> BlockInferencePacket:
    return BlockInferencePacket(block_id=block_id, data=json.dumps(data or {}), **fields)


async def predictions(live: Live, token: str) -> list[dict[str, Any]]:
    """The account's predictions, newest first."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=live.api_url, headers=headers) as client:
        answer = await client.get("/v1/predictions")
        answer.raise_for_status()
        results: list[dict[str, Any]] = answer.json()["results"]
        return results


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def statuses(live: Live, token: str) -> list[str]:
    return [p["status"] for p in await predictions(live, token)]


async def test_a_task_runs_as_a_prediction_and_answers_its_output(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    answer: AIOSPacket = await stub.infer(
        task(live.block, {"prompt": "hi", "messages": [{"role": "user"}]}, session_id="", seq_no=7),
        metadata=auth(token),
    )
    assert json.loads(answer.data) == {"got": {"prompt": "hi", "messages": [{"role": "user"}]}}
    assert answer.seq_no == 7
    [made] = await predictions(live, token)
    assert made["status"] == "succeeded" and made["source"] == "gateway"
    assert made["input"] == {"prompt": "hi", "messages": [{"role": "user"}]}


async def test_invalid_input_names_the_field_and_queues_nothing(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.infer(task(live.block, {"delay": "soon"}), metadata=auth(token))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("data.delay: ")
    with pytest.raises(grpc.aio.AioRpcError) as unstorable:
        await stub.infer(task(live.block, {"prompt": "a\u0000b"}), metadata=auth(token))
    assert unstorable.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "data.prompt" in unstorable.value.details()
    assert await predictions(live, token) == []


async def test_an_unknown_and_an_invisible_block_are_answered_alike(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    details = []
    for block_id in ("blk-zzzzzzzz", live.private_block):
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.infer(task(block_id), metadata=auth(token))
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND
        details.append(missing.value.details().replace(block_id, "<id>"))
    assert details[0] == details[1]


async def test_a_block_no_runner_serves_is_unavailable_and_nothing_queued(
    stub: BlockInferenceServiceStub, live: Live
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.infer(task(live.private_block), metadata=auth(live.private_owner_token))
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    assert await predictions(live, live.private_owner_token) == []


async def test_a_failed_prediction_is_aborted_with_the_models_error(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await stub.infer(task(live.block, {"fail": True}), metadata=auth(token))
    assert failed.value.code() is grpc.StatusCode.ABORTED
    assert "inspect failed as asked" in failed.value.details()


async def test_files_reach_the_model_as_files(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    first, second, single = b"\x89PNG" + b"1" * (3 * MIB), b"2" * 1000, b"3" * 5000
    answer = await stub.infer(
        task(
            live.block,
            {"task": "detect"},
            files=[
                FileInfo(metadata='{"file_name": "a.png"}', file_data=first),
                FileInfo(metadata='{"file_name": "b.bin"}', file_data=second),
                FileInfo(metadata='{"field": "file", "file_name": "c.txt"}', file_data=single),
            ],
        ),
        metadata=auth(token),
    )

    def digest(data: bytes) -> dict[str, Any]:
        return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    got = json.loads(answer.data)["got"]
    assert got == {
        "task": "detect",
        "files": [digest(first), digest(second)],
        "file": digest(single),
    }
    [made] = await predictions(live, token)
    assert all("/v1/files/" in url for url in made["input"]["files"])  # stored, by reference


async def files_of(live: Live, token: str) -> list[dict[str, Any]]:
    """The account's uploads (one page is enough: the tests store a few)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=live.api_url, headers=headers) as client:
        answer = await client.get("/v1/files")
        answer.raise_for_status()
        results: list[dict[str, Any]] = answer.json()["results"]
        return results


async def test_a_task_past_its_files_cap_stores_no_file(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    """``CONDUIT_GATEWAY_TASK_MAX_FILES`` (64) files at most: the 65th refuses the task before
    any file is stored or any prediction made."""
    empty = [FileInfo(metadata="{}") for _ in range(65)]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.infer(task(live.block, {"task": "detect"}, files=empty), metadata=auth(token))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "files: 65 files; a task carries at most 64"
    assert await files_of(live, token) == []
    assert await predictions(live, token) == []


async def test_a_block_id_not_of_its_shape_is_refused_quoting_a_prefix(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.infer(task("blk-" + "x" * MIB), metadata=auth(token))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details()
    assert details.startswith("block_id: not a block id") and len(details) < 300


async def test_the_deadline_ends_the_call_and_cancels_the_prediction(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await stub.infer(task(live.block, {"delay": 60}), metadata=auth(token), timeout=2)
    assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    await until(
        lambda: _is(statuses(live, token), ["canceled"]),
        "the prediction canceled",
        timeout=30,
    )


async def test_a_client_that_cancels_its_call_cancels_the_prediction(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    call = stub.infer(task(live.block, {"delay": 60}), metadata=auth(token))
    await until(
        lambda: _is(statuses(live, token), ["processing"]),
        "the prediction running",
        timeout=30,
    )
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await until(
        lambda: _is(statuses(live, token), ["canceled"]),
        "the prediction canceled",
        timeout=30,
    )


async def test_a_session_pair_runs_once_and_replays_its_answer(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    packet = task(live.block, {"prompt": "once", "delay": 0.5}, session_id="s-1", seq_no=3)
    answers = await asyncio.gather(*(stub.infer(packet, metadata=auth(token)) for _ in range(3)))
    again = await stub.infer(packet, metadata=auth(token))
    assert {a.SerializeToString() for a in [*answers, again]} == {again.SerializeToString()}
    assert json.loads(again.data) == {"got": {"prompt": "once"}}
    assert len(await predictions(live, token)) == 1
    # Another account's session of the same name is its own.
    other = await stub.infer(packet, metadata=auth(live.private_owner_token))
    assert json.loads(other.data) == {"got": {"prompt": "once"}}


async def test_a_failed_task_is_not_replayed_but_runs_again(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    packet = task(live.block, {"fail": True}, session_id="s-2", seq_no=1)
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.infer(packet, metadata=auth(token))
        assert failed.value.code() is grpc.StatusCode.ABORTED
    assert len(await predictions(live, token)) == 2


async def test_tasks_of_a_session_run_in_seq_no_order(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    first = asyncio.ensure_future(
        stub.infer(
            task(live.block, {"prompt": "1", "delay": 3.0}, session_id="s-3", seq_no=1),
            metadata=auth(token),
        )
    )
    await until(lambda: _is(statuses(live, token), ["processing"]), "the first running", timeout=30)
    second = await stub.infer(
        task(live.block, {"prompt": "2"}, session_id="s-3", seq_no=2), metadata=auth(token)
    )
    assert first.done()  # the second was held until the first had answered
    assert json.loads((await first).data) == {"got": {"prompt": "1"}}
    assert json.loads(second.data) == {"got": {"prompt": "2"}}
    later, earlier = await predictions(live, token)  # newest first
    assert later["created_at"] >= earlier["completed_at"]
