"""What a task names and carries, checked at the door: ids by their shape before anything is
looked up or cached by them, files by count and bytes before any is stored."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.cache import Catalog
from catalog.records import AccountInfo
from front.destinations import Resolver
from gateway.destinations import Destinations
from gateway.errors import InvalidArgument, ResourceExhausted
from gateway.proto.inference_pb2 import BlockInferencePacket, FileInfo
from gateway.task import FileLimits, parse_packet
from tracker.fleet import FleetView

LIMITS = FileLimits(max_files=3, max_file_bytes=10)
MIB = 1024 * 1024


def test_files_within_the_limits_parse() -> None:
    files = [FileInfo(file_data=b"12345"), FileInfo(file_data=b"12345")]
    assert len(parse_packet(BlockInferencePacket(files=files), LIMITS).files) == 2


def test_too_many_files_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match=r"^files: 4 files; a task carries at most 3$"):
        parse_packet(BlockInferencePacket(files=[FileInfo()] * 4), LIMITS)


def test_too_many_file_bytes_is_resource_exhausted() -> None:
    files = [FileInfo(file_data=b"123456"), FileInfo(file_data=b"12345")]
    with pytest.raises(ResourceExhausted, match=r"^files: 11 bytes of files"):
        parse_packet(BlockInferencePacket(files=files), LIMITS)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"block_id": "blk-" + "a" * MIB}, "block_id"),
        ({"block_id": "BLK-ABCDEFGH"}, "block_id"),
        ({"block_id": "gph-abc"}, "block_id"),
        ({"session_id": "s" * 257}, "session_id"),
    ],
)
def test_ids_not_of_their_shape_are_refused_quoting_a_prefix(
    fields: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_packet(BlockInferencePacket(**fields), LIMITS)  # type: ignore[arg-type]
    assert refused.value.field == field
    assert len(refused.value.message) < 200


def test_block_and_graph_ids_and_none_parse() -> None:
    for block_id in ("blk-xhhwhwu", "blk-abcdefgh", "gph-abcd1234", ""):
        assert parse_packet(BlockInferencePacket(block_id=block_id), LIMITS).block_id == block_id


async def test_unknown_ids_not_of_a_blocks_shape_are_never_cached(
    engine: AsyncEngine, redis_url: str
) -> None:
    """A graph's or a search's block ids reach the destinations' cache without the packet's
    check: it refuses them itself, before any lookup, and keeps nothing of them."""
    redis = Redis.from_url(redis_url)
    try:
        destinations = Destinations(Resolver(Catalog(engine, 5.0)), FleetView(redis), ttl=5.0)
        account = AccountInfo(id=1, name="someone", active=True, webhook_secret="")
        for n in range(20):
            with pytest.raises(InvalidArgument, match=r"^node: not a block id"):
                await destinations.resolve(account, f"blk-{n}" + "x" * MIB, field="node")
        assert destinations._blocks._entries == {}
        assert await destinations.find(account, "blk-zzzzzzzz") is None  # well shaped: looked up
        assert len(destinations._blocks._entries) == 1
    finally:
        await redis.aclose()
