"""The director's inbox for runner webhooks (aiohttp.web).

Runners POST their snapshots to ``/runner/<prediction id>/<attempt>/<secret>``, the URL the
director handed the runner with that attempt's start (or attach). The secret is the attempt's
own (``Attempt.secret``, 256 random bits, drawn when the attempt was born): whoever can reach
the receiver but was not handed the URL cannot forge a prediction's output, status or times.
A URL is good for one attempt only, in one process: a restarted director, or another one that
took the prediction over, draws new secrets and hands the runner its new URL when it attaches,
so snapshots sent to an old URL feed nothing.

Every path that does not name an attempt in flight here by its secret (a wrong secret, another
attempt's, an attempt that ended, the path shape of earlier releases) gets the same 404, and
secrets are compared in constant time: the answer tells nothing about which part was wrong.

A webhook body is read as it streams (:mod:`director.webhook_body`): the runner's echo of the
input is dropped, and each output data URL past ``inline_max`` decoded bytes is streamed into
the store and replaced by its file's URL (a file the attempt sent before keeps its first URL:
stock Cog repeats an iterator's earlier outputs in every webhook). What remains may be at
most ``max_body`` (16 MiB); past it the body is refused with 413. Output files come on their
own too: a Conduit runner PUTs them to
``/runner/<prediction id>/<attempt>/<secret>/files/<name>`` (the request's
``output_file_prefix``), stock Cog to ``/upload/<name>`` (its ``--upload-url``) with the
prediction's id in ``X-Prediction-ID``, which must name an attempt in flight here (with
``CONDUIT_DIRECTOR_UPLOAD_TOKEN`` set, the path is ``/upload/<token>/<name>``). Either is
answered 201 with the file's URL in ``Location``. An output the receiver cannot keep (the
store refused a file, a snapshot past its limit) fails the prediction at once
(``Attempt.cannot_keep``): the runner's retries could not make it fit. Not so on
``/upload/``, which holds no secret of the attempt's (only its prediction's id): there a file
past the limit, or one that broke off, is refused to whoever sent it and nothing more; stock
Cog fails the prediction itself when its upload fails.

The receiver listens on loopback unless told otherwise (``CONDUIT_DIRECTOR_RECEIVER_HOST``);
``CONDUIT_DIRECTOR_RECEIVER_URL`` is how runners on other hosts reach it, when it listens on
a reachable address. Its ``/health`` and ``/metrics`` carry nothing a runner could forge.

The receiver's port is also the director's metrics and probe port: ``/metrics`` (Prometheus),
``/livez`` and ``/readyz`` (:mod:`director.probes`); set ``CONDUIT_DIRECTOR_RECEIVER_PORT``
to have a fixed one (the default, 0, takes any free port).
"""

from __future__ import annotations

import hmac
import logging
import socket
from collections.abc import AsyncIterable
from typing import Any, Protocol

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from core.unreachable import UNREACHABLE
from director.attempts import Attempt, Attempts, Stage, new_secret
from director.metrics import DirectorMetrics
from director.output_files import SAVE_ERRORS, OutputStore, save_once, unkept_reason
from director.snapshot_events import FileStart, ScanError
from director.snapshot_files import SnapshotScanner
from director.webhook_body import BodyTooLarge, Reading, reduced_snapshot
from files.store import TooLarge
from protocol.documents import PredictionResponse

log = logging.getLogger(__name__)

#: Largest snapshot body the receiver reads. Output past it reaches the director only through
#: a Conduit runner's snapshot stream, which the start request reads instead.
MAX_BODY = 16 * 1024 * 1024
#: Seconds the rest of a refused body is read and dropped before the connection closes
#: (aiohttp's default is 10): long enough for a runner on the same network to finish sending
#: and read the answer, short enough that forged uploads hold no connection for long and do
#: not hold up a director's shutdown.
LINGER = 1.0
PROBLEM_JSON = "application/problem+json"
PATH_PREFIX = "/runner/"
UPLOAD_PREFIX = "/upload/"
#: Bytes read from a request body at a time.
CHUNK_BYTES = 256 * 1024
#: Compared against when no attempt matches, so an unknown prediction costs the same as a
#: wrong secret.
_DECOY = new_secret().encode()


def _problem(status: int, title: str, detail: str, **extra: Any) -> web.Response:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return web.Response(body=orjson.dumps(body), status=status, content_type=PROBLEM_JSON)


class Probes(Protocol):
    """What ``/livez`` and ``/readyz`` ask (:class:`director.probes.Probes`)."""

    def live(self) -> tuple[bool, dict[str, Any]]: ...

    async def ready(self) -> tuple[bool, dict[str, Any]]: ...


def _probe_answer(ok: bool, checks: dict[str, Any]) -> web.Response:
    body = {"status": "ok" if ok else "unavailable", "checks": checks}
    return web.json_response(body, status=200 if ok else 503)


def _not_found() -> web.Response:
    """The one answer to every path that does not name an attempt in flight by its secret."""
    return _problem(404, "Not Found", "no attempt in flight here answers to this URL")


class Receiver:
    def __init__(
        self,
        host: str,
        port: int,
        public_url: str | None,
        attempts: Attempts,
        metrics: DirectorMetrics,
        max_body: int = MAX_BODY,
        output: OutputStore | None = None,
        upload_token: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._public_url = public_url
        self.attempts = attempts
        self.metrics = metrics
        self.max_body = max_body
        #: Where output files go; None: data URLs stay inline and uploads are refused (404).
        self.output = output
        self.upload_token = upload_token
        self._runner: web.AppRunner | None = None
        #: Set once the director is built; until then it is live and not ready (starting).
        self.probes: Probes | None = None

    @property
    def public_url(self) -> str:
        return (self._public_url or f"http://{self.host}:{self.port}").rstrip("/")

    def webhook_url(self, attempt: Attempt) -> str:
        """Where the runner sends this attempt's snapshots. The attempt must be claimed (its
        lease holds the attempt number the claim gave it)."""
        number = attempt.lease.attempt
        if number is None:
            raise ValueError(f"attempt for {attempt.prediction_id} is not claimed yet")
        return f"{self.public_url}{PATH_PREFIX}{attempt.prediction_id}/{number}/{attempt.secret}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        # One route for every /runner/ path, so a path of the wrong shape is answered exactly
        # as a wrong secret is (aiohttp's own 404 would differ).
        app.router.add_post(PATH_PREFIX + "{path:.*}", self._webhook)
        app.router.add_put(PATH_PREFIX + "{path:.*}", self._attempt_file)
        app.router.add_put(UPLOAD_PREFIX + "{path:.*}", self._cog_upload)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/livez", self._livez)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, lingering_time=LINGER)
        await self._runner.setup()
        # Bind the socket ourselves so port 0 (any free port) can be read back.
        sock = socket.create_server((self.host, self.port), reuse_port=False)
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _livez(self, request: web.Request) -> web.Response:
        if self.probes is None:
            return _probe_answer(True, {"loop": "starting"})
        return _probe_answer(*self.probes.live())

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.probes is None:
            return _probe_answer(False, {"director": "starting"})
        return _probe_answer(*await self.probes.ready())

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "inflight": len(self.attempts)})

    def _addressee(self, path: str) -> Attempt | None:
        """The attempt in flight that ``<prediction id>/<attempt>/<secret>`` names, if any."""
        parts = path.split("/")
        if len(parts) != 3:
            return None
        prediction_id, number, secret = parts
        target = self.attempts.for_prediction(prediction_id)
        expected = target.secret.encode() if target is not None else _DECOY
        # Constant time in the secret; the comparison runs whatever else is wrong.
        matches = hmac.compare_digest(expected, secret.encode())
        if target is None or not matches or str(target.lease.attempt) != number:
            return None
        return target

    async def _webhook(self, request: web.Request) -> web.Response:
        target = self._addressee(request.match_info["path"])
        if target is None:
            log.debug("runner webhook refused: no attempt in flight answers to its URL")
            return _not_found()
        output = self.output
        scanner = SnapshotScanner(output.inline_max if output is not None else None)
        reading = Reading(request.content.iter_chunked(CHUNK_BYTES))

        async def save(start: FileStart, chunks: AsyncIterable[bytes]) -> str:
            assert output is not None and target.account_id is not None
            return await save_once(
                output.files,
                target.kept_files,
                target.account_id,
                target.prediction_id,
                start.name,
                start.content_type,
                chunks,
            )

        try:
            body = await reduced_snapshot(reading, scanner, self.max_body, save)
        except BodyTooLarge:
            return self._too_large(target)
        except (ScanError, *SAVE_ERRORS, *UNREACHABLE) as error:
            if reading.error is not None or isinstance(error, ScanError):
                return self._unreadable(target, reading.error or error)
            if isinstance(error, SAVE_ERRORS):
                return self._unkept(target, error)
            raise
        try:
            snapshot = PredictionResponse.model_validate_json(body)
        except ValidationError as error:
            log.warning("bad runner webhook for %s: %s", target.prediction_id, error)
            field, why = "body", "unreadable"
            for detail in error.errors()[:1]:
                field = ".".join(str(part) for part in detail["loc"]) or field
                why = detail["msg"]
            return _problem(400, "Bad Request", f"invalid snapshot: {why} ({field})", field=field)
        target.snapshots.put_nowait(snapshot)
        return web.json_response({})

    def _unreadable(self, target: Attempt, error: BaseException) -> web.Response:
        log.warning("unreadable runner webhook for %s: %s", target.prediction_id, error)
        return _problem(400, "Bad Request", f"invalid snapshot: {error}", field="body")

    def _unkept(self, target: Attempt, error: BaseException) -> web.Response:
        """A file of the run's output the store refused: the prediction fails with it."""
        target.cannot_keep(unkept_reason(error))
        if isinstance(error, TooLarge):
            return _problem(413, "Content Too Large", str(error), field="body")
        return _problem(503, "Service Unavailable", unkept_reason(error))

    async def _attempt_file(self, request: web.Request) -> web.Response:
        """``PUT /runner/<prediction id>/<attempt>/<secret>/files/<name>``: an output file."""
        addressee, _, name = request.match_info["path"].partition("/files/")
        target = self._addressee(addressee)
        if target is None or not name:
            return _not_found()
        return await self._keep_file(request, target, name)

    async def _cog_upload(self, request: web.Request) -> web.Response:
        """``PUT /upload/[<token>/]<name>``: stock Cog's upload of an output file."""
        name = request.match_info["path"]
        if self.upload_token is not None:
            token, _, name = name.partition("/")
            if not hmac.compare_digest(token.encode(), self.upload_token.encode()):
                return _not_found()
        # A training's run is known to its trainer as ``<id>-<attempt>``.
        named, _, attempt = request.headers.get("X-Prediction-ID", "").partition("-")
        target = self.attempts.for_prediction(named)
        if target is not None and attempt and attempt != str(target.lease.attempt):
            target = None
        if target is None or target.stage is not Stage.RUNNING or not name:
            return _not_found()
        # Whoever knows a prediction's id may PUT here: a file too large is refused to the
        # uploader and leaves the prediction alone (Cog, its upload failed, fails it itself).
        return await self._keep_file(request, target, name, fail_too_large=False)

    async def _keep_file(
        self, request: web.Request, target: Attempt, name: str, fail_too_large: bool = True
    ) -> web.Response:
        if self.output is None or target.account_id is None:
            return _not_found()
        content_type = request.headers.get("Content-Type", "application/octet-stream")
        reading = Reading(request.content.iter_chunked(CHUNK_BYTES))
        try:
            url = await self.output.files.save_output(
                target.account_id, target.prediction_id, name, content_type, reading.chunks()
            )
        except (*SAVE_ERRORS, *UNREACHABLE) as error:
            if reading.error is not None:
                log.info("output file upload of %s broke off: %r", target.prediction_id, error)
                return _problem(400, "Bad Request", "the upload broke off", field="body")
            if isinstance(error, TooLarge) and not fail_too_large:
                return _problem(413, "Content Too Large", str(error), field="body")
            if isinstance(error, SAVE_ERRORS):
                return self._unkept(target, error)
            raise
        return web.json_response({"url": url}, status=201, headers={"Location": url})

    def _too_large(self, target: Attempt) -> web.Response:
        log.warning(
            "runner webhook for %s refused: body over %d bytes", target.prediction_id, self.max_body
        )
        detail = f"a snapshot may be at most {self.max_body} bytes"
        target.cannot_keep(f"the snapshot passed the limit of {self.max_body} bytes")
        return _problem(413, "Content Too Large", detail, field="body")
