"""``ModelStreamInfer`` (Triton's streaming extension): one call's requests run, each answered
with one response per item the model yields, as it is yielded.

Each request runs with ``Executor.stream``; a request that fails is answered with its
``error_message`` and the stream goes on. With request parameter
``triton_enable_empty_final_response``, every response says whether it is the request's last
(``triton_final_response``), and a last, empty one follows the items. Requests of one sequence
run one after another, others side by side.

Triton's sequences are sessions: parameter ``sequence_id`` (an integer or a string; 0 or empty:
none) is the task's ``session_id``, and its ``seq_no`` counts the sequence's requests on the
stream (1, 2, …; from 1 again at ``sequence_start``; a sequence the stream has not seen without
``sequence_start`` counts on from 1 too). A request may give its ``seq_no`` itself (parameter
``seq_no``, a positive integer) and the count goes on from it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc

from catalog.records import AccountInfo
from gateway.errors import DeadlineExceeded, status_of
from gateway.executor import Executor
from gateway.oip.datatypes import parameter
from gateway.oip.requests import (
    SequenceParams,
    answer_tensors,
    remaining,
    response_of,
    sequence_of,
    task_of,
)
from gateway.proto.grpc_service_pb2 import (
    ModelInferRequest,
    ModelInferResponse,
    ModelStreamInferResponse,
)
from gateway.quota import Quota
from gateway.task import Task

#: Requests of one stream running (or waiting on their sequence) at once; the stream is not
#: read further until one ends.
STREAM_IN_FLIGHT = 64
ENABLE_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"

Context = grpc.aio.ServicerContext[Any, Any]


class InferStream:
    """One ``ModelStreamInfer`` call: its requests run, their responses written in turn."""

    def __init__(
        self,
        executor: Executor,
        quota: Quota | None,
        default_deadline: float,
        account: AccountInfo,
        context: Context,
    ) -> None:
        self.executor = executor
        self.quota = quota
        self.default_deadline = default_deadline
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
        seconds = remaining(self.context, self.default_deadline)
        deadline = time.monotonic() + seconds
        if self.quota is not None:
            await self.quota.check(self.account.id, task.session_id, task.block_id)
        items = self.executor.stream(self.account, task, deadline)
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
