"""Which models a pool host has loaded: its ``GET /v1/capabilities`` at the root lists each
slot with its state (``runners.pool``); a capabilities document without ``slots`` says the same
by ``models.loaded`` (the runner API spec's inventory). Read about once a second by a director
serving several deployments on the pool's slots (``director.read_order``)."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp

from core.unreachable import UNREACHABLE
from protocol.paths import CAPABILITIES_PATH

log = logging.getLogger(__name__)

READY = "ready"


def loaded_models(document: Any) -> frozenset[str]:
    """The models a capabilities document says are loaded and ready; none when it does not
    say (or is not a document at all)."""
    if not isinstance(document, dict):
        return frozenset()
    slots = document.get("slots")
    if isinstance(slots, list):
        return frozenset(
            str(slot["model"])
            for slot in slots
            if isinstance(slot, dict) and slot.get("state") == READY and "model" in slot
        )
    models = document.get("models")
    loaded = models.get("loaded") if isinstance(models, dict) else None
    if not isinstance(loaded, list):
        return frozenset()
    return frozenset(str(m["id"]) for m in loaded if isinstance(m, dict) and "id" in m)


class PoolSlots:
    def __init__(self, pool_url: str, session: aiohttp.ClientSession, auth: dict[str, str]) -> None:
        self.url = f"{pool_url.rstrip('/')}{CAPABILITIES_PATH}"
        self.session = session
        self.auth = auth
        #: Models loaded at the last read; none while the pool does not answer (then no model
        #: is preferred: entries are read oldest first).
        self.ready: frozenset[str] = frozenset()

    async def poll(self) -> None:
        try:
            async with self.session.get(
                self.url,
                headers=self.auth,
                timeout=aiohttp.ClientTimeout(total=5),
                allow_redirects=False,
            ) as response:
                body = await response.json(content_type=None) if response.status == 200 else None
                if response.status != 200:
                    log.debug("pool capabilities answered %d", response.status)
        except (*UNREACHABLE, ValueError) as error:
            log.debug("pool capabilities not read: %r", error)
            body = None
        ready = loaded_models(body)
        if ready != self.ready:
            log.info("pool models loaded: %s", ", ".join(sorted(ready)) or "none")
        self.ready = ready
