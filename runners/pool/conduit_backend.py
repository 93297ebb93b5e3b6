"""A slot's backend for a Conduit model: the model in this process, served by the very app
``conduit runner <model>`` serves (:func:`runners.server.create_app`), on a port of its own and
behind a token of its own that only the pool knows.

Observed memory is what the model reports (:meth:`Model.memory_bytes`), else its declared
size: a process RSS delta cannot be told apart from the other slots' loads in the same
process. A CUDA model is given the GPU the pool placed it on as its ``device``
(``cuda:<k>``); on unload, what it left in PyTorch's cache goes back to the device.
"""

from __future__ import annotations

import gc
import secrets
import sys
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from protocol.headers import bearer
from runners.config import RunnerConfig
from runners.model import Model
from runners.models import get_model
from runners.pool.backends import LoadError
from runners.pool.nvml import cuda_ordinal
from runners.server import create_app
from runners.service import RunnerService
from runners.state import SERVICE


class ConduitBackend:
    def __init__(
        self,
        name: str,
        target: str,
        args: Mapping[str, Any],
        concurrency: int,
        declared_bytes: int,
        config: RunnerConfig,
    ) -> None:
        self.name = name
        self._class = get_model(target)
        self._args = dict(args)
        self._concurrency = concurrency
        self._declared = declared_bytes
        self._config = config
        template = self._class(**self._args)  # cheap: the weights load in setup()
        self._schema = template.openapi_schema()
        self.device = "cuda" if template.device.startswith("cuda") else "cpu"
        self._runner: web.AppRunner | None = None
        self._service: RunnerService | None = None
        self._url: str | None = None
        self._token = secrets.token_urlsafe(32)

    @property
    def url(self) -> str | None:
        return self._url

    @property
    def headers(self) -> Mapping[str, str]:
        return bearer(self._token)

    @property
    def service(self) -> RunnerService | None:
        """The running runner service (its caches, for a flush); None while unloaded."""
        return self._service if self._url is not None else None

    def openapi(self) -> dict[str, Any] | None:
        return self._schema

    async def start(self, devices: tuple[int, ...]) -> int:
        model: Model = self._class(**self._args)
        if devices and model.device.startswith("cuda"):
            model.device = f"cuda:{cuda_ordinal(devices[0])}"
        self.device = "cuda" if model.device.startswith("cuda") else "cpu"
        runner_id = f"{self._config.runner_id or 'pool'}/{self.name}"
        config = self._config.model_copy(update={"token": self._token, "runner_id": runner_id})
        app = create_app(model, self._concurrency, config)
        self._service = app[SERVICE]
        self._runner = web.AppRunner(
            app, handler_cancellation=True, handle_signals=False, access_log=None
        )
        await self._runner.setup()  # starts the model's setup in the background
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        if not await self._service.wait_ready():
            logs = self._service.lifecycle.setup_result.get("logs", "").strip()
            raise LoadError(logs.splitlines()[-1] if logs else "setup failed")
        self._url = f"http://{host}:{port}"
        return model.memory_bytes() or self._declared

    async def stop(self) -> None:
        self._url = None
        service, runner = self._service, self._runner
        self._service = self._runner = None
        if service is not None and service.ready:
            await service.lifecycle.unload()
        if runner is not None:
            await runner.cleanup()
        release_cuda_cache()

    async def settled(self, prediction_id: str) -> None:
        service = self._service
        prediction = None if service is None else service.get(prediction_id)
        if prediction is not None:
            await prediction.wait()


def release_cuda_cache() -> None:
    """Give back to the device what unloaded models left in PyTorch's caching allocator; else
    NVML counts it as this process's for good (only where a model already brought torch in)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    gc.collect()  # an unloaded model's tensors may still be held in reference cycles
    torch.cuda.empty_cache()
