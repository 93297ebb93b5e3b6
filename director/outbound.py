"""What a director sends beyond its runner: prediction events and client webhooks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tracker.deliveries import Dispatcher, wants
from tracker.events import EventLog
from tracker.fence import Fence
from tracker.intermediate import IntermediateSender, SendSlots
from tracker.publishing import Publishing
from tracker.render import PredictionLinks
from tracker.tables import Account
from tracker.webhooks import WebhookPolicy

INTERMEDIATE_EVENTS = ("start", "output", "logs")


class Outbound:
    def __init__(
        self,
        engine: AsyncEngine,
        events: EventLog,
        policy: WebhookPolicy,
        session: aiohttp.ClientSession,
        dispatcher: Dispatcher,
        links: PredictionLinks,
    ) -> None:
        self.engine = engine
        self.events = events
        self.policy = policy
        self.session = session
        self.dispatcher = dispatcher
        #: Where rendered predictions point (webhook bodies, the final event).
        self.links = links
        self.slots = SendSlots(session, policy)
        self._secrets: dict[int, str] = {}

    async def publishing(self, row: Mapping[Any, Any], fence: Fence) -> Publishing:
        """Where one attempt publishes, every channel behind the attempt's ``fence``."""
        webhooks = None
        if any(wants(row, event) for event in INTERMEDIATE_EVENTS):
            secret = await self._secret(row["account_id"])
            webhooks = IntermediateSender(
                self.slots,
                row["webhook"],
                secret,
                row["webhook_events_filter"],
                fence,
                account_id=row["account_id"],
            )
        return Publishing(self.events, self.links, fence, self.dispatcher, webhooks)

    async def _secret(self, account_id: int) -> str:
        # Secrets never change for an account; one read per account per process.
        if account_id not in self._secrets:
            query = select(Account.webhook_secret).where(Account.id == account_id)
            async with self.engine.connect() as conn:
                self._secrets[account_id] = (await conn.execute(query)).scalar_one()
        return self._secrets[account_id]
