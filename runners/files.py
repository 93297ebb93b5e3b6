"""A prediction's files: its file inputs fetched before ``predict``, its file outputs handed
over as they come (see :mod:`runners.file_inputs` and :mod:`runners.file_outputs`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from runners.config import RunnerConfig
from runners.file_inputs import AddressGuard, FetchLimits, fetch_inputs
from runners.file_outputs import FileOutputs
from runners.model import PredictContext


class PredictionFiles:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        fields: frozenset[str],
        output_prefix: str | None,
        config: RunnerConfig,
    ) -> None:
        self._session = session
        self._fields = fields
        # The allow-list of webhooks: downloads and uploads reach what webhooks may reach.
        guard = AddressGuard(config.webhook_networks(), config.webhook_hosts())
        self._limits = FetchLimits(
            config.file_max_bytes,
            config.file_read_timeout,
            config.webhook_connect_timeout,
            guard,
        )
        self._outputs = FileOutputs(
            session,
            output_prefix,
            config.file_read_timeout,
            config.webhook_connect_timeout,
            guard,
        )

    async def inputs(self, inputs: Mapping[str, Any], ctx: PredictContext) -> dict[str, Any]:
        """What the model sees: ``inputs`` with file inputs as local paths."""
        if not self._fields:
            return dict(inputs)
        return await fetch_inputs(
            inputs, self._fields, self._session, ctx.scratch_dir, self._limits
        )

    async def output(self, value: Any) -> Any:
        """``value`` as it goes on the wire: file outputs as URLs."""
        return await self._outputs.convert(value)
