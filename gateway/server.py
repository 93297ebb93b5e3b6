"""The gateway's gRPC server: ``BlockInferenceService.infer`` and ``grpc.health.v1``.

``infer`` takes the account :mod:`gateway.admission` authenticated before its message was
read (:mod:`gateway.auth`), parses its packet into a task
(:mod:`gateway.task`), checks its quota (:mod:`gateway.quota`), runs it on the
:class:`gateway.executor.Executor` within the call's deadline (or ``default_deadline``), and
answers an ``AIOSPacket`` carrying the task's ``session_id``/``seq_no``, the result as JSON and
the graph (``output_ptr``) echoed. Every failure ends the call with the status
:func:`gateway.errors.status_of` gives it (and its trailing metadata, if any).

Each service is its generated servicer (``*_pb2_grpc``), added to the server with the generated
``add_*Servicer_to_server``; :class:`gateway.admission.Admission` intercepts every call.
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

from catalog.lookups import account_for_token
from catalog.token_checks import TokenChecks
from core.ids import new_request_id
from core.metrics import MetricsServer
from gateway.admission import Admission, caller
from gateway.auth import TokenAuth
from gateway.call_log import CURRENT_REQUEST, LoggedCall, log_entry
from gateway.cluster import ClusterMembership
from gateway.errors import DeadlineExceeded, abort_with, status_of
from gateway.execution import BlockExecutor
from gateway.executor import Executor, TaskResult
from gateway.metrics import GatewayMetrics
from gateway.oip.directory import BlockDirectory, ModelDirectory, NoModels
from gateway.oip.service import OpenInferenceService
from gateway.proto.grpc_service_pb2_grpc import add_GRPCInferenceServiceServicer_to_server
from gateway.proto.inference_pb2 import DESCRIPTOR, AIOSPacket, BlockInferencePacket, FileInfo
from gateway.proto.inference_pb2_grpc import (
    BlockInferenceServiceServicer,
    add_BlockInferenceServiceServicer_to_server,
)
from gateway.quota import Quota
from gateway.request_log import RequestLogWriter
from gateway.resources import GatewayResources, open_resources
from gateway.sessions import Sessions
from gateway.settings import GatewaySettings
from gateway.task import FileLimits, parse_packet
from tracker.db import make_engine

log = logging.getLogger(__name__)
SERVICE = DESCRIPTOR.services_by_name["BlockInferenceService"].full_name
#: A ``time_remaining`` past this is a call without a deadline.
_NO_DEADLINE = 10**9

Context = grpc.aio.ServicerContext[BlockInferencePacket, AIOSPacket]


class InferenceService(BlockInferenceServiceServicer):
    """``BlockInferenceService``: the generated servicer's ``infer``, a coroutine."""

    def __init__(
        self,
        executor: Executor,
        settings: GatewaySettings,
        sessions: Sessions | None = None,
        quota: Quota | None = None,
        request_log: RequestLogWriter | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.executor = executor
        self.settings = settings
        #: Replay and order by ``(session_id, seq_no)``; None: every task simply runs.
        self.sessions = sessions
        #: Checked before a task is resolved or run; None: no quota.
        self.quota = quota
        #: Where each call is logged; None: not logged.
        self.request_log = request_log
        self.metrics = metrics
        self.files = FileLimits(settings.task_max_files, settings.task_max_file_bytes)

    async def infer(self, packet: BlockInferencePacket, context: Context) -> AIOSPacket:
        call = LoggedCall(new_request_id(), time.time(), time.monotonic())
        token = CURRENT_REQUEST.set(call.request_id)
        try:
            answer = await self._infer(packet, context, call)
        except asyncio.CancelledError:
            self._done(call, packet, context, (grpc.StatusCode.CANCELLED, "canceled"))
            raise
        except Exception as error:
            status = status_of(error)
            self._done(call, packet, context, status)
            await abort_with(context, error, status)
        else:
            self._done(call, packet, context, (grpc.StatusCode.OK, None))
            return answer
        finally:
            CURRENT_REQUEST.reset(token)

    def _done(
        self,
        call: LoggedCall,
        packet: BlockInferencePacket,
        context: Context,
        status: tuple[grpc.StatusCode, str | None],
    ) -> None:
        """Count the call and log it."""
        if self.metrics is not None:
            self.metrics.observe(status[0].name, time.monotonic() - call.started)
        if self.request_log is None:
            return
        self.request_log.record(
            log_entry(
                call,
                packet,
                context.invocation_metadata(),
                status,
                self.settings.log_max_data_bytes,
            )
        )

    async def _infer(
        self, packet: BlockInferencePacket, context: Context, call: LoggedCall
    ) -> AIOSPacket:
        account = caller()
        call.identify(account, self.settings.peer_accounts)
        task = parse_packet(packet, self.files)
        if self.quota is not None:
            await self.quota.check(account.id, task.session_id, task.block_id)
        remaining = context.time_remaining()
        if remaining is None or remaining > _NO_DEADLINE:
            remaining = self.settings.default_deadline
        deadline = time.monotonic() + remaining

        async def run() -> bytes:
            result = await self.executor.run(account, task, deadline)
            return answer(packet, result).SerializeToString()

        try:
            async with asyncio.timeout(remaining):
                if self.sessions is None or not task.session_id:
                    return answer(packet, await self.executor.run(account, task, deadline))
                answered = await self.sessions.run_once(
                    account.id, task.session_id, task.seq_no, deadline, run
                )
        except TimeoutError:
            raise DeadlineExceeded(f"the task took longer than {remaining:.3f} s") from None
        return AIOSPacket.FromString(answered)


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
    settings: GatewaySettings,
    executor: Executor,
    auth: TokenAuth,
    port: int | None = None,
    sessions: Sessions | None = None,
    directory: ModelDirectory | None = None,
    quota: Quota | None = None,
    request_log: RequestLogWriter | None = None,
    metrics: GatewayMetrics | None = None,
) -> Gateway:
    """Serve ``infer``, the Open Inference Protocol (:mod:`gateway.oip.service`, its models
    described by ``directory``: none without one) and health."""
    infer = f"/{SERVICE}/infer"

    def refused(method: str, code: grpc.StatusCode, seconds: float) -> None:
        # An infer call refused before it was read is counted as one answered; it is not
        # logged: nothing of it was read.
        if metrics is not None and method == infer:
            metrics.observe(code.name, seconds)

    admission = Admission(
        auth.authenticate, settings.max_message_bytes, settings.max_bytes_in_flight, refused
    )
    server = grpc.aio.server(options=settings.server_options, interceptors=[admission])
    add_BlockInferenceServiceServicer_to_server(
        InferenceService(executor, settings, sessions, quota, request_log, metrics), server
    )
    add_GRPCInferenceServiceServicer_to_server(
        OpenInferenceService(executor, settings, directory or NoModels(), quota), server
    )
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = server.add_insecure_port(f"{settings.host}:{settings.port if port is None else port}")
    await server.start()
    serving = health_pb2.HealthCheckResponse.SERVING
    await health.set("", serving)
    await health.set(SERVICE, serving)
    return Gateway(server, health, bound)


async def open_request_log(
    stack: AsyncExitStack,
    settings: GatewaySettings,
    engine: AsyncEngine,
    metrics: GatewayMetrics | None = None,
) -> RequestLogWriter | None:
    """The request log's writer, started (closed by ``stack``), when the settings ask for it."""
    if not settings.log:
        return None
    if settings.log_database_url:
        engine = make_engine(settings.log_database_url, pool_size=2)
        stack.push_async_callback(engine.dispose)
    writer = RequestLogWriter(
        engine,
        settings.log_queue,
        settings.log_batch,
        settings.log_flush_interval,
        settings.log_retention_days,
        metrics.registry if metrics is not None else None,
    )
    await writer.start()
    stack.push_async_callback(writer.close)
    return writer


def token_auth(engine: AsyncEngine, settings: GatewaySettings) -> TokenAuth:
    return TokenAuth(
        TokenChecks(
            lambda token: account_for_token(engine, token),
            settings.token_cache_ttl,
            settings.tokens_cached,
            settings.auth_failures_per_minute,
            settings.auth_failure_burst,
        )
    )


async def serve(
    settings: GatewaySettings,
    make_executor: Callable[[GatewayResources], Executor] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully (``shutdown_grace``): calls under
    way get the grace to finish, then are canceled (which cancels their predictions)."""
    async with AsyncExitStack() as stack:
        resources = await open_resources(stack, settings)
        executor = (make_executor or BlockExecutor)(resources)
        sessions = Sessions(
            resources.redis, settings.session_ttl, settings.session_answer_max_bytes
        )
        metrics = GatewayMetrics()
        if settings.metrics_port is not None:
            metrics_server = MetricsServer(metrics, settings.metrics_host, settings.metrics_port)
            await metrics_server.start()
            stack.push_async_callback(metrics_server.stop)
        membership: ClusterMembership | None = None
        quota = Quota.configured(resources.redis, settings, metrics.registry)
        if resources.registry_engine is not None:
            membership = ClusterMembership(settings, resources.registry_engine, resources.engine)
            # The registry's quota_management_data may set limits at any time.
            quota = Quota(
                resources.redis, membership.limits, settings.quota_shadow, registry=metrics.registry
            )
        request_log = await open_request_log(stack, settings, resources.engine, metrics)
        gateway = await start(
            settings,
            executor,
            token_auth(resources.engine, settings),
            sessions=sessions,
            directory=BlockDirectory(resources.catalog, settings.cache_ttl),
            quota=quota,
            request_log=request_log,
            metrics=metrics,
        )
        if membership is not None:
            membership.url = settings.advertise_url or f"{settings.host}:{gateway.port}"
            await membership.start()
            stack.push_async_callback(membership.stop)
        log.info("gateway serving on %s:%d", settings.host, gateway.port)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await stopping.wait()
        log.info("gateway stopping")
        await gateway.stop(settings.shutdown_grace)
