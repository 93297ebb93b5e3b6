"""Request dependencies: the app's shared resources and the authenticated account."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from api.auth import Authenticator
from api.settings import ApiSettings
from catalog.cache import Catalog
from catalog.records import AccountInfo
from director.queue import Queue
from files.service import Files
from front.door import FrontDoor
from lane.service import Lane
from tracker.deliveries import Dispatcher
from tracker.event_hub import EventHub
from tracker.events import EventLog
from tracker.rate_limits import CreateRateLimit
from tracker.render import PredictionLinks
from tracker.stream_urls import StreamSigner
from tracker.webhooks import WebhookPolicy


@dataclass
class Resources:
    """Opened once in the lifespan, closed at exit; never per request."""

    settings: ApiSettings
    engine: AsyncEngine
    redis: Redis
    queue: Queue
    catalog: Catalog
    #: Bearer tokens: their cache, and the budget of failed attempts per client address.
    auth: Authenticator
    #: Signs and checks ``urls.stream`` (the signer of :meth:`links`).
    stream_signer: StreamSigner
    events: EventLog
    #: The process's one reader of event streams, for every ``Prefer: wait`` and SSE client.
    hub: EventHub
    webhooks: WebhookPolicy
    dispatcher: Dispatcher
    #: Resolution, admission and the durable path of every create (:mod:`front`).
    front: FrontDoor
    #: The read replica's engine (``CONDUIT_DATABASE_READ_URL``), if there is one.
    replica: AsyncEngine | None = None
    #: The synchronous lane (``/run``): permits, queue and runners of this replica.
    lane: Lane | None = None
    #: Each account's rate of uploads (``POST /v1/files``).
    upload_limit: CreateRateLimit | None = None
    #: Uploads, file outputs' delivery, and file references in inputs (``files``).
    files: Files | None = None
    #: The gateway's request log's database, when not this one.
    log_engine: AsyncEngine | None = None

    @property
    def reads(self) -> AsyncEngine:
        """Where reads that may lag a little go: the replica, else the primary."""
        return self.replica or self.engine

    def base_url(self, request: Request) -> str:
        if self.settings.public_url:
            return self.settings.public_url.rstrip("/")
        return str(request.base_url).rstrip("/")

    def links(self, request: Request) -> PredictionLinks:
        """Where the predictions this request renders point, ``urls.stream`` signed."""
        return PredictionLinks(self.base_url(request), self.stream_signer)


async def get_resources(request: Request) -> Resources:
    # async on purpose: FastAPI runs a plain ``def`` dependency in a worker thread, a thread
    # hand-off on every request for a dictionary lookup.
    resources: Resources = request.app.state.resources
    if not resources.stream_signer.ready:
        # The shared key could not be read at startup (Redis away): try again, at most every
        # few seconds; until then stream URLs are the plain ones.
        await resources.stream_signer.reload()
    return resources


ResourcesDep = Annotated[Resources, Depends(get_resources)]


async def get_account(request: Request, resources: ResourcesDep) -> AccountInfo:
    # A request with a body was authenticated before the body was read (api.body_auth).
    known: AccountInfo | None = getattr(request.state, "account", None)
    return known if known is not None else await resources.auth.account(request)


AccountDep = Annotated[AccountInfo, Depends(get_account)]


async def caller(request: Request) -> tuple[Resources, AccountInfo]:
    """The resources and the authenticated account of a create, as ``ResourcesDep`` and
    ``AccountDep`` give them, with the create counted against the account's rate
    (``tracker.rate_limits``: 429 past it). Called by the create routes and ``/run`` rather
    than declared: FastAPI's dependency solving was a measurable part of their time."""
    resources = await get_resources(request)
    account = await get_account(request, resources)
    await limit_creates(resources, account)
    return resources, account


async def limit_creates(resources: ResourcesDep, account: AccountDep) -> None:
    """One create of the account, against its rate (``tracker.rate_limits``): 429 past it. A
    dependency of the trainings' create; the other creates call it through :func:`caller`."""
    await resources.front.admission.count_creates(account.id)
