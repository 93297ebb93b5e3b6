"""The Open Inference Protocol (KServe v2) on the gateway's gRPC server:
``inference.GRPCInferenceService``, as NVIDIA's ``tritonclient`` calls it.

A model is a block: ``model_name`` is the block id, the request's tensors are the block's input
(:mod:`gateway.oip_tensors`), and the task runs on the same :class:`gateway.executor.Executor`
as ``BlockInferenceService.infer``, with the same bearer token, deadlines (the call's, else
``default_deadline``) and statuses (:func:`gateway.errors.status_of`). ``ModelInfer`` runs a
task with ``Executor.run``; ``model_version`` is not read: a block runs its current version.
``ModelReady`` and ``ModelMetadata`` read a :class:`gateway.oip_directory.ModelDirectory`.
``ServerLive``, ``ServerReady`` and ``ServerMetadata`` answer without a token, as
``grpc.health.v1`` does.

``ModelStreamInfer`` (Triton's streaming extension) runs each request of the stream with
``Executor.stream`` and answers one response per item the model yields, as it is yielded; a
request that fails is answered with its ``error_message`` and the stream goes on. With request
parameter ``triton_enable_empty_final_response``, every response says whether it is the
request's last (``triton_final_response``), and a last, empty one follows the items. Requests
of one sequence run one after another, others side by side.

Triton's sequences are sessions: parameter ``sequence_id`` (an integer or a string; 0 or empty:
none) is the task's ``session_id``, and its ``seq_no`` counts the sequence's requests on the
stream (1, 2, …; from 1 again at ``sequence_start``; a sequence the stream has not seen without
``sequence_start`` counts on from 1 too). A request may give its ``seq_no`` itself (parameter
``seq_no``, a positive integer) and the count goes on from it. ``ModelInfer`` has no stream to
count on: its ``seq_no`` is that parameter, else 0.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

import grpc

from catalog.lookups import AccountInfo
from gateway.admission import caller
from gateway.errors import DeadlineExceeded, NotFound, abort_with, status_of
from gateway.executor import Executor
from gateway.oip_directory import ModelDescription, ModelDirectory, TensorSpec
from gateway.oip_requests import (
    SequenceParams,
    answer_tensors,
    remaining,
    response_of,
    sequence_of,
    task_of,
)
from gateway.oip_tensors import parameter
from gateway.proto.grpc_service_pb2 import (
    DESCRIPTOR,
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataRequest,
    ModelMetadataResponse,
    ModelReadyRequest,
    ModelReadyResponse,
    ModelStreamInferResponse,
    ServerLiveRequest,
    ServerLiveResponse,
    ServerMetadataRequest,
    ServerMetadataResponse,
    ServerReadyRequest,
    ServerReadyResponse,
)
from gateway.quota import Quota
from gateway.settings import GatewaySettings
from gateway.task import Task

log = logging.getLogger(__name__)
SERVICE = DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
SERVER_NAME = "conduit"
EXTENSIONS = ("parameters", "sequence")
#: Requests of one stream running (or waiting on their sequence) at once; the stream is not
#: read further until one ends.
STREAM_IN_FLIGHT = 64
ENABLE_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"

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


class OpenInferenceService:
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
            account = caller()
            await _Stream(self, account, context).serve(requests)
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


class _Stream:
    """One ``ModelStreamInfer`` call: its requests run, their responses written in turn."""

    def __init__(self, service: OpenInferenceService, account: AccountInfo, context: Context):
        self.service = service
        self.account = account
        self.context = context
        #: Sequence id -> the seq_no of its last request on this stream.
        self.counts: dict[str, int] = {}
        #: Sequence id -> its last request's run: the next one waits for it.
        self.tails: dict[str, asyncio.Task[None]] = {}
        self.slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
        self.writing = asyncio.Lock()

    async def serve(self, requests: AsyncIterator[ModelInferRequest]) -> None:
        async with asyncio.TaskGroup() as group:
            async for request in requests:
                await self.slots.acquire()
                try:
                    task, sequence = self._prepare(request)
                except Exception as error:
                    self.slots.release()
                    await self._fail(request, error)
                    continue
                after = self.tails.get(sequence.id) if sequence.id else None
                run = group.create_task(self._run(request, task, after))
                if sequence.id:
                    self.tails[sequence.id] = run
                    run.add_done_callback(functools.partial(self._untail, sequence.id))

    def _untail(self, key: str, done: asyncio.Task[None]) -> None:
        if self.tails.get(key) is done:
            del self.tails[key]

    def _prepare(self, request: ModelInferRequest) -> tuple[Task, SequenceParams]:
        sequence = sequence_of(request)
        task = task_of(request)
        if not sequence.id:
            return task, sequence
        if sequence.seq_no is not None:
            seq_no = sequence.seq_no
        elif sequence.start:
            seq_no = 1
        else:
            seq_no = self.counts.get(sequence.id, 0) + 1
        if sequence.end:
            self.counts.pop(sequence.id, None)
        else:
            self.counts[sequence.id] = seq_no
        return replace(task, session_id=sequence.id, seq_no=seq_no), sequence

    async def _run(
        self, request: ModelInferRequest, task: Task, after: asyncio.Task[None] | None
    ) -> None:
        try:
            if after is not None:
                await asyncio.wait([after])
            await self._stream(request, task)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            await self._fail(request, error)
        finally:
            self.slots.release()

    async def _stream(self, request: ModelInferRequest, task: Task) -> None:
        flagged = parameter(request.parameters, ENABLE_FINAL) is True
        seconds = remaining(self.context, self.service.settings.default_deadline)
        deadline = time.monotonic() + seconds
        quota = self.service.quota
        if quota is not None:
            await quota.check(self.account.id, task.session_id, task.block_id)
        items = self.service.executor.stream(self.account, task, deadline)
        try:
            async with asyncio.timeout(seconds) as scope:
                async for item in items:
                    response = response_of(request, answer_tensors(request, item))
                    if flagged:
                        response.parameters[FINAL].bool_param = False
                    await self._write(ModelStreamInferResponse(infer_response=response))
        except TimeoutError:
            if scope.expired():
                raise DeadlineExceeded(f"the task took longer than {seconds:.3f} s") from None
            raise
        finally:
            close = getattr(items, "aclose", None)
            if close is not None:
                await close()
        if flagged:
            await self._write(ModelStreamInferResponse(infer_response=_final(request)))

    async def _fail(self, request: ModelInferRequest, error: BaseException) -> None:
        code, message = status_of(error)
        response = (
            _final(request)
            if parameter(request.parameters, ENABLE_FINAL) is True
            else (
                ModelInferResponse(
                    model_name=request.model_name,
                    model_version=request.model_version,
                    id=request.id,
                )
            )
        )
        await self._write(
            ModelStreamInferResponse(
                error_message=f"{code.name}: {message}", infer_response=response
            )
        )

    async def _write(self, response: ModelStreamInferResponse) -> None:
        async with self.writing:
            await self.context.write(response)


def _final(request: ModelInferRequest) -> ModelInferResponse:
    response = ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    response.parameters[FINAL].bool_param = True
    return response


def handler(service: OpenInferenceService) -> grpc.GenericRpcHandler:
    def unary(method: Any, request: Any, response: Any) -> grpc.RpcMethodHandler[Any, Any]:
        return grpc.unary_unary_rpc_method_handler(
            method,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ServerLive": unary(service.ServerLive, ServerLiveRequest, ServerLiveResponse),
            "ServerReady": unary(service.ServerReady, ServerReadyRequest, ServerReadyResponse),
            "ServerMetadata": unary(
                service.ServerMetadata, ServerMetadataRequest, ServerMetadataResponse
            ),
            "ModelReady": unary(service.ModelReady, ModelReadyRequest, ModelReadyResponse),
            "ModelMetadata": unary(
                service.ModelMetadata, ModelMetadataRequest, ModelMetadataResponse
            ),
            "ModelInfer": unary(service.ModelInfer, ModelInferRequest, ModelInferResponse),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
                service.ModelStreamInfer,
                request_deserializer=ModelInferRequest.FromString,
                response_serializer=ModelStreamInferResponse.SerializeToString,
            ),
        },
    )
