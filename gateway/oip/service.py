"""The Open Inference Protocol (KServe v2) on the gateway's gRPC server:
``inference.GRPCInferenceService``, as NVIDIA's ``tritonclient`` calls it.

A model is a block: ``model_name`` is the block id, the request's tensors are the block's input
(:mod:`gateway.oip.inputs`), and the task runs on the same :class:`gateway.executor.Executor`
as ``BlockInferenceService.infer``, with the same bearer token, deadlines (the call's, else
``default_deadline``) and statuses (:func:`gateway.errors.status_of`). ``ModelInfer`` runs a
task with ``Executor.run``; ``model_version`` is not read: a block runs its current version.
``ModelReady`` and ``ModelMetadata`` read a :class:`gateway.oip.directory.ModelDirectory`.
``ServerLive``, ``ServerReady`` and ``ServerMetadata`` answer without a token, as
``grpc.health.v1`` does. ``ModelStreamInfer`` runs a stream of requests
(:mod:`gateway.oip.stream`).

Parameter ``sequence_id`` (an integer or a string; 0 or empty: none) is the task's
``session_id``. ``ModelInfer`` has no stream to count a sequence's requests on: its ``seq_no``
is the request's parameter ``seq_no`` (a positive integer), else 0.

:class:`OpenInferenceService` is the generated ``GRPCInferenceServiceServicer``; the server adds
it with the generated ``add_GRPCInferenceServiceServicer_to_server``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

import grpc

from gateway.admission import caller
from gateway.errors import DeadlineExceeded, NotFound, abort_with, status_of
from gateway.executor import Executor
from gateway.oip.directory import ModelDescription, ModelDirectory, TensorSpec
from gateway.oip.requests import answer_tensors, remaining, response_of, sequence_of, task_of
from gateway.oip.stream import InferStream
from gateway.proto.grpc_service_pb2 import (
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataRequest,
    ModelMetadataResponse,
    ModelReadyRequest,
    ModelReadyResponse,
    ServerLiveRequest,
    ServerLiveResponse,
    ServerMetadataRequest,
    ServerMetadataResponse,
    ServerReadyRequest,
    ServerReadyResponse,
)
from gateway.proto.grpc_service_pb2_grpc import GRPCInferenceServiceServicer
from gateway.quota import Quota
from gateway.settings import GatewaySettings

SERVER_NAME = "conduit"
EXTENSIONS = ("parameters", "sequence")

Context = grpc.aio.ServicerContext[Any, Any]


def _server_version() -> str:
    try:
        return package_version("conduit")
    except PackageNotFoundError:
        return "0"


def _metadata(description: ModelDescription) -> ModelMetadataResponse:
    def specs(tensors: tuple[TensorSpec, ...]) -> list[ModelMetadataResponse.TensorMetadata]:
        return [
            ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape)
            for t in tensors
        ]

    return ModelMetadataResponse(
        name=description.name,
        versions=description.versions,
        platform=description.platform,
        inputs=specs(description.inputs),
        outputs=specs(description.outputs),
    )


class OpenInferenceService(GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService``: the generated servicer's methods, each a coroutine
    (``ModelStreamInfer`` writes its responses with ``context.write``)."""

    def __init__(
        self,
        executor: Executor,
        settings: GatewaySettings,
        directory: ModelDirectory,
        quota: Quota | None = None,
    ) -> None:
        self.executor = executor
        self.settings = settings
        self.directory = directory
        #: The same quota as ``infer``'s: every task counts once, whichever face it came by.
        self.quota = quota
        self.version = _server_version()

    # Server ---------------------------------------------------------------------------------

    async def ServerLive(self, request: ServerLiveRequest, context: Context) -> ServerLiveResponse:
        return ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: ServerReadyRequest, context: Context
    ) -> ServerReadyResponse:
        return ServerReadyResponse(ready=True)

    async def ServerMetadata(
        self, request: ServerMetadataRequest, context: Context
    ) -> ServerMetadataResponse:
        return ServerMetadataResponse(name=SERVER_NAME, version=self.version, extensions=EXTENSIONS)

    # Models ---------------------------------------------------------------------------------

    async def ModelReady(self, request: ModelReadyRequest, context: Context) -> ModelReadyResponse:
        try:
            description = await self._model(request.name, request.version, context)
            return ModelReadyResponse(ready=description.ready)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            code, message = status_of(error)
        await context.abort(code, message)

    async def ModelMetadata(
        self, request: ModelMetadataRequest, context: Context
    ) -> ModelMetadataResponse:
        try:
            return _metadata(await self._model(request.name, request.version, context))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            code, message = status_of(error)
        await context.abort(code, message)

    async def _model(self, name: str, version: str, context: Context) -> ModelDescription:
        account = caller()
        description = await self.directory.model(account, name) if name else None
        if description is None:
            raise NotFound(f"no model {name!r}", "name")
        if version and version not in description.versions:
            raise NotFound(f"model {name!r} has no version {version!r}", "version")
        return description

    # Inference ------------------------------------------------------------------------------

    async def ModelInfer(self, request: ModelInferRequest, context: Context) -> ModelInferResponse:
        try:
            return await self._infer(request, context)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            await abort_with(context, error)

    async def _infer(self, request: ModelInferRequest, context: Context) -> ModelInferResponse:
        account = caller()
        sequence = sequence_of(request)
        task = task_of(request, sequence.id, sequence.seq_no or 0)
        if self.quota is not None:
            await self.quota.check(account.id, task.session_id, task.block_id)
        seconds = remaining(context, self.settings.default_deadline)
        try:
            async with asyncio.timeout(seconds) as scope:
                result = await self.executor.run(account, task, time.monotonic() + seconds)
        except TimeoutError:
            if scope.expired():
                raise DeadlineExceeded(f"the task took longer than {seconds:.3f} s") from None
            raise
        return response_of(request, answer_tensors(request, result.data, result.files))

    async def ModelStreamInfer(
        self, requests: AsyncIterator[ModelInferRequest], context: Context
    ) -> None:
        try:
            stream = InferStream(
                self.executor, self.quota, self.settings.default_deadline, caller(), context
            )
            await stream.serve(requests)
            return
        except asyncio.CancelledError:
            raise
        except Exception as error:
            code, message = status_of(_single(error))
        await context.abort(code, message)


def _single(error: Exception) -> BaseException:
    """The one error of a task group that failed with one, else the group."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        inner = error.exceptions[0]
        if not isinstance(inner, Exception):
            break
        error = inner
    return error
