"""File references in a prediction's input (``Files.input_links``), against the real ``files``
table and a store in a directory: where they are found, which are refused, what they become."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from files.links import FileLinks
from files.service import Files
from files.settings import FileSettings
from tests.fixtures.admin import Admin
from tracker.stream_urls import StreamSigner

API = "http://api.test"


async def _account(admin: Admin, engine: AsyncEngine) -> int:
    name = f"refs-{uuid.uuid4().hex[:8]}"
    admin.create_account(name)
    async with engine.connect() as conn:
        query = sa.text("SELECT id FROM accounts WHERE name = :name")
        return int((await conn.execute(query, {"name": name})).scalar_one())


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.fixture
def files(engine: AsyncEngine, tmp_path: Path) -> Files:
    settings = FileSettings(dir=tmp_path, input_link_ttl=600)
    signer = StreamSigner(key=secrets.token_bytes(32))
    return Files(engine, settings.store(), FileLinks(API, signer), settings)


async def test_references_anywhere_in_the_input_are_checked_and_linked(
    files: Files, engine: AsyncEngine, admin: Admin
) -> None:
    mine, theirs = await _account(admin, engine), await _account(admin, engine)
    own = await files.save_upload(mine, "cat.png", "image/png", _chunks(b"png"), {})
    other = await files.save_upload(theirs, "dog.png", "image/png", _chunks(b"png"), {})
    gone = await files.save_upload(mine, "old.png", "image/png", _chunks(b"png"), {})
    assert await files.delete(mine, gone.id)
    given = {
        "image": f"https://elsewhere.example/v1/files/{own.id}",
        "masks": [f"{API}/v1/files/{other.id}", {"deep": f"{API}/v1/files/{gone.id}"}],
        "prompt": "a cat",
        "data": "data:text/plain;base64,aGk=",
        "not_exactly": f"{API}/v1/files/{own.id}/extra",
        "count": 3,
    }
    linked, errors = await files.input_links(mine, given)
    assert [(e.field, e.message) for e in errors] == [
        ("input.masks.0", "file not found"),
        ("input.masks.1.deep", "file not found"),
    ]
    url = linked["image"]
    assert url.startswith(f"{API}/v1/files/{own.id}/") and url.endswith("/cat.png")
    record, opened = await files.open_delivery(own.id, urlsplit(url).path.split("/")[4])
    assert record.id == own.id
    assert b"".join([chunk async for chunk in opened.chunks]) == b"png"
    # Refused references and everything that is no reference stay as they were.
    assert {k: v for k, v in linked.items() if k != "image"} == {
        k: v for k, v in given.items() if k != "image"
    }


async def test_an_input_without_references_comes_back_as_is(files: Files) -> None:
    given = {"prompt": "no files here", "list": [1, "two"]}
    linked, errors = await files.input_links(1, given)
    assert linked is given and errors == []
