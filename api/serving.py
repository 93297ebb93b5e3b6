"""Prediction use cases behind the routes: create (through the front door, :mod:`front`),
cancel, get, list."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.engine import RowMapping

from api.deps import Resources
from api.errors import InvalidInput, NotFound
from api.idempotency import Idempotency
from api.pagination import decode_cursor, encode_cursor
from api.prediction_filters import PredictionFilters
from api.protocol import PredictionCreate
from catalog.records import AccountInfo
from core.logs import REQUEST_ID
from core.ssrf import BlockedAddress, check_webhook_url
from front.admission import honoured, new_prediction
from front.destinations import Destination, check_text
from tracker import store
from tracker.keyset import PageKey
from tracker.priority import Priority
from tracker.render import PredictionLinks, render_prediction
from tracker.states import Status

T = TypeVar("T")


async def create(
    resources: Resources,
    account: AccountInfo,
    destination: Destination,
    body: PredictionCreate,
    cancel_after: timedelta | None = None,
    idempotency: Idempotency | None = None,
    priority: Priority | None = None,
) -> tuple[RowMapping, bool]:
    """Admit, commit the row, then append to the queue: a 201 is never lost.

    Returns the row and whether it is a replay: with ``idempotency``, a key already used for
    the same request gives back that prediction, and nothing is stored or queued. ``priority``
    is the one requested; the one stored is what the account is entitled to
    (:func:`front.admission.honoured`).
    """
    front = resources.front
    input_json = front.admission.input(destination, body.input)
    await front.admission.files(account.id, body.input)
    webhook, events = body.webhook, body.webhook_events_filter
    if webhook is None and body.webhook_completed:
        webhook, events = body.webhook_completed, ["completed"]
    if webhook is not None:
        check_text("webhook" if body.webhook is not None else "webhook_completed", webhook)
        try:
            check_webhook_url(webhook, resources.webhooks.allow, refused=resources.webhooks.refused)
        except BlockedAddress as error:
            raise InvalidInput(str(error), errors=[_err("webhook", str(error))]) from error
    new = new_prediction(
        account,
        destination,
        body.input,
        input_json,
        webhook=webhook,
        webhook_events_filter=list(events) if events is not None else None,
        deadline=datetime.now(UTC) + cancel_after if cancel_after else None,
        priority=honoured(priority, account.may_use_high_priority, destination.allow_high_priority),
        request_id=REQUEST_ID.get(),
    )
    if idempotency is None:
        # Stored, then queued; a Redis failure after the commit is answered as stored (201,
        # "starting") and left to the reconciler (``director.submit``).
        return await front.durable.submit(new, destination.target), False
    return await front.durable.submit_once(new, destination.target, idempotency.insert_once)


async def cancel(
    resources: Resources,
    account: AccountInfo,
    prediction_id: str,
    links: PredictionLinks,
    kind: str = "prediction",
) -> RowMapping:
    return await cancel_for(resources, account.id, prediction_id, links, kind)


async def cancel_for(
    resources: Resources,
    account_id: int,
    prediction_id: str,
    links: PredictionLinks,
    kind: str | None = None,
) -> RowMapping:
    """Cancel a prediction (or training: ``kind``; None: either) of ``account_id`` (the
    operator page cancels on anyone's behalf)."""
    row, canceled_now = await store.request_cancel(
        resources.engine, account_id, prediction_id, links, kind
    )
    if row is None:
        raise NotFound(f"{(kind or 'prediction').capitalize()} {prediction_id} not found")
    if not Status(row["status"]).is_terminal:
        await resources.queue.publish_cancel(prediction_id)
    elif canceled_now:
        # Canceled here while still queued: this process tells the world.
        await resources.events.finish(prediction_id, row["status"], None)
        resources.dispatcher.wake()
    return row


async def get(
    resources: Resources,
    account: AccountInfo,
    prediction_id: str,
    *,
    replica: bool = False,
    kind: str = "prediction",
) -> RowMapping:
    """``replica``: read from the read replica when there is one, and from the primary when
    the prediction is not there (yet). ``kind``: ``training`` reads a training."""
    row = None
    if replica and resources.replica is not None:
        row = await store.get_for_account(resources.replica, account.id, prediction_id, kind)
    if row is None:
        row = await store.get_for_account(resources.engine, account.id, prediction_id, kind)
    if row is None:
        raise NotFound(f"{kind.capitalize()} {prediction_id} not found")
    return row


async def list_page(
    resources: Resources,
    account: AccountInfo,
    links: PredictionLinks,
    cursor: str | None,
    filters: PredictionFilters,
    kind: str = "prediction",
) -> dict[str, Any]:
    """One page of the account's predictions (or trainings: ``kind``), newest first."""
    limit = resources.settings.page_size
    after, before = read_cursor(cursor)
    rows = await store.list_for_account(
        resources.reads,
        account.id,
        after=after,
        before=before,
        limit=limit + 1,
        created_after=filters.created_after,
        created_before=filters.created_before,
        source=filters.source,
        kind=kind,
    )
    page, next_url, previous_url = keyset_page(
        rows,
        after,
        before,
        limit,
        f"{links.base_url}/v1/{kind}s?{filters.query()}cursor=",
        lambda row: PageKey(row["created_at"], row["id"]),
    )
    return {
        "next": next_url,
        "previous": previous_url,
        "results": [render_prediction(row, links) for row in page],
    }


def read_cursor(cursor: str | None) -> tuple[PageKey | None, PageKey | None]:
    """(after, before): where a newest-first page starts, from its ``cursor``."""
    if not cursor:
        return None, None
    key, direction = decode_cursor(cursor)
    return (key, None) if direction == "next" else (None, key)


def keyset_page(
    rows: Sequence[T],
    after: PageKey | None,
    before: PageKey | None,
    limit: int,
    url: str,
    key: Callable[[T], PageKey],
) -> tuple[Sequence[T], str | None, str | None]:
    """A page and its next and previous URLs, from up to ``limit + 1`` newest-first rows read
    after or before a cursor's key (the extra row only says there is more)."""
    more = len(rows) > limit
    if before is not None:
        rows = rows[1:] if more else rows
        has_next, has_previous = True, more
    else:
        rows = rows[:limit]
        has_next, has_previous = more, after is not None
    next_url = url + encode_cursor(key(rows[-1]), "next") if rows and has_next else None
    previous_url = url + encode_cursor(key(rows[0]), "previous") if rows and has_previous else None
    return rows, next_url, previous_url


def _err(field: str, message: str) -> dict[str, str]:
    return {"field": field, "message": message}
