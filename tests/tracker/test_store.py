"""Fenced, conditional state writes against the real Postgres."""

from __future__ import annotations

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from protocol.timings import RunnerTimes
from tests.fixtures.predictions import inserted_prediction, new_predictions
from tracker import attempt_writes, keyset, store
from tracker.states import Status


async def test_claims_number_attempts_and_fence_stale_writers(engine: AsyncEngine) -> None:
    pid = await inserted_prediction(engine, "store")
    first = await attempt_writes.claim(engine, pid, "director-a")
    # director-a was found dead: director-b may take its prediction over.
    second = await attempt_writes.claim(engine, pid, "director-b", takeable=("director-a",))
    assert first is not None and second is not None
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert second["claim_owner"] == "director-b"

    # The first claimer is stale now: none of its writes land.
    assert await attempt_writes.mark_processing(engine, pid, 1) is None
    assert await attempt_writes.finish(engine, pid, 1, Status.SUCCEEDED, output="stale") is None
    assert await attempt_writes.mark_processing(engine, pid, 2) is not None
    assert await attempt_writes.save_progress(engine, pid, 1, ["x"], "stale") is False
    assert await attempt_writes.save_progress(engine, pid, 2, ["a"], "log\n") is True

    times = RunnerTimes(predict_time=0.5)
    done = await attempt_writes.finish(
        engine, pid, 2, Status.SUCCEEDED, output=["a", "b"], times=times
    )
    assert done is not None
    assert done["status"] == "succeeded" and done["output"] == ["a", "b"]
    assert done["metrics"]["predict_time"] == 0.5 and done["metrics"]["total_time"] >= 0


async def test_a_live_owners_claim_is_not_taken(engine: AsyncEngine) -> None:
    pid = await inserted_prediction(engine, "store")
    claimed = await attempt_writes.claim(engine, pid, "director-a")
    assert claimed is not None and claimed["attempt"] == 1
    # A duplicate delivery elsewhere while director-a lives: nothing changes.
    assert await attempt_writes.claim(engine, pid, "director-b") is None
    assert await attempt_writes.claim(engine, pid, "director-b", takeable=("director-c",)) is None
    row = await store.get(engine, pid)
    assert row is not None and (row["attempt"], row["claim_owner"]) == (1, "director-a")
    assert await attempt_writes.mark_processing(engine, pid, 1) is not None  # its run goes on
    # The same director, restarted under its name, claims its own prediction again.
    again = await attempt_writes.claim(engine, pid, "director-a")
    assert again is not None and again["attempt"] == 2


async def test_exactly_one_terminal_state(engine: AsyncEngine) -> None:
    pid = await inserted_prediction(engine, "store")
    claimed = await attempt_writes.claim(engine, pid, "director-a")
    assert claimed is not None
    assert await attempt_writes.finish(engine, pid, 1, Status.FAILED, error="boom") is not None
    assert await attempt_writes.finish(engine, pid, 1, Status.SUCCEEDED) is None
    assert (
        await attempt_writes.claim(engine, pid, "director-b") is None
    )  # terminal: nothing to claim
    row = await store.get(engine, pid)
    assert row is not None and row["status"] == "failed" and row["error"] == "boom"


async def test_cancel_of_unclaimed_prediction_is_immediate(engine: AsyncEngine) -> None:
    pid = await inserted_prediction(engine, "store")
    row = await store.get(engine, pid)
    assert row is not None
    canceled, now = await store.request_cancel(engine, row["account_id"], pid)
    assert now and canceled is not None and canceled["status"] == "canceled"
    assert canceled["completed_at"] is not None and canceled["cancel_requested"]
    assert await attempt_writes.claim(engine, pid, "director-a") is None


async def test_cancel_of_claimed_prediction_only_flags_it(engine: AsyncEngine) -> None:
    pid = await inserted_prediction(engine, "store")
    claimed = await attempt_writes.claim(engine, pid, "director-a")
    assert claimed is not None
    flagged, now = await store.request_cancel(engine, claimed["account_id"], pid)
    assert flagged is not None and not now
    assert flagged["status"] == "starting" and flagged["cancel_requested"] is True
    assert await store.request_cancel(engine, claimed["account_id"] + 10_000, pid) == (None, False)


async def _usage(engine: AsyncEngine, pid: str) -> tuple[str, float, float] | None:
    from sqlalchemy import text

    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT status, predict_time, billable_seconds FROM usage_records "
                    "WHERE prediction_id = :id"
                ),
                {"id": pid},
            )
        ).one_or_none()
    return None if row is None else (row[0], row[1], row[2])


async def test_terminal_write_records_usage_in_the_same_statement(engine: AsyncEngine) -> None:
    ran = await inserted_prediction(engine, "store")
    assert await attempt_writes.claim(engine, ran, "director-a") is not None
    times = RunnerTimes(predict_time=1.25)
    assert await attempt_writes.finish(engine, ran, 1, Status.SUCCEEDED, times=times) is not None
    assert await _usage(engine, ran) == ("succeeded", 1.25, 1.25)

    aborted = await inserted_prediction(engine, "store")
    assert await attempt_writes.claim(engine, aborted, "director-a") is not None
    assert await attempt_writes.finish(engine, aborted, 1, Status.ABORTED) is not None
    assert await _usage(engine, aborted) == ("aborted", 0.0, 0.0)  # never ran: nothing billed

    fenced = await inserted_prediction(engine, "store")
    assert await attempt_writes.finish(engine, fenced, 7, Status.FAILED) is None
    assert await _usage(engine, fenced) is None  # no terminal state, no usage row


async def test_a_page_starts_at_its_cursor_in_the_index(engine: AsyncEngine) -> None:
    """A page deep in an account's list costs what the first one does: the cursor is a range
    condition of the (account, created_at, id) index, not a filter over every newer row (a
    cost that grew with the page's depth: 3 ms 10,000 rows deep, ``bench.scale``)."""
    news = await new_predictions(engine, [{"i": i} for i in range(200)], "pages")
    await store.insert_predictions(engine, news)
    async with engine.begin() as conn:
        # Whatever the table's statistics say, the plan must be an index scan; then the only
        # question is whether the cursor bounds the scan or filters it.
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
            await conn.execute(text(f"SET LOCAL {setting} = off"))
        account_id = news[0].account_id
        rows = await store.list_for_account(engine, account_id, after=None, before=None, limit=50)
        cursor = keyset.PageKey(rows[-1]["created_at"], rows[-1]["id"])
        c = store.predictions.c
        for after, before in ((cursor, None), (None, cursor)):
            query = store.keyset_page(
                select(c.id).where(c.account_id == account_id),
                c.created_at,
                c.id,
                after=after,
                before=before,
            ).limit(51)
            compiled = query.compile(dialect=conn.dialect)
            plan = "\n".join(
                row[0]
                for row in await conn.exec_driver_sql(f"EXPLAIN {compiled.string}", compiled.params)
            )
            assert "Index Cond: ((account_id = " in plan and "ROW(created_at, id)" in plan, plan
            assert "Filter" not in plan, plan
    every = await store.list_for_account(engine, account_id, after=None, before=None, limit=200)
    older = await store.list_for_account(engine, account_id, after=cursor, before=None, limit=50)
    assert [row["id"] for row in rows + older] == [row["id"] for row in every[:100]]
    newer = await store.list_for_account(engine, account_id, after=None, before=cursor, limit=50)
    assert [row["id"] for row in newer] == [row["id"] for row in every[:49]]
