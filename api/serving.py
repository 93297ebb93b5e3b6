"""Prediction use cases behind the routes: resolve, validate, store, enqueue, cancel, list."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.engine import RowMapping

from api.deps import Resources
from api.errors import InvalidInput, NotFound, invalid_input
from api.idempotency import Idempotency
from api.pagination import decode_cursor, encode_cursor
from api.prediction_filters import PredictionFilters
from api.priority import honoured
from api.protocol import PredictionCreate
from catalog.lookups import AccountInfo, VersionInfo
from core.ids import new_prediction_id
from core.logs import REQUEST_ID
from core.ssrf import BlockedAddress, check_webhook_url
from director.submit import enqueue_stored, submit
from tracker import store
from tracker.input_checks import RefusedInput, canonical_input, check_input, text_problem
from tracker.keys import Target
from tracker.keyset import PageKey
from tracker.priority import Priority
from tracker.render import PredictionLinks, render_prediction
from tracker.states import Status
from tracker.store import NewPrediction

T = TypeVar("T")

VERSION_ID = re.compile(r"^[0-9a-f]{64}$")
QUALIFIED_VERSION = re.compile(r"^(?P<owner>[^/\s]+)/(?P<name>[^/:\s]+):(?P<id>[0-9a-f]{64})$")
MODEL_NAME = re.compile(r"^(?P<owner>[^/\s:]+)/(?P<name>[^/\s:]+)$")


@dataclass(frozen=True, slots=True)
class Destination:
    """What a create request resolved to."""

    version: VersionInfo
    validator: Any
    target: Target
    deployment_id: int | None = None
    deployment: str | None = None
    #: The deployment honours ``X-Priority: high`` from anyone who may run it.
    allow_high_priority: bool = False
    #: A training (``Target.training``): the model its new version goes to.
    trains_into: str | None = None


async def resolve_version_field(
    resources: Resources, account: AccountInfo, version: str | None
) -> Destination:
    """``version`` on ``POST /v1/predictions``: a 64-hex id, ``owner/name:id`` or ``owner/name``."""
    if not version:
        raise InvalidInput("version is required", errors=[_err("version", "Field required")])
    _check_text("version", version)
    qualified = QUALIFIED_VERSION.match(version)
    if qualified:
        return await _version_destination(
            resources, account, qualified["id"], qualified["owner"], qualified["name"]
        )
    if VERSION_ID.match(version):
        return await _version_destination(resources, account, version, None, None)
    named = MODEL_NAME.match(version)
    if named:
        return await resolve_model(
            resources, account, named["owner"], named["name"], field="version"
        )
    raise InvalidInput(
        "version must be a 64-character version id, owner/name:version_id or owner/name",
        errors=[_err("version", "not a version id")],
    )


async def _version_destination(
    resources: Resources,
    account: AccountInfo,
    version_id: str,
    owner: str | None,
    name: str | None,
) -> Destination:
    # A version of a model the account may not see does not exist for it: same answer.
    found = await resources.catalog.version(account, version_id)
    if found is None or (owner is not None and found[0].model != f"{owner}/{name}"):
        raise InvalidInput(
            f"Version {version_id} does not exist", errors=[_err("version", "unknown version")]
        )
    info, validator = found
    if not info.deployed:
        raise InvalidInput(
            f"Version {version_id} of {info.model} is not run by any deployment",
            errors=[_err("version", "no deployment runs this version")],
        )
    return Destination(info, validator, Target.version(info.id, info.shards))


async def resolve_model(
    resources: Resources, account: AccountInfo, owner: str, name: str, field: str | None = None
) -> Destination:
    model = await resources.catalog.model(account, owner, name)
    if model is None or model.latest_version_id is None:
        message = f"Model {owner}/{name} does not exist or has no versions"
        if field:
            raise InvalidInput(message, errors=[_err(field, "unknown model")])
        raise NotFound(message)
    return await _version_destination(resources, account, model.latest_version_id, None, None)


async def resolve_deployment(
    resources: Resources, account: AccountInfo, owner: str, name: str
) -> Destination:
    deployment = await resources.catalog.deployment(account, owner, name)
    if deployment is None:
        raise NotFound(f"Deployment {owner}/{name} does not exist")
    if deployment.withdrawal is not None:
        raise NotFound(deployment.withdrawal)
    found = await resources.catalog.released_version(deployment)
    if found is None:
        raise NotFound(f"Deployment {owner}/{name} runs a version that no longer exists")
    info, validator = found
    return Destination(
        info,
        validator,
        Target.deployment(deployment.full_name, deployment.shards),
        deployment_id=deployment.id,
        deployment=deployment.full_name,
        allow_high_priority=deployment.allow_high_priority,
    )


async def create(
    resources: Resources,
    account: AccountInfo,
    destination: Destination,
    body: PredictionCreate,
    cancel_after: timedelta | None = None,
    idempotency: Idempotency | None = None,
    priority: Priority | None = None,
) -> tuple[RowMapping, bool]:
    """Validate, commit the row, then append to the queue: a 201 is never lost.

    Returns the row and whether it is a replay: with ``idempotency``, a key already used for
    the same request gives back that prediction, and nothing is stored or queued. ``priority``
    is the one requested; the one stored is what the account is entitled to
    (:func:`api.priority.honoured`).
    """
    input_json = checked_input(destination, body.input, resources.settings.max_input_depth)
    await check_file_references(resources, account, body.input)
    webhook, events = body.webhook, body.webhook_events_filter
    if webhook is None and body.webhook_completed:
        webhook, events = body.webhook_completed, ["completed"]
    if webhook is not None:
        _check_text("webhook" if body.webhook is not None else "webhook_completed", webhook)
        try:
            check_webhook_url(webhook, resources.webhooks.allow, refused=resources.webhooks.refused)
        except BlockedAddress as error:
            raise InvalidInput(str(error), errors=[_err("webhook", str(error))]) from error
    target = destination.target
    priority = honoured(priority, account.may_use_high_priority, destination.allow_high_priority)
    new = NewPrediction(
        id=new_prediction_id(),
        account_id=account.id,
        model=destination.version.model,
        version_id=destination.version.id,
        deployment_id=destination.deployment_id,
        deployment=destination.deployment,
        input=body.input,
        input_json=input_json,
        webhook=webhook,
        webhook_events_filter=list(events) if events is not None else None,
        target=target.name,
        deadline=datetime.now(UTC) + cancel_after if cancel_after else None,
        priority=priority.value if priority is not None else None,
        request_id=REQUEST_ID.get(),
        kind="training" if destination.trains_into is not None else "prediction",
        destination=destination.trains_into,
    )
    if idempotency is None:
        # Stored, then queued; a Redis failure after the commit is answered as stored (201,
        # "starting") and left to the reconciler (``director.submit``).
        return await submit(resources.new_predictions, resources.queue, new, target), False
    async with resources.engine.begin() as conn:
        row, replayed = await idempotency.insert_once(conn, new)
    if replayed:
        return row, True
    await enqueue_stored(resources.queue, new, target)
    return row, False


def checked_input(destination: Destination, input: dict[str, Any], max_depth: int) -> bytes:
    """The input as canonical JSON bytes, once its version's schema accepts it: else 422
    naming each field, before anything is stored. A field the schema does not declare is
    refused too: Cog would drop it and the run would succeed without it."""
    try:
        # Canonical first: the schema's messages quote the values, which must be sendable.
        input_json = canonical_input(input, max_depth)
        check_input(destination.validator, input, refuse_unknown=True)
    except RefusedInput as refused:
        raise invalid_input(refused) from refused
    return input_json


def canonical(input: dict[str, Any], max_depth: int) -> bytes:
    """The input as canonical JSON bytes, else 422 naming each field."""
    try:
        return canonical_input(input, max_depth)
    except RefusedInput as refused:
        raise invalid_input(refused) from refused


async def check_file_references(
    resources: Resources, account: AccountInfo, input: dict[str, Any], base_url: str | None = None
) -> dict[str, Any]:
    """Refuse an input whose file references (``/v1/files/{id}`` URLs) name anything but the
    account's live uploads: 422 naming each field, before anything is stored. Returns the
    input as a runner gets it (each reference a signed delivery URL under ``base_url``)."""
    if resources.files is None:
        return input
    linked, errors = await resources.files.input_links(account.id, input, base_url)
    if errors:
        detail = "; ".join(f"{e.field}: {e.message}" for e in errors)
        raise InvalidInput(detail, errors=[_err(e.field, e.message) for e in errors])
    return linked


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


def _check_text(field: str, value: str) -> None:
    """Refuse a text field Postgres cannot store or a response cannot carry."""
    problem = text_problem(value)
    if problem is not None:
        raise InvalidInput(f"{field}: {problem}", errors=[_err(field, problem)])
