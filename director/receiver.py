"""The director's inbox for runner webhooks (aiohttp.web).

Runners POST their snapshots to ``/runner/<prediction id>/<attempt>``; the receiver hands each
to the attempt it belongs to (looked up in the director's registry) and answers at once. A
snapshot for an attempt that is no longer in flight (a stale runner, a previous attempt) is
acknowledged and dropped.
"""

from __future__ import annotations

import logging
import socket

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from director.attempts import Attempts
from director.metrics import REGISTRY
from runners.protocol import PredictionResponse

log = logging.getLogger(__name__)


class Receiver:
    def __init__(self, host: str, port: int, public_url: str | None, attempts: Attempts) -> None:
        self.host = host
        self.port = port
        self._public_url = public_url
        self.attempts = attempts
        self._runner: web.AppRunner | None = None

    @property
    def public_url(self) -> str:
        return self._public_url or f"http://{self.host}:{self.port}"

    def webhook_url(self, prediction_id: str, attempt: int) -> str:
        return f"{self.public_url}/runner/{prediction_id}/{attempt}"

    async def start(self) -> None:
        app = web.Application(client_max_size=128 * 1024 * 1024)
        app.router.add_post("/runner/{prediction_id}/{attempt}", self._webhook)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # Bind the socket ourselves so port 0 (any free port) can be read back.
        sock = socket.create_server((self.host, self.port), reuse_port=False)
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "inflight": len(self.attempts)})

    async def _webhook(self, request: web.Request) -> web.Response:
        prediction_id = request.match_info["prediction_id"]
        try:
            attempt = int(request.match_info["attempt"])
            snapshot = PredictionResponse.model_validate_json(await request.read())
        except (ValueError, ValidationError) as error:
            log.warning("bad runner webhook for %s: %s", prediction_id, error)
            return web.json_response({"error": "invalid payload"}, status=400)
        target = self.attempts.for_prediction(prediction_id)
        if target is None or target.lease.attempt != attempt:
            return web.json_response({"ignored": True})
        target.snapshots.put_nowait(snapshot)
        return web.json_response({})
