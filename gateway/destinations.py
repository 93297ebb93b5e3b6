"""Where a block's tasks run: the block resolved for an account, then what it runs through the
front door's one resolution (:meth:`front.destinations.Resolver.block`): its version, the
version's input validator and the stream its predictions are queued on.

Resolution is cached per process (``cache_ttl``, as the api caches the catalog), keyed by the
account and the block: a session's later tasks, and every step of a graph after the first
run, cost no database read. A block the account may not use is answered exactly as one that
does not exist (``NOT_FOUND``), here and in a graph."""

from __future__ import annotations

import contextlib
import time

from blocks import blocks
from blocks.blocks import BlockInfo
from blocks.graphs.schemas import block_of
from blocks.versions import served_now
from catalog.cache import TTLCache
from catalog.records import AccountInfo
from core.transient import TRANSIENT
from front.destinations import Destination, Resolver
from gateway.errors import NotFound, Unavailable
from gateway.peers import RemoteBlock, RemoteBlocks
from gateway.session_routes import SessionRoutes
from gateway.task import block_id_of, session_id_of
from tracker.fleet import FleetView

#: Seconds between reads of the fleet registry made to confirm a refusal.
FORCED_REFRESH_EVERY = 0.25


def unknown_block(block_id: str, field: str = "block_id") -> NotFound:
    """The one answer for a block that does not exist and one the account may not use."""
    return NotFound(f"no block {block_id!r}", field)


class Destinations:
    def __init__(
        self,
        resolver: Resolver,
        fleet: FleetView,
        ttl: float,
        routes: SessionRoutes | None = None,
        remote: RemoteBlocks | None = None,
    ) -> None:
        self.resolver = resolver
        self.catalog = resolver.catalog
        #: Blocks other clusters run (None: this gateway knows no other cluster).
        self.remote = remote
        self.fleet = fleet
        #: What sessions resolved, shared by the replicas (None: only this process's cache).
        self.routes = routes
        self._forced_at = -FORCED_REFRESH_EVERY
        self._blocks: TTLCache[tuple[int, str, str], BlockInfo | None] = TTLCache(ttl)

    async def find(
        self, account: AccountInfo, block_id: str, session_id: str = "", field: str = "block_id"
    ) -> Destination | None:
        """The block's destination, or None when the account may not use it (or it does not
        exist, or what it names is gone). Within a session, a block this process has not
        cached is taken from what the session resolved before (on any replica), else resolved
        and kept for the session. An id not of a block's shape is ``INVALID_ARGUMENT`` naming
        ``field``, before it is looked up or cached."""
        block_id_of(block_id, field)
        session_id_of(session_id)
        # Per session: what a session kept is its own, never another session's view.
        block = await self._blocks.get(
            (account.id, block_id, session_id),
            lambda: self._resolve(account, block_id, session_id),
        )
        if block is None:
            return None
        return await self.resolver.block(account, block)

    async def _resolve(
        self, account: AccountInfo, block_id: str, session_id: str
    ) -> BlockInfo | None:
        routes = self.routes if session_id else None
        if routes is not None:
            kept = await routes.block(account.id, session_id, block_id)
            if kept is not None:
                return kept
        block = await blocks.resolve(self.catalog.engine, account, block_id, self.catalog.grants)
        if block is not None and routes is not None:
            await routes.keep_block(account.id, session_id, block)
        return block

    async def resolve(
        self, account: AccountInfo, block_id: str, field: str = "block_id", session_id: str = ""
    ) -> Destination:
        """:meth:`find`, or ``NOT_FOUND`` naming ``field``."""
        destination = await self.find(account, block_id, session_id, field)
        if destination is None:
            raise unknown_block(block_id, field)
        return destination

    async def route(
        self, account: AccountInfo, block_id: str, session_id: str = "", field: str = "block_id"
    ) -> Destination | RemoteBlock | None:
        """Where the block runs: here (:meth:`find`), else on the other cluster that publishes
        it (only public blocks are published), else None."""
        found = await self.find(account, block_id, session_id, field)
        if found is not None or self.remote is None:
            return found
        return await self.remote.find(block_id)

    async def resolve_route(
        self, account: AccountInfo, block_id: str, field: str = "block_id", session_id: str = ""
    ) -> Destination | RemoteBlock:
        """:meth:`route`, or ``NOT_FOUND`` naming ``field``."""
        found = await self.route(account, block_id, session_id, field)
        if found is None:
            raise unknown_block(block_id, field)
        return found

    async def check_served(self, destination: Destination | RemoteBlock) -> None:
        """``UNAVAILABLE`` when the fleet registry knows no ready runner for the block (once
        the registry has been read: a gateway that could not read it yet lets tasks queue).
        The local view lags the registry by up to its refresh interval, so before refusing
        it is read again: a runner that just came up is not refused. (Another cluster's block
        is that cluster's to check, once its gateway is alive.)"""
        if isinstance(destination, RemoteBlock):
            if not destination.alive:
                raise Unavailable(
                    f"cluster {destination.cluster_id}'s gateway, which runs block "
                    f"{destination.block_id}, is not alive",
                    "block_id",
                )
            return
        if self.fleet.refreshed_at is None or self._served(destination):
            return
        now = time.monotonic()
        if now - self._forced_at >= FORCED_REFRESH_EVERY:  # a flood of refusals reads once
            self._forced_at = now
            with contextlib.suppress(*TRANSIENT):
                await self.fleet.refresh()
        if not self._served(destination):
            block = block_of(destination)
            if block.deployment is None and not destination.version.deployed:
                raise Unavailable(f"no deployment runs block {block.id}'s version", "block_id")
            raise Unavailable(f"no runner serves block {block.id} now", "block_id")

    def _served(self, destination: Destination) -> bool:
        return bool(served_now(self.fleet, block_of(destination), destination.version))
