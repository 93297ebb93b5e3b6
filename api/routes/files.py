"""Files: ``POST /v1/files`` (upload), list, get, delete, and the delivery URL that serves a
file's bytes without a token (``files.links``).

An upload is read as a stream (``api.form_stream``) and goes into the file store chunk by
chunk: the body is never held whole, on disk or in memory, by the api. Two shapes are taken,
those of the official clients: a file part ``content``, and an optional ``metadata`` part with
a JSON object, as a text field (Python) or as a file part of type ``application/json`` (JS).
The api's body limit does not apply here; ``CONDUIT_FILES_MAX_BYTES`` does (413 ``content``),
and each account's quotas (``files.quota``: 403 or 413 ``file_quota``) and rate of
uploads (429). A refused body is not read to its end, nor is anything after the closing
boundary: such an answer closes the connection.
"""

from __future__ import annotations

import mimetypes
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from api import serving
from api.deps import AccountDep, Resources, ResourcesDep
from api.errors import (
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Problem,
    Unavailable,
)
from api.form_stream import Event, FormStream, Part, boundary_of
from api.openapi import operation, problems
from api.protocol import check_storable
from api.responses import FastJSONResponse
from core.nesting import TooDeep
from files.links import FileLinks, render_file
from files.names import content_type_problem
from files.quota import QuotaExceeded
from files.records import FileRecord
from files.service import Files, LinkExpired, NoSuchFile
from files.store import StoreUnavailable, TooLarge
from tracker.keyset import PageKey

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)

#: Bytes of multipart framing and small parts allowed beside the file itself.
FORM_SLACK = 1024 * 1024
#: Largest ``metadata`` part (bytes).
MAX_METADATA = 64 * 1024
#: Bytes of a refused upload still read (and dropped) so the client hears the answer.
DRAIN_BYTES = 1024 * 1024


def _files(resources: Resources) -> Files:
    if resources.files is None:
        raise Unavailable("Files are not available on this server.")
    return resources.files


def _links(resources: Resources, request: Request) -> FileLinks:
    return _files(resources).links.at(resources.base_url(request))


#: What a delivered file may do when a browser opens it: nothing but show itself.
DELIVERY_CSP = "sandbox; default-src 'none'; img-src 'self' data:; media-src 'self'"


def _field_error(field: str, message: str, kind: type[Problem] = InvalidInput) -> Problem:
    return kind(f"{field}: {message}", errors=[{"field": field, "message": message}])


def _too_large(max_bytes: int) -> Problem:
    message = f"the file exceeds the limit of {max_bytes} bytes"
    return _field_error("content", message, PayloadTooLarge)


def _store_down(error: StoreUnavailable) -> Unavailable:
    problem = Unavailable(f"The file store is unavailable; retry shortly ({error}).")
    problem.code = "store_unavailable"
    return problem


class Upload:
    """One ``POST /v1/files`` body, pulled part by part."""

    def __init__(self, events: AsyncIterator[Event], max_extra: int) -> None:
        self.events = events
        self.metadata: dict[str, Any] = {}
        #: Bytes of parts other than the file: bounded, as the body limit does not apply.
        self.extra_left = max_extra

    async def content_part(self) -> Part:
        """Read up to the ``content`` part (taking ``metadata`` on the way)."""
        async for event in self.events:
            if isinstance(event, Part):
                if event.name == "content":
                    return event
                await self._other(event)
        raise _field_error("content", "a file part named content is required")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes; then the rest of the body (a ``metadata`` part may follow), so
        that the metadata is known by the time the store holds the file."""
        async for event in self.events:
            if event is None:
                break
            if isinstance(event, bytes):
                yield event
        async for event in self.events:
            if isinstance(event, Part):
                if event.name == "content":
                    raise _field_error("content", "only one file per upload")
                await self._other(event)

    async def _other(self, part: Part) -> None:
        data = bytearray()
        # Every part other than the file counts against one budget, metadata parts too.
        limit = min(MAX_METADATA, self.extra_left) if part.name == "metadata" else self.extra_left
        async for event in self.events:
            if event is None:
                break
            if isinstance(event, bytes):
                data += event
                if len(data) > limit:
                    raise _field_error(part.name or "body", "too large", PayloadTooLarge)
        self.extra_left -= len(data)
        if part.name == "metadata":
            self.metadata.update(_metadata(bytes(data)))
            if len(orjson.dumps(self.metadata)) > MAX_METADATA:
                raise _field_error("metadata", "too large", PayloadTooLarge)

    async def drain(self) -> None:
        """Read (and drop) a little more of a refused body, so the answer reaches a client
        still sending; a body much longer than that is cut."""
        left = DRAIN_BYTES
        try:
            async for event in self.events:
                if isinstance(event, bytes):
                    left -= len(event)
                    if left <= 0:
                        return
        except Exception:  # the answer is decided already
            return


def _metadata(raw: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        raise _field_error("metadata", "must be valid JSON") from None
    if not isinstance(value, dict):
        raise _field_error("metadata", "must be a JSON object")
    try:
        check_storable(value, "metadata")  # nesting, then NUL (Postgres' JSONB cannot hold it)
    except TooDeep as error:
        raise _field_error(error.field, error.message) from None
    except ValueError as error:
        raise _field_error("metadata", str(error)) from None
    return value


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length", "")
    return int(value) if value.isdigit() else None


def _quota_problem(error: QuotaExceeded) -> Problem:
    """403 for the count of files, 413 for their bytes: ``file_quota``, naming the quota."""
    kind: type[Problem] = Forbidden if error.quota == "files" else PayloadTooLarge
    problem = _field_error("content", str(error), kind)
    problem.code = "file_quota"
    return problem


def _unread_left(request: Request, stream: FormStream) -> bool:
    """Whether the body may go on past what was read (a closing boundary came early)."""
    declared = _declared_length(request)
    return declared is None or stream.received < declared


@router.post(
    "/files",
    status_code=201,
    responses=problems(400, 401, 403, 413, 422, 429, 503),
    openapi_extra=operation(),
)
async def create_file(
    request: Request, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    """Upload a file (``multipart/form-data``: ``content``, optional ``metadata``)."""
    files = _files(resources)
    max_bytes = files.settings.max_bytes
    boundary = boundary_of(request.headers.get("content-type"))
    declared = _declared_length(request)
    stream = FormStream(request.stream(), boundary)
    upload = Upload(stream.events(), FORM_SLACK)
    try:
        if declared is not None and declared > max_bytes + FORM_SLACK:
            raise _too_large(max_bytes)
        if resources.upload_limit is not None:
            await resources.upload_limit.check(account.id)
        record = await _save(files, account.id, upload)
    except Problem as problem:
        # A little more of a refused body is read, so that a client still sending hears the
        # answer (one waiting for "100 Continue" and sent nothing yet sends nothing); the rest
        # is not: the connection goes with the answer.
        if stream.received or "100-continue" not in request.headers.get("expect", "").lower():
            await upload.drain()
        problem.headers["Connection"] = "close"
        raise
    except ClientDisconnect:
        return FastJSONResponse({}, status_code=499)  # nobody reads it; nothing was kept
    body = render_file(record, _links(resources, request))
    headers = {"Location": body["urls"]["get"]}
    if _unread_left(request, stream):
        headers["Connection"] = "close"  # what follows the closing boundary stays unread
    return FastJSONResponse(body, status_code=201, headers=headers)


async def _save(files: Files, account_id: int, upload: Upload) -> FileRecord:
    part = await upload.content_part()
    name = part.filename or "file"
    given = part.content_type
    if given is not None and (problem := content_type_problem(given)) is not None:
        raise _field_error("content_type", problem)
    content_type = given or mimetypes.guess_type(name)[0] or ""
    try:
        return await files.save_upload(
            account_id=account_id,
            name=name,
            content_type=content_type,
            chunks=upload.chunks(),
            metadata=upload.metadata,
        )
    except QuotaExceeded as error:
        raise _quota_problem(error) from None
    except TooLarge:
        raise _too_large(files.settings.max_bytes) from None
    except StoreUnavailable as error:
        raise _store_down(error) from None


@router.get("/files", responses=problems(400, 401, 503), openapi_extra=operation())
async def list_files(
    request: Request, account: AccountDep, resources: ResourcesDep, cursor: str | None = None
) -> FastJSONResponse:
    """The account's uploads, newest first, a page at a time."""
    files = _files(resources)
    links = _links(resources, request)
    limit = resources.settings.page_size
    after, before = serving.read_cursor(cursor)
    rows = await files.list(account.id, after, before, limit + 1)
    page, next_url, previous_url = serving.keyset_page(
        rows,
        after,
        before,
        limit,
        f"{links.base_url}/v1/files?cursor=",
        lambda record: PageKey(record.created_at, record.id),
    )
    results = [render_file(record, links) for record in page]
    return FastJSONResponse({"next": next_url, "previous": previous_url, "results": results})


@router.get("/files/{file_id}", responses=problems(401, 404, 503), openapi_extra=operation())
async def get_file(
    request: Request, file_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    record = await _files(resources).get(account.id, file_id)
    if record is None:
        raise NotFound(f"File {file_id} not found")
    return FastJSONResponse(render_file(record, _links(resources, request)))


@router.delete(
    "/files/{file_id}",
    status_code=204,
    responses=problems(401, 404, 503),
    openapi_extra=operation(),
)
async def delete_file(file_id: str, account: AccountDep, resources: ResourcesDep) -> Response:
    if not await _files(resources).delete(account.id, file_id):
        raise NotFound(f"File {file_id} not found")
    return Response(status_code=204)


# Not in the OpenAPI document: a capability URL the api hands out, never one a client builds.
@router.get("/files/{file_id}/{token}/{name}", include_in_schema=False)
async def deliver_file(
    file_id: str, token: str, name: str, resources: ResourcesDep
) -> StreamingResponse:
    """A file's bytes, for whoever holds its delivery URL (no token)."""
    try:
        record, opened = await _files(resources).open_delivery(file_id, token, name)
    except NoSuchFile:
        raise NotFound(f"File {file_id} not found") from None
    except LinkExpired:
        raise Forbidden(
            "The file's URL has expired; get a new one.", code="expired_signature"
        ) from None
    except StoreUnavailable as error:
        raise _store_down(error) from None
    headers = {
        "Content-Length": str(opened.size),
        "ETag": f'"{record.etag}"',
        "Content-Disposition": f"inline; filename*=UTF-8''{quote(record.name, safe='')}",
        "Cache-Control": "private",
        # As stored: a media type given to the response would gain a charset.
        "Content-Type": record.content_type,
        # The bytes are a client's or a model's, served from the api's origin: never sniffed
        # into something else, and an HTML or SVG file runs nothing here (a sandboxed,
        # script-less document of its own).
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": DELIVERY_CSP,
    }

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in opened.chunks:
                yield chunk
        finally:
            close = getattr(opened.chunks, "aclose", None)
            if close is not None:
                await close()

    return StreamingResponse(body(), headers=headers)
