"""One prediction inside the runner: its state, the task running the model, its snapshots.

The model runs in a task of its own so that cancel can target exactly that task and the
driver can still record the outcome: a model exception becomes status ``failed`` (data, not a
crash), a cancel becomes ``canceled`` with whatever output and logs it had produced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson

from protocol.values import RunnerStatus, WebhookEvent
from runners.cache import CacheView
from runners.files import PredictionFiles
from runners.model import Model, PredictContext
from runners.scheduler import Scheduler, Ticket
from runners.webhooks import SnapshotSink


def _jsonable(value: Any) -> Any:
    """Reject an output that cannot go on the wire here, so it fails this prediction
    instead of breaking the response or the webhooks later."""
    orjson.dumps(value)
    return value


class Prediction:
    def __init__(
        self,
        prediction_id: str,
        inputs: dict[str, Any],
        context: Mapping[str, str],
        webhook: SnapshotSink | None,
        *,
        ticket: Ticket,
        scheduler: Scheduler,
        tenant: str = "default",
        cache: CacheView | None = None,
        on_gpu: bool = False,
        files: PredictionFiles | None = None,
    ) -> None:
        self.id = prediction_id
        self.ticket = ticket
        self.tenant = tenant
        self.on_gpu = on_gpu
        self._scheduler = scheduler
        self._ctx = PredictContext(prediction_id, context, self._log, tenant=tenant, cache=cache)
        self.input = inputs
        self.context = dict(context)
        self.status = RunnerStatus.STARTING
        self.error: str | None = None
        self.predict_time: float | None = None
        self._webhook = webhook
        self._files = files
        self._iterator = False
        self._outputs: list[Any] = []
        self._value: Any = None
        self._logs: list[str] = []
        self._started: float | None = None
        self._cancel_requested = False
        self._model_task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()

    @property
    def output(self) -> Any:
        if not self._iterator:
            return self._value
        if self._outputs or self.status is RunnerStatus.SUCCEEDED:
            return list(self._outputs)
        return None

    @property
    def logs(self) -> str:
        return "".join(self._logs)

    @property
    def queue_wait_time(self) -> float:
        return self.ticket.queue_wait

    @property
    def gpu_time(self) -> float:
        return (self.predict_time or 0.0) if self.on_gpu else 0.0

    @property
    def cache_hit(self) -> bool:
        return self._ctx.cache_hit

    @property
    def tokens_reused(self) -> int:
        return self._ctx.tokens_reused

    def model_cache_lookups(self) -> dict[bool, int]:
        """Lookups in the model's own caches, by hit (True) or miss (False)."""
        return {True: self._ctx.model_cache_hits, False: self._ctx.model_cache_misses}

    def metrics(self) -> dict[str, float]:
        """coglet's ``predict_time`` once terminal, plus the time queued for a slot and the
        time on a GPU (0 on CPU), which the platform records for billing."""
        if self.predict_time is None:
            return {}
        return {
            "predict_time": self.predict_time,
            "queue_wait_time": round(self.queue_wait_time, 6),
            "gpu_time": self.gpu_time,
        }

    def snapshot(self, *, with_input: bool = False) -> dict[str, Any]:
        """coglet's state snapshot: no timestamps, ``predict_time`` only once terminal."""
        body: dict[str, Any] = {"id": self.id, "status": self.status.value, "logs": self.logs}
        body["metrics"] = self.metrics()
        output = self.output
        if output is not None:
            body["output"] = output
        if self.error is not None:
            body["error"] = self.error
        if with_input:
            body["input"] = self.input
        return body

    def start(self, model: Model, on_finish: Callable[[Prediction], None]) -> asyncio.Task[None]:
        """Start the model and return the driver task, which never raises for model errors.

        ``on_finish`` runs once the outcome is recorded, before the completed webhook is
        queued and before waiters wake, so the slot is free by the time anyone hears of it.
        """
        self._model_task = asyncio.create_task(self._predict(model))
        return asyncio.create_task(self._drive(self._model_task, on_finish))

    def cancel(self) -> bool:
        """Ask the model to stop; False if it has already finished."""
        if self._model_task is None or self._model_task.done():
            return False
        self._cancel_requested = True
        self._model_task.cancel()
        return True

    def redirect(self, sink: SnapshotSink) -> None:
        """Send snapshots to ``sink`` from now on (a director that took this prediction over),
        starting with the state so far; the previous sink hears nothing more."""
        previous, self._webhook = self._webhook, sink
        if previous is not None and previous is not sink:
            previous.close()
        if self.status is RunnerStatus.PROCESSING:
            sink.send(WebhookEvent.START, self.snapshot())

    async def wait(self) -> None:
        await self._done.wait()

    async def _predict(self, model: Model) -> None:
        await self._scheduler.acquire(self.ticket)  # queued until a slot frees (or canceled)
        self._started = time.monotonic()
        self.status = RunnerStatus.PROCESSING
        self._emit(WebhookEvent.START)
        files = self._files
        inputs = self.input if files is None else await files.inputs(self.input, self._ctx)
        result = model.predict(inputs, self._ctx)
        if isinstance(result, AsyncIterator):
            self._iterator = True
            async for item in result:
                self._outputs.append(_jsonable(item if files is None else await files.output(item)))
                self._emit(WebhookEvent.OUTPUT)
        else:
            value = await result
            self._value = _jsonable(value if files is None else await files.output(value))

    async def _drive(
        self, model_task: asyncio.Task[None], on_finish: Callable[[Prediction], None]
    ) -> None:
        try:
            await asyncio.wait({model_task})
        except asyncio.CancelledError:
            # The runner is shutting down: the model stops, and its scratch files go with it.
            model_task.cancel()
            try:
                await asyncio.wait({model_task})
            finally:
                await self._ctx.discard_scratch()
            raise
        await self._ctx.discard_scratch()
        error = None if model_task.cancelled() else model_task.exception()
        if model_task.cancelled() or self._cancel_requested:
            self.status = RunnerStatus.CANCELED
        elif error is not None:
            self.status = RunnerStatus.FAILED
            self.error = str(error) or type(error).__name__
        else:
            self.status = RunnerStatus.SUCCEEDED
        started = self._started
        self.predict_time = 0.0 if started is None else time.monotonic() - started
        self._scheduler.release(self.ticket, ran_for=self.predict_time)
        on_finish(self)
        self._emit(WebhookEvent.COMPLETED)
        self._done.set()

    def _log(self, text: str) -> None:
        self._logs.append(text)
        self._emit(WebhookEvent.LOGS)

    def _emit(self, event: WebhookEvent) -> None:
        if self._webhook is not None:
            self._webhook.send(event, self.snapshot())
