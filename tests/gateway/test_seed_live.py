"""The seed's Python examples, unmodified but for the address and a bearer token, against a
live stack: the blocks they name run the ``inspect`` model, whose answer is what reached it
(the data, the files' sizes and digests, the frame pointer; through a graph, each step's
input nested in the next one's)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.fixtures.gateway_stack import Live
from tests.gateway.conftest import generate_stubs
from tests.gateway.test_server import run_example

FRAME_PTR = {"framedb_id": "framdb-123", "key": "video-abcdef-123"}
INTERVAL = {"start_time": 90, "end_time": 210}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_stubs(tmp_path_factory.mktemp("stubs"))


async def test_seed_example_with_block_id(
    live: Live, stubs: Path, tmp_path: Path, token: str
) -> None:
    printed = await run_example("block_id.py", stubs, tmp_path, live.address, token)
    assert printed["Session ID"] == "sess-12345" and printed["Sequence No"] == "1"
    got = json.loads(printed["Data"])["got"]
    assert got["messages"][3] == {"role": "user", "content": "Can you explain it in simpler terms?"}


async def test_seed_example_with_files(live: Live, stubs: Path, tmp_path: Path, token: str) -> None:
    images = [b"\xff\xd8\xff" + b"1" * 100_000, b"\xff\xd8\xff" + b"2" * 2000]
    for n, image in enumerate(images, 1):
        (tmp_path / f"image{n}.jpg").write_bytes(image)
    printed = await run_example("files.py", stubs, tmp_path, live.address, token)
    got = json.loads(printed["Data"])["got"]
    assert got["task"] == "object_detection"
    assert got["bounding_boxes"][1]["file_index"] == 1
    assert got["files"] == [
        {"size": len(image), "sha256": hashlib.sha256(image).hexdigest()} for image in images
    ]


async def test_seed_example_with_frame_ptr(
    live: Live, stubs: Path, tmp_path: Path, token: str
) -> None:
    printed = await run_example("frame_ptr.py", stubs, tmp_path, live.address, token)
    got = json.loads(printed["Data"])["got"]
    assert json.loads(got["frame_ptr"]) == FRAME_PTR
    assert got["video_interval"] == INTERVAL


async def test_seed_example_with_a_graph(
    live: Live, stubs: Path, tmp_path: Path, token: str
) -> None:
    printed = await run_example("graph.py", stubs, tmp_path, live.address, token)
    tail = json.loads(printed["Data"])
    # blk-ksshxpiy -> blk-bfl3gbd5 -> blk-tsonq3qr: the leaf's output wraps its parent's,
    # which wraps the head's; every step got the frame pointer.
    head = tail["got"]["got"]["got"]
    assert head["task"] == "object_detection_tracking_pose_estimation"
    assert head["video_interval"] == INTERVAL
    for level in (tail["got"], tail["got"]["got"], head):
        assert json.loads(level["frame_ptr"]) == FRAME_PTR
