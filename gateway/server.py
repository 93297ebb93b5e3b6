"""The gateway's gRPC server: ``BlockInferenceService.infer`` and ``grpc.health.v1``.

``infer`` authenticates the call (:mod:`gateway.auth`), parses its packet into a task
(:mod:`gateway.task`), runs it on the :class:`gateway.executor.Executor` within the call's
deadline (or ``default_deadline``), and answers an ``AIOSPacket`` carrying the task's
``session_id``/``seq_no``, the result as JSON and the graph (``output_ptr``) echoed. Every
failure ends the call with the status :func:`gateway.errors.status_of` gives it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.auth import TokenAuth
from gateway.errors import DeadlineExceeded, status_of
from gateway.executor import Executor, TaskResult, Unconfigured
from gateway.proto.inference_pb2 import DESCRIPTOR, AIOSPacket, BlockInferencePacket, FileInfo
from gateway.settings import GatewaySettings
from gateway.task import parse_packet
from tracker.catalog import account_for_token
from tracker.db import make_engine

log = logging.getLogger(__name__)
SERVICE = DESCRIPTOR.services_by_name["BlockInferenceService"].full_name
#: A ``time_remaining`` past this is a call without a deadline.
_NO_DEADLINE = 10**9

Context = grpc.aio.ServicerContext[BlockInferencePacket, AIOSPacket]


class InferenceService:
    def __init__(self, auth: TokenAuth, executor: Executor, settings: GatewaySettings) -> None:
        self.auth = auth
        self.executor = executor
        self.settings = settings

    async def infer(self, packet: BlockInferencePacket, context: Context) -> AIOSPacket:
        try:
            return await self._infer(packet, context)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            code, message = status_of(error)
        await context.abort(code, message)

    async def _infer(self, packet: BlockInferencePacket, context: Context) -> AIOSPacket:
        account = await self.auth.account(context.invocation_metadata())
        task = parse_packet(packet)
        remaining = context.time_remaining()
        if remaining is None or remaining > _NO_DEADLINE:
            remaining = self.settings.default_deadline
        try:
            async with asyncio.timeout(remaining):
                result = await self.executor.run(account, task, time.monotonic() + remaining)
        except TimeoutError:
            raise DeadlineExceeded(f"the task took longer than {remaining:.3f} s") from None
        return answer(packet, result)


def answer(packet: BlockInferencePacket, result: TaskResult) -> AIOSPacket:
    return AIOSPacket(
        session_id=packet.session_id,
        seq_no=packet.seq_no,
        data=json.dumps(result.data, separators=(",", ":")),
        ts=time.time(),
        output_ptr=packet.output_ptr,
        files=[
            FileInfo(metadata=json.dumps(f.metadata, separators=(",", ":")), file_data=f.data)
            for f in result.files
        ],
    )


def handler(service: InferenceService) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "infer": grpc.unary_unary_rpc_method_handler(
                service.infer,
                request_deserializer=BlockInferencePacket.FromString,
                response_serializer=AIOSPacket.SerializeToString,
            )
        },
    )


@dataclass
class Gateway:
    """A started server: its port (the one asked for, or the one chosen for port 0)."""

    server: grpc.aio.Server
    health: health_aio.HealthServicer
    port: int

    async def stop(self, grace: float | None) -> None:
        """Answer NOT_SERVING, refuse new calls, give calls under way ``grace`` seconds."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start(
    settings: GatewaySettings, executor: Executor, auth: TokenAuth, port: int | None = None
) -> Gateway:
    limit = settings.max_message_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ]
    )
    server.add_generic_rpc_handlers([handler(InferenceService(auth, executor, settings))])
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = server.add_insecure_port(f"{settings.host}:{settings.port if port is None else port}")
    await server.start()
    serving = health_pb2.HealthCheckResponse.SERVING
    await health.set("", serving)
    await health.set(SERVICE, serving)
    return Gateway(server, health, bound)


def token_auth(engine: AsyncEngine, settings: GatewaySettings) -> TokenAuth:
    return TokenAuth(
        lambda token: account_for_token(engine, token),
        settings.token_cache_ttl,
        settings.tokens_cached,
    )


async def serve(
    settings: GatewaySettings, make_executor: Callable[[AsyncEngine], Executor]
) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully (``shutdown_grace``)."""
    async with AsyncExitStack() as stack:
        engine = make_engine(settings.database_url, pool_size=settings.db_pool_size)
        stack.push_async_callback(engine.dispose)
        gateway = await start(settings, make_executor(engine), token_auth(engine, settings))
        log.info("gateway serving on %s:%d", settings.host, gateway.port)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await stopping.wait()
        log.info("gateway stopping")
        await gateway.stop(settings.shutdown_grace)


def default_executor(engine: AsyncEngine) -> Executor:
    """The executor ``conduit gateway`` runs tasks on."""
    return Unconfigured()
