"""This gateway as its cluster's inference server in the registry (:mod:`blocks.inference_servers`).

With a cluster id (``CONDUIT_CLUSTER_ID``) the gateway registers itself when it starts: its
address other clusters dial (``inference_server_public_url``), its name, tags and metadata
(``cluster_id`` and ``quota_management_data`` among them). A record of the same cluster and
address already there (the gateway restarted) is taken over rather than doubled. Then every
``heartbeat_interval`` it beats (alive for three intervals), publishes its cluster's blocks
when they changed, and reads its record back: the ``quota_management_data`` an operator set
there (``PUT`` with ``$set``) is the quota it enforces from then on. Stopping, it beats a last
time with no grace, so it is marked dead at once rather than three intervals later.

A beat that fails (the registry's database down) is logged and tried again at the next; the
gateway keeps serving what it serves, and other clusters stop routing to it once its grace
runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from blocks import blocks, inference_servers
from blocks.inference_servers import InferenceServerRecord, PublishedBlock
from core.periodic import Periodic
from core.transient import TRANSIENT
from gateway.quota import LIMIT_NAMES, QuotaLimits
from gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

#: Heartbeats a server may miss before it is marked dead.
MISSED_BEATS = 3


def quota_data(limits: QuotaLimits) -> dict[str, Any]:
    """``quota_management_data`` for the limits that are set (and the window)."""
    data: dict[str, Any] = {
        name: getattr(limits, name) for name in LIMIT_NAMES if getattr(limits, name) is not None
    }
    data["window"] = limits.window
    return data


class ClusterMembership:
    """Registers the gateway, heartbeats, publishes the blocks; :meth:`limits` is the quota
    its record holds (for :class:`gateway.quota.Quota`)."""

    def __init__(
        self,
        settings: GatewaySettings,
        registry_engine: AsyncEngine,
        blocks_engine: AsyncEngine,
        address: str = "",
    ) -> None:
        """``address``: where this gateway listens, the URL published unless
        ``advertise_url`` names another (settable until :meth:`start`)."""
        assert settings.cluster_id is not None
        self.settings = settings
        self.cluster_id = settings.cluster_id
        self.registry = registry_engine
        self.blocks = blocks_engine
        self.url = settings.advertise_url or address
        self.interval = settings.heartbeat_interval
        self.server_id: str | None = None
        self._published: list[PublishedBlock] | None = None
        self._limits = QuotaLimits.from_settings(settings)
        self._beats: Periodic | None = None
        #: Called with each record read back (tests and the quota see the registry's view).
        self.on_record: Callable[[InferenceServerRecord], None] | None = None

    def limits(self) -> QuotaLimits:
        return self._limits

    async def start(self) -> None:
        """Register and beat once (a failure here is the caller's: the gateway does not start
        half a member), then beat every interval."""
        await self._beat()
        self._beats = Periodic(
            "registry heartbeat", self.interval, self._beat, "registry heartbeat", log, TRANSIENT
        )
        self._beats.start()

    async def stop(self) -> None:
        if self._beats is not None:
            await self._beats.stop()
        if self.server_id is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    inference_servers.heartbeat(self.registry, self.server_id, 0), 5
                )

    async def _beat(self) -> None:
        if self.server_id is None:
            self.server_id = await self._register()
        record = await inference_servers.heartbeat(
            self.registry, self.server_id, self.interval * MISSED_BEATS
        )
        if record is None:  # deleted by an operator: register anew
            self.server_id, self._published = None, None
            self.server_id = await self._register()
            record = await inference_servers.heartbeat(
                self.registry, self.server_id, self.interval * MISSED_BEATS
            )
            assert record is not None
        await self._publish()
        self._read(record)

    async def _register(self) -> str:
        mine = {
            "inference_server_metadata.cluster_id": self.cluster_id,
            "inference_server_public_url": self.url,
        }
        found = await inference_servers.query(self.registry, mine, limit=1)
        if found:
            log.info("registry: taking over server %s of cluster %s", found[0].id, self.cluster_id)
            return found[0].id
        settings = self.settings
        doc = {
            "inference_server_name": settings.server_name or f"conduit-{self.cluster_id}",
            "inference_server_metadata": {
                **settings.server_metadata,
                "cluster_id": self.cluster_id,
                "quota_management_data": quota_data(self._limits),
            },
            "inference_server_tags": settings.server_tags,
            "inference_server_public_url": self.url,
        }
        record = await inference_servers.create(self.registry, doc)
        log.info("registry: registered server %s of cluster %s", record.id, self.cluster_id)
        return record.id

    async def _publish(self) -> None:
        assert self.server_id is not None
        current = [
            PublishedBlock(block_id, metadata, public)
            for block_id, metadata, public in await blocks.published(self.blocks)
        ]
        if current != self._published:
            await inference_servers.publish_blocks(self.registry, self.server_id, current)
            self._published = current

    def _read(self, record: InferenceServerRecord) -> None:
        metadata = record.doc.get("inference_server_metadata") or {}
        data = metadata.get("quota_management_data")
        if isinstance(data, dict):
            try:
                limits = QuotaLimits.from_mapping(data, self.settings.quota_window)
            except (TypeError, ValueError) as error:
                log.warning("registry: quota_management_data ignored: %s", error)
            else:
                if limits != self._limits:
                    log.info("registry: quota now %s", quota_data(limits))
                self._limits = limits
        if self.on_record is not None:
            self.on_record(record)
