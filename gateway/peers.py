"""Blocks of other clusters, run through their gateways over gRPC.

A block this cluster does not have may be one another cluster publishes in the shared registry
(:func:`blocks.inference_servers.block_owner`: public blocks only); :class:`RemoteBlocks` finds it
(remembered ``cache_ttl`` seconds, as local blocks are). :class:`Peers` runs a task on it:
``infer`` on that cluster's gateway (through the generated ``BlockInferenceServiceStub``), on
one channel per cluster address kept for the process's life, with the time left of the
caller's deadline as the call's deadline, this gateway's ``peer_token`` as the bearer, and who
asked (``x-conduit-origin-account``, ``x-conduit-origin-cluster``) in the metadata.

A task sent on is never sent twice: a call that fails because the other gateway went away
fails the task (``UNAVAILABLE`` naming the cluster), since the other cluster may have run it.
Its session (``session_id``) stays here (replay and order are this gateway's), so the other
gateway gets none. The other gateway's status is answered as it is, its message prefixed with
the cluster.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import grpc
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks import inference_servers
from catalog.cache import TTLCache
from catalog.records import AccountInfo
from gateway.call_log import CURRENT_REQUEST, ORIGIN_ACCOUNT, ORIGIN_CLUSTER, PARENT_REQUEST
from gateway.errors import DeadlineExceeded, GatewayError, Unavailable
from gateway.proto.inference_pb2 import AIOSPacket, BlockInferencePacket, FileInfo
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from gateway.settings import GatewaySettings
from gateway.task import InputFile


@dataclass(frozen=True, slots=True)
class RemoteBlock:
    """A block another cluster runs: its id there, the cluster and its gateway's address."""

    block_id: str
    cluster_id: str
    url: str
    #: Whether that gateway is alive in the registry (a dead one is not called).
    alive: bool = True


class PeerError(GatewayError):
    """The other cluster's answer, with its status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class RemoteBlocks:
    """Which other cluster runs a block (None: none does)."""

    def __init__(self, engine: AsyncEngine, cluster_id: str, ttl: float) -> None:
        self.engine = engine
        self.cluster_id = cluster_id
        self._owners: TTLCache[str, RemoteBlock | None] = TTLCache(ttl)

    async def find(self, block_id: str) -> RemoteBlock | None:
        return await self._owners.get(block_id, lambda: self._load(block_id))

    async def _load(self, block_id: str) -> RemoteBlock | None:
        server = await inference_servers.block_owner(
            self.engine, block_id, exclude_cluster=self.cluster_id
        )
        if server is None or server.cluster_id is None or not server.public_url:
            return None
        return RemoteBlock(block_id, server.cluster_id, server.public_url, server.status == "alive")


@dataclass(frozen=True, slots=True)
class PeerAnswer:
    data: Any
    files: list[InputFile]


class Peers:
    """Calls to other clusters' gateways, a channel (and its stub) per address."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.cluster_id = settings.cluster_id or ""
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, BlockInferenceServiceStub] = {}
        #: Seconds a call to each cluster took lately (an exponential moving average).
        self._latency: dict[str, float] = {}

    def latency(self, cluster_id: str) -> float | None:
        return self._latency.get(cluster_id)

    def _measured(self, cluster_id: str, seconds: float) -> None:
        before = self._latency.get(cluster_id)
        self._latency[cluster_id] = seconds if before is None else 0.8 * before + 0.2 * seconds

    def _stub(self, url: str) -> BlockInferenceServiceStub:
        stub = self._stubs.get(url)
        if stub is None:
            channel = grpc.aio.insecure_channel(url, options=self.settings.message_options)
            self._channels[url] = channel
            stub = self._stubs[url] = BlockInferenceServiceStub(channel)
        return stub

    async def infer(
        self,
        remote: RemoteBlock,
        account: AccountInfo,
        data: dict[str, Any],
        deadline: float,
        files: list[InputFile] | None = None,
        frame_ptr: bytes = b"",
    ) -> PeerAnswer:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"no time left to run block {remote.block_id}")
        packet = BlockInferencePacket(
            block_id=remote.block_id,
            data=json.dumps(data, separators=(",", ":")),
            ts=time.time(),
            frame_ptr=frame_ptr,
            files=[
                FileInfo(metadata=json.dumps(f.metadata), file_data=f.data) for f in files or ()
            ],
        )
        metadata = [(ORIGIN_ACCOUNT, account.name), (ORIGIN_CLUSTER, self.cluster_id)]
        parent = CURRENT_REQUEST.get()
        if parent is not None:
            metadata.append((PARENT_REQUEST, str(parent)))
        if self.settings.peer_token:
            metadata.append(("authorization", f"Bearer {self.settings.peer_token}"))
        stub = self._stub(remote.url)
        started = time.monotonic()
        try:
            answer: AIOSPacket = await stub.infer(packet, timeout=left, metadata=metadata)
        except grpc.aio.AioRpcError as error:
            raise _answered(remote, error) from None
        self._measured(remote.cluster_id, time.monotonic() - started)
        return PeerAnswer(
            json.loads(answer.data) if answer.data else None,
            [InputFile(json.loads(f.metadata or "{}"), f.file_data) for f in answer.files],
        )

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()


def _answered(remote: RemoteBlock, error: grpc.aio.AioRpcError) -> GatewayError:
    code = error.code()
    where = f"cluster {remote.cluster_id}"
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(f"{where}'s gateway ({remote.url}) failed: {error.details()}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"{where} did not answer block {remote.block_id} in time")
    return PeerError(code, f"{where}: {error.details()}")
