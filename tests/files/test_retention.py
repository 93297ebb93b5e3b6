"""The retention sweep against real Postgres and each file store backend: finished
predictions lose their data and output files after ``output_retention``, uploads go when they
expire, every pass is bounded, an unreachable store loses nothing, and sweeps side by side
share the work."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from conduit.runtime import migrate
from conduit.services import ServiceUrls
from core.ports import LOOPBACK, free_port
from files.links import FileLinks
from files.local import LocalStore
from files.retention import RetentionSweep, SweepResult
from files.s3 import S3Store
from files.service import Files
from files.settings import FileSettings
from files.store import FileStore, ObjectMissing
from tests.files.conftest import s3_store
from tests.fixtures.predictions import new_predictions
from tests.fixtures.s3_server import S3Server
from tests.fixtures.servers import create_database
from tests.fixtures.waiting import until
from tracker import store
from tracker.db import make_engine
from tracker.stream_urls import StreamSigner

SETTINGS = FileSettings(output_retention=3600, retention=86400)


@pytest.fixture(scope="module")
def retention_database(services: ServiceUrls) -> Iterator[str]:
    """A database of this module's own: a sweep takes whatever is due in the whole database,
    so other tests' rows must not be in it."""
    url = create_database(services.database_url, f"conduit_retention_{uuid.uuid4().hex[:12]}")
    migrate(url)
    yield url


@pytest.fixture
async def db(retention_database: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the module's database, emptied of predictions and files."""
    engine = make_engine(retention_database, pool_size=4)
    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE files, predictions CASCADE"))
    yield engine
    await engine.dispose()


@pytest.fixture
async def down_store(
    backend: S3Server | None, file_store: FileStore, tmp_path: Path
) -> AsyncIterator[FileStore]:
    """``file_store`` as seen through an outage: every delete fails as unavailable (a
    directory that cannot exist; nothing listening where the S3 server should be)."""
    down: FileStore
    if backend is None:
        blocker = tmp_path / "not-a-directory"
        blocker.write_bytes(b"")
        down = LocalStore(blocker / "files")
    else:
        dead = S3Server(f"http://{LOOPBACK}:{free_port()}", backend.popen)
        assert isinstance(file_store, S3Store)
        down = s3_store(dead, prefix=file_store.prefix, max_attempts=1, connect_timeout=1.0)
    yield down
    await down.close()


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def finished_prediction(
    engine: AsyncEngine, status: str | None, age: float | None
) -> tuple[str, int]:
    """A prediction with input, output and logs: ``status`` (None: still processing), ended
    ``age`` seconds ago; its id and account."""
    (new,) = await new_predictions(engine, [{"prompt": "a cat"}], "retention")
    async with engine.begin() as conn:
        await store.insert_prediction(conn, new)
        await conn.execute(
            text(
                "UPDATE predictions SET status = :status, output = CAST(:output AS jsonb), "
                "logs = 'step 1\n', "
                # A NULL age leaves it unfinished: NULL completed_at.
                "completed_at = now() - make_interval(secs => CAST(:age AS float8)) "
                "WHERE id = :id"
            ),
            {
                "id": new.id,
                "status": status or "processing",
                "output": orjson.dumps(["https://example.invalid/out.png"]).decode(),
                "age": age,
            },
        )
    return new.id, new.account_id


async def stored_file(
    engine: AsyncEngine,
    file_store: FileStore,
    account_id: int,
    *,
    prediction_id: str | None = None,
    expires_in: float | None = None,
) -> tuple[str, str]:
    """A file whose bytes are in the store: an output of ``prediction_id``, or an upload
    expiring in ``expires_in`` seconds (negative: already expired); its id and key."""
    file_id = "f" + uuid.uuid4().hex[:25]
    kind = "output" if prediction_id else "upload"
    key = (
        f"outputs/{prediction_id}/{file_id}" if prediction_id else f"uploads/{account_id}/{file_id}"
    )
    stored = await file_store.put(
        key, _chunks(b"bytes of " + file_id.encode()), content_type="text/plain", max_bytes=1024
    )
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO files (id, account_id, kind, prediction_id, name, content_type, "
                "size, sha256, md5, etag, storage_key, expires_at) VALUES (:id, :account, "
                ":kind, :prediction, 'out.txt', 'text/plain', :size, :sha256, :md5, :etag, "
                ":key, now() + make_interval(secs => CAST(:expires AS float8)))"
            ),
            {
                "id": file_id,
                "account": account_id,
                "kind": kind,
                "prediction": prediction_id,
                "size": stored.size,
                "sha256": stored.sha256,
                "md5": stored.md5,
                "etag": stored.etag,
                "key": key,
                "expires": expires_in,
            },
        )
    return file_id, key


async def in_store(file_store: FileStore, key: str) -> bool:
    try:
        opened = await file_store.open(key)
    except ObjectMissing:
        return False
    await opened.chunks.aclose()
    return True


async def file_rows(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set((await conn.execute(text("SELECT id FROM files"))).scalars())


async def prediction_data(engine: AsyncEngine, prediction_id: str) -> tuple[Any, ...]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT input, output, logs, data_removed FROM predictions WHERE id = :id"),
                {"id": prediction_id},
            )
        ).one()
    return tuple(row)


KEPT: tuple[Any, ...] = (
    {"prompt": "a cat"},
    ["https://example.invalid/out.png"],
    "step 1\n",
    False,
)
REMOVED: tuple[Any, ...] = ({}, None, "", True)


async def test_an_old_finished_prediction_loses_its_data_and_output_files(
    db: AsyncEngine, file_store: FileStore
) -> None:
    old, account = await finished_prediction(db, "succeeded", age=7200)
    recent, _ = await finished_prediction(db, "failed", age=60)
    running, _ = await finished_prediction(db, None, age=None)
    old_file, old_key = await stored_file(db, file_store, account, prediction_id=old)
    recent_file, recent_key = await stored_file(db, file_store, account, prediction_id=recent)
    running_file, running_key = await stored_file(db, file_store, account, prediction_id=running)

    result = await RetentionSweep(db, file_store, SETTINGS).sweep_once()

    assert result == SweepResult(predictions=1, output_files=1, files=1, files_left=0)
    assert await prediction_data(db, old) == REMOVED
    assert await prediction_data(db, recent) == KEPT
    assert await prediction_data(db, running) == KEPT
    assert await file_rows(db) == {recent_file, running_file}
    assert not await in_store(file_store, old_key)
    assert await in_store(file_store, recent_key) and await in_store(file_store, running_key)
    # Nothing more is due.
    assert await RetentionSweep(db, file_store, SETTINGS).sweep_once() == SweepResult()


async def test_output_retention_zero_keeps_predictions_data(
    db: AsyncEngine, file_store: FileStore
) -> None:
    old, account = await finished_prediction(db, "succeeded", age=10 * 86400)
    _, key = await stored_file(db, file_store, account, prediction_id=old)
    keep = FileSettings(output_retention=0)

    assert await RetentionSweep(db, file_store, keep).sweep_once() == SweepResult()
    assert await prediction_data(db, old) == KEPT
    assert await in_store(file_store, key)


async def test_an_expired_upload_goes_and_an_unexpired_one_stays(
    db: AsyncEngine, file_store: FileStore
) -> None:
    _, account = await finished_prediction(db, None, age=None)
    _, expired_key = await stored_file(db, file_store, account, expires_in=-1)
    live, live_key = await stored_file(db, file_store, account, expires_in=3600)

    result = await RetentionSweep(db, file_store, SETTINGS).sweep_once()

    assert result == SweepResult(files=1)
    assert await file_rows(db) == {live}
    assert not await in_store(file_store, expired_key)
    assert await in_store(file_store, live_key)


async def test_each_pass_takes_at_most_a_batch(db: AsyncEngine, file_store: FileStore) -> None:
    _, account = await finished_prediction(db, None, age=None)
    for _ in range(5):
        await finished_prediction(db, "succeeded", age=7200)
        await stored_file(db, file_store, account, expires_in=-1)
    sweep = RetentionSweep(db, file_store, SETTINGS, batch=3)

    assert await sweep.sweep_once() == SweepResult(predictions=3, files=3)
    assert len(await file_rows(db)) == 2
    assert await sweep.sweep_once() == SweepResult(predictions=2, files=2)
    assert await sweep.sweep_once() == SweepResult()
    assert await file_rows(db) == set()


async def test_a_store_outage_keeps_the_rows_for_a_later_pass(
    db: AsyncEngine, file_store: FileStore, down_store: FileStore
) -> None:
    old, account = await finished_prediction(db, "canceled", age=7200)
    output, output_key = await stored_file(db, file_store, account, prediction_id=old)
    upload, upload_key = await stored_file(db, file_store, account, expires_in=-1)

    during = await RetentionSweep(db, down_store, SETTINGS).sweep_once()

    # The prediction's data goes (Postgres alone); the files wait for the store.
    assert during == SweepResult(predictions=1, output_files=1, files=0, files_left=2)
    assert await prediction_data(db, old) == REMOVED
    assert await file_rows(db) == {output, upload}
    assert await in_store(file_store, output_key) and await in_store(file_store, upload_key)

    after = await RetentionSweep(db, file_store, SETTINGS).sweep_once()

    assert after == SweepResult(files=2)
    assert await file_rows(db) == set()
    assert not await in_store(file_store, output_key)
    assert not await in_store(file_store, upload_key)


async def test_rows_another_sweep_holds_are_skipped_not_waited_for(
    db: AsyncEngine, file_store: FileStore
) -> None:
    held_prediction, account = await finished_prediction(db, "succeeded", age=7200)
    other_prediction, _ = await finished_prediction(db, "succeeded", age=7200)
    held_file, held_key = await stored_file(db, file_store, account, expires_in=-1)
    other_file, _ = await stored_file(db, file_store, account, expires_in=-1)

    async with db.connect() as holder, holder.begin():
        # What a sweep in another replica holds while it works through its batch.
        await holder.execute(
            text("SELECT 1 FROM predictions WHERE id = :id FOR UPDATE"), {"id": held_prediction}
        )
        await holder.execute(
            text("SELECT 1 FROM files WHERE id = :id FOR UPDATE"), {"id": held_file}
        )

        result = await RetentionSweep(db, file_store, SETTINGS).sweep_once()

        assert result == SweepResult(predictions=1, files=1)
        assert await prediction_data(db, other_prediction) == REMOVED
        assert await prediction_data(db, held_prediction) == KEPT
        assert await file_rows(db) == {held_file}
        assert await in_store(file_store, held_key)

    assert await RetentionSweep(db, file_store, SETTINGS).sweep_once() == SweepResult(
        predictions=1, files=1
    )
    assert await file_rows(db) == set()
    assert other_file not in await file_rows(db)


async def test_concurrent_sweeps_share_the_work(db: AsyncEngine, file_store: FileStore) -> None:
    _, account = await finished_prediction(db, None, age=None)
    keys = []
    for _ in range(12):
        prediction, _ = await finished_prediction(db, "succeeded", age=7200)
        keys.append((await stored_file(db, file_store, account, prediction_id=prediction))[1])
        keys.append((await stored_file(db, file_store, account, expires_in=-1))[1])
    sweeps = [RetentionSweep(db, file_store, SETTINGS, batch=5) for _ in range(3)]

    results: list[SweepResult] = []
    while True:
        round_ = await asyncio.gather(*(sweep.sweep_once() for sweep in sweeps))
        results.extend(round_)
        if all(result == SweepResult() for result in round_):
            break

    # Each prediction and each file was taken by exactly one sweep.
    assert sum(result.predictions for result in results) == 12
    assert sum(result.output_files for result in results) == 12
    assert sum(result.files for result in results) == 24
    assert sum(result.files_left for result in results) == 0
    assert await file_rows(db) == set()
    assert not any([await in_store(file_store, key) for key in keys])


async def test_the_periodic_sweep_removes_what_falls_due(
    db: AsyncEngine, file_store: FileStore
) -> None:
    _, account = await finished_prediction(db, None, age=None)
    _, key = await stored_file(db, file_store, account, expires_in=-1)
    loop = RetentionSweep(db, file_store, SETTINGS).periodic(0.05)
    loop.start()
    try:
        await until(lambda: _gone(db), "the expired upload's row to go")
    finally:
        await loop.stop()
    assert not await in_store(file_store, key)


async def _gone(engine: AsyncEngine) -> bool:
    return not await file_rows(engine)


async def test_a_clock_decides_what_is_due(db: AsyncEngine, file_store: FileStore) -> None:
    recent, account = await finished_prediction(db, "succeeded", age=60)
    _, key = await stored_file(db, file_store, account, expires_in=3600)
    sweep = RetentionSweep(db, file_store, SETTINGS)
    assert await sweep.sweep_once() == SweepResult()

    sweep.clock = lambda: datetime.now(UTC) + timedelta(days=2)

    assert await sweep.sweep_once() == SweepResult(predictions=1, files=1)
    assert await prediction_data(db, recent) == REMOVED
    assert not await in_store(file_store, key)


@pytest.mark.parametrize("output_retention", [0, 3600])
async def test_output_files_live_as_long_as_their_prediction(
    db: AsyncEngine, file_store: FileStore, output_retention: int
) -> None:
    """An output stored through the service has no clock of its own: it is kept while its
    prediction runs, however long, and with ``output_retention=0`` for good."""
    running, account = await finished_prediction(db, None, age=None)
    settings = FileSettings(output_retention=output_retention)
    signer = StreamSigner(key=b"k" * 32)
    files = Files(db, file_store, FileLinks("http://conduit.test", signer), settings)
    url = await files.save_output(account, running, "out.png", "image/png", _chunks(b"png"))
    days_later = datetime.now(UTC) + timedelta(days=3)

    sweep = RetentionSweep(db, file_store, settings, clock=lambda: days_later)
    assert await sweep.sweep_once() == SweepResult()
    file_id = url.split("/v1/files/")[1].split("/")[0]
    assert await file_rows(db) == {file_id}
    record, opened = await files.open_delivery(file_id, url.split("/")[-2], "out.png")
    await opened.chunks.aclose()
    assert record.expires_at is None
