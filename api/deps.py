"""Request dependencies: the app's shared resources and the authenticated account."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from redis.asyncio import Redis
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from api.cache import Catalog
from api.errors import Unauthenticated
from api.event_hub import EventHub
from api.settings import ApiSettings
from director.queue import Queue
from tracker.catalog import AccountInfo
from tracker.deliveries import Dispatcher
from tracker.events import EventLog
from tracker.group_commit import Batcher
from tracker.store import NewPrediction
from tracker.webhooks import WebhookPolicy


@dataclass
class Resources:
    """Opened once in the lifespan, closed at exit; never per request."""

    settings: ApiSettings
    engine: AsyncEngine
    redis: Redis
    queue: Queue
    catalog: Catalog
    events: EventLog
    #: The process's one reader of event streams, for every ``Prefer: wait`` and SSE client.
    hub: EventHub
    webhooks: WebhookPolicy
    dispatcher: Dispatcher
    #: Group commit of new predictions (:func:`tracker.store.insert_predictions`).
    new_predictions: Batcher[NewPrediction, RowMapping]

    def base_url(self, request: Request) -> str:
        if self.settings.public_url:
            return self.settings.public_url.rstrip("/")
        return str(request.base_url).rstrip("/")


async def get_resources(request: Request) -> Resources:
    # async on purpose: FastAPI runs a plain ``def`` dependency in a worker thread, a thread
    # hand-off on every request for a dictionary lookup.
    resources: Resources = request.app.state.resources
    return resources


ResourcesDep = Annotated[Resources, Depends(get_resources)]


async def get_account(request: Request, resources: ResourcesDep) -> AccountInfo:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated()
    account = await resources.catalog.account(token.strip())
    if account is None or not account.active:
        raise Unauthenticated()
    return account


AccountDep = Annotated[AccountInfo, Depends(get_account)]
