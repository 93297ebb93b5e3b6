"""Keep webhooks away from the fleet's runners: a policy's refused endpoints follow the fleet.

A webhook URL is chosen by whoever creates a prediction, and the dispatcher sends it from
inside the network, where it may reach a runner (a stock Cog server takes ``/shutdown`` from
anyone). Cog's protocol paths are refused on every host (:func:`core.ssrf.protocol_route`);
on top of that, no webhook reaches the host and port of a runner in the fleet registry
(:mod:`tracker.fleet`), whatever its path. The registry changes as runners come and go, so the
refused endpoints are re-read in the background and the dispatcher checks them again at every
attempt, not only at create.

A runner is refused at its port on loopback too: an entry names the runner as api replicas reach
it (the pod's address), while a dispatcher in the runner's own pod reaches it on loopback. And
it is still refused for ``remember`` seconds after its entry leaves the registry: an entry
lapses when its director stops heartbeating, not when the runner stops listening.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from redis.asyncio import Redis

from core.ssrf import RefusedEndpoints, url_endpoint
from tracker.fleet import FleetEntry, FleetView

log = logging.getLogger(__name__)

#: Seconds between reads of the fleet registry.
DEFAULT_INTERVAL = 2.0
#: Seconds a runner stays refused after its entry left the registry.
DEFAULT_REMEMBER = 3600.0


class FleetTargets:
    """Installs the fleet's runner URLs into ``refused`` as the registry changes."""

    def __init__(
        self,
        fleet: Redis | FleetView,
        refused: RefusedEndpoints,
        interval: float = DEFAULT_INTERVAL,
        remember: float = DEFAULT_REMEMBER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``fleet``: Redis, to read the registry every ``interval`` seconds; or a view that
        another part of the process keeps (the api's lane), which that part starts and
        stops: the registry is then read once for both."""
        self.refused = refused
        self.remember = remember
        self.clock = clock
        #: Runner URL -> when it was last in the registry (by ``clock``).
        self._seen: dict[str, float] = {}
        self._owns_view = not isinstance(fleet, FleetView)
        if isinstance(fleet, FleetView):
            self.view = fleet
            fleet.subscribe(self.install)
        else:
            self.view = FleetView(fleet, interval, on_change=self.install)

    def install(self, entries: Mapping[str, FleetEntry]) -> None:
        """Refuse every runner of ``entries`` and those seen within ``remember`` seconds."""
        now = self.clock()
        self._seen.update((entry.url, now) for entry in entries.values())
        self._seen = {url: at for url, at in self._seen.items() if now - at <= self.remember}
        self.refused.install([*self._seen, *_on_loopback(self._seen)])
        log.debug("webhooks refuse %d runner endpoints", len(self.refused))

    async def refresh(self) -> None:
        """Read the registry now and install what it holds (raises what Redis raises)."""
        await self.view.refresh()
        self.install(self.view.entries)

    async def start(self) -> None:
        """Read once (a failure is logged), then keep following the registry until
        :meth:`stop`; a view kept by another part is already read, by it."""
        if self._owns_view:
            await self.view.start()
        self.install(self.view.entries)

    async def stop(self) -> None:
        if self._owns_view:
            await self.view.stop()


def _on_loopback(urls: Iterable[str]) -> list[str]:
    """Each URL's port on loopback (every loopback spelling counts as one)."""
    found = []
    for url in urls:
        endpoint = url_endpoint(url)
        if endpoint is not None:
            found.append(f"http://127.0.0.1:{endpoint[1]}")
    return found
