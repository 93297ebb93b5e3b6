"""The ``s3`` file store: objects in a bucket of S3 or an S3-compatible server (MinIO, ...).

A put streams: the source is cut into parts of ``part_bytes`` sent through a multipart upload
(aborted on any failure, including :class:`TooLarge`), or one ``PutObject`` when the whole
stream fits in one part, so at most about one part is held in memory. Digests are computed as
the bytes pass. Connection failures, timeouts and refusals of the server map to
:class:`StoreUnavailable`; no botocore or aiohttp exception leaves this module.

One client per store, opened on first use (its credentials and connection pool) and closed by
``close``. Path-style addressing, so a server on a bare address (``http://127.0.0.1:9000``)
works; bounded retries and short connect timeouts, so a dead endpoint fails in seconds.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import IO, TYPE_CHECKING, Any, TypeVar, cast

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from files.local import Digests, check_key
from files.store import (
    CHUNK_BYTES,
    ChunkReader,
    ObjectMissing,
    OpenedObject,
    StoredObject,
    StoreUnavailable,
    TooLarge,
)

if TYPE_CHECKING:
    from aiobotocore.response import StreamingBody
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef

#: Bytes per part of a multipart upload (S3 wants at least 5 MiB for every part but the last).
PART_BYTES = 8 * 1024 * 1024
MIN_PART_BYTES = 5 * 1024 * 1024

T = TypeVar("T")

#: What a failing request or stream raises below botocore's own exceptions.
_TRANSPORT_ERRORS = (BotoCoreError, aiohttp.ClientError, OSError, asyncio.TimeoutError)
_MISSING = {"NoSuchKey", "404", "NotFound"}


class _PartBody(io.RawIOBase):
    """A read-only, seekable file over a part's buffer, without copying it.

    botocore wraps a ``bytes`` body in ``BytesIO`` (sharing it) but sends a ``bytearray`` as
    it is, which aiohttp refuses for large bodies; ``BytesIO(bytearray)`` would copy the part.
    Reads (the signature's digest, then the request itself) copy only the small chunks asked for.
    """

    def __init__(self, data: bytearray) -> None:
        super().__init__()
        self._view = memoryview(data)
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        taken = self._view[self._position : self._position + len(buffer)]
        buffer[: len(taken)] = taken
        self._position += len(taken)
        return len(taken)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._view)}
        self._position = max(0, base[whence] + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        self._view.release()
        super().close()


def _blob(body: bytearray) -> IO[bytes]:
    return cast(IO[bytes], _PartBody(body))


def _code(error: ClientError) -> tuple[str, int]:
    info: Any = error.response
    return (
        str(info.get("Error", {}).get("Code", "")),
        int(info.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0),
    )


@asynccontextmanager
async def _unavailable(what: str) -> AsyncIterator[None]:
    """Turn the client's failures during ``what`` into :class:`StoreUnavailable`."""
    try:
        yield
    except ClientError as e:
        code, status = _code(e)
        raise StoreUnavailable(f"{what}: the object store answered {status} {code}") from e
    except _TRANSPORT_ERRORS as e:
        raise StoreUnavailable(f"{what}: {type(e).__name__}: {e}") from e


class _BodyChunks(ChunkReader):
    """Chunks of a ``GetObject`` body; releasing it gives the connection back."""

    def __init__(self, body: StreamingBody, chunk_bytes: int, key: str) -> None:
        self._body = body
        self._chunk_bytes = chunk_bytes
        self._key = key

    async def _read(self) -> bytes:
        async with _unavailable(f"reading {self._key}"):
            return await self._body.read(self._chunk_bytes)

    async def _release(self) -> None:
        await self._body.__aexit__(None, None, None)


class S3Store:
    """A :class:`~files.store.FileStore` over one bucket (keys under ``prefix``)."""

    name = "s3"

    def __init__(
        self,
        *,
        bucket: str,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        prefix: str = "",
        part_bytes: int = PART_BYTES,
        connect_timeout: float = 3.0,
        read_timeout: float = 60.0,
        max_attempts: int = 3,
    ) -> None:
        if part_bytes < MIN_PART_BYTES:
            raise ValueError(f"part_bytes must be at least {MIN_PART_BYTES}")
        self.bucket = bucket
        self.prefix = prefix
        self.part_bytes = part_bytes
        self._endpoint_url = endpoint_url
        self._region = region
        self._credentials = (access_key_id, secret_access_key)
        self._config = AioConfig(
            s3={"addressing_style": "path"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            # Checksums only where S3 requires them: S3-compatible servers differ on the rest.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._stack = AsyncExitStack()
        self._client: S3Client | None = None
        self._opening = asyncio.Lock()

    async def client(self) -> S3Client:
        """The store's client, created on first use."""
        if self._client is not None:
            return self._client
        async with self._opening:
            if self._client is None:
                access_key_id, secret_access_key = self._credentials
                session = get_session()
                async with _unavailable("connecting to the object store"):
                    self._client = await self._stack.enter_async_context(
                        session.create_client(
                            "s3",
                            endpoint_url=self._endpoint_url,
                            region_name=self._region,
                            aws_access_key_id=access_key_id,
                            aws_secret_access_key=secret_access_key,
                            config=self._config,
                        )
                    )
            return self._client

    def object_key(self, key: str) -> str:
        """The object's name in the bucket (``ValueError`` for a malformed key)."""
        return self.prefix + check_key(key)

    async def _call(self, what: str, call: Callable[[S3Client], Awaitable[T]]) -> T:
        client = await self.client()
        async with _unavailable(what):
            return await call(client)

    async def put(
        self,
        key: str,
        chunks: AsyncIterable[bytes],
        *,
        content_type: str,
        max_bytes: int,
    ) -> StoredObject:
        name = self.object_key(key)
        client = await self.client()
        digests = Digests()
        upload: _Multipart | None = None
        # One part's buffer, filled in place and handed to the client as it is (no copy); the
        # next part gets a new buffer, so at most the part being sent plus one being filled
        # are held.
        part = bytearray()
        try:
            async for chunk in chunks:
                if digests.size + len(chunk) > max_bytes:
                    raise TooLarge(max_bytes)
                digests.update(chunk)
                with memoryview(chunk) as rest:
                    while rest:
                        room = self.part_bytes - len(part)
                        part += rest[:room]
                        rest = rest[room:]
                        if len(part) == self.part_bytes:
                            if upload is None:
                                upload = await _Multipart.start(
                                    client, self.bucket, name, content_type
                                )
                            await upload.send(part)
                            part = bytearray()
            if upload is None:
                etag = await self._put_whole(client, name, part, content_type)
            else:
                if part:
                    await upload.send(part)
                etag = await upload.complete()
        except BaseException:
            if upload is not None:
                await asyncio.shield(upload.abort())
            raise
        return StoredObject(
            key=key,
            size=digests.size,
            sha256=digests.sha256,
            md5=digests.md5,
            etag=etag.strip('"') or digests.md5,
        )

    async def _put_whole(
        self, client: S3Client, name: str, body: bytearray, content_type: str
    ) -> str:
        async with _unavailable(f"storing {name}"):
            answer = await client.put_object(
                Bucket=self.bucket, Key=name, Body=_blob(body), ContentType=content_type
            )
        return answer.get("ETag", "")

    async def open(self, key: str, *, chunk_bytes: int = CHUNK_BYTES) -> OpenedObject:
        name = self.object_key(key)
        client = await self.client()
        try:
            async with _unavailable(f"reading {name}"):
                answer = await client.get_object(Bucket=self.bucket, Key=name)
        except StoreUnavailable as e:
            cause = e.__cause__
            if isinstance(cause, ClientError):
                code, status = _code(cause)
                if code in _MISSING or status == 404:
                    raise ObjectMissing(key) from cause
            raise
        return OpenedObject(
            size=int(answer.get("ContentLength", 0)),
            content_type=answer.get("ContentType"),
            chunks=_BodyChunks(answer["Body"], chunk_bytes, name),
        )

    async def delete(self, key: str) -> None:
        name = self.object_key(key)
        await self._call(
            f"deleting {name}", lambda c: c.delete_object(Bucket=self.bucket, Key=name)
        )

    async def check(self) -> None:
        await self._call(
            f"reaching bucket {self.bucket}", lambda c: c.head_bucket(Bucket=self.bucket)
        )

    async def close(self) -> None:
        self._client = None
        await self._stack.aclose()


class _Multipart:
    """One multipart upload in progress: its parts so far, completed or aborted once."""

    def __init__(self, client: S3Client, bucket: str, name: str, upload_id: str) -> None:
        self._client = client
        self._bucket = bucket
        self._name = name
        self._upload_id = upload_id
        self._parts: list[CompletedPartTypeDef] = []

    @classmethod
    async def start(cls, client: S3Client, bucket: str, name: str, content_type: str) -> _Multipart:
        async with _unavailable(f"starting an upload of {name}"):
            answer = await client.create_multipart_upload(
                Bucket=bucket, Key=name, ContentType=content_type
            )
        return cls(client, bucket, name, answer["UploadId"])

    async def send(self, body: bytearray) -> None:
        number = len(self._parts) + 1
        async with _unavailable(f"storing part {number} of {self._name}"):
            answer = await self._client.upload_part(
                Bucket=self._bucket,
                Key=self._name,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=_blob(body),
            )
        self._parts.append({"PartNumber": number, "ETag": answer["ETag"]})

    async def complete(self) -> str:
        async with _unavailable(f"completing the upload of {self._name}"):
            answer = await self._client.complete_multipart_upload(
                Bucket=self._bucket,
                Key=self._name,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            )
        return answer.get("ETag", "")

    async def abort(self) -> None:
        """Drop the parts sent so far; best effort (the store may be what failed)."""
        try:
            await self._client.abort_multipart_upload(
                Bucket=self._bucket, Key=self._name, UploadId=self._upload_id
            )
        except (ClientError, *_TRANSPORT_ERRORS):
            return
