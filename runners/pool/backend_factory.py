"""The backend a model's entry in the pool's config file names (:class:`BackendFile`): a
Conduit model served in this process, or a stock Cog server."""

from __future__ import annotations

import aiohttp

from runners.config import RunnerConfig
from runners.pool.backends import Backend
from runners.pool.cog_backend import CogBackend
from runners.pool.conduit_backend import ConduitBackend
from runners.pool.config import MemoryProbe
from runners.pool.config_file import BackendFile


def build(
    name: str,
    spec: BackendFile,
    concurrency: int,
    declared_bytes: int,
    config: RunnerConfig,
    session: aiohttp.ClientSession,
    probe: MemoryProbe,
) -> Backend:
    if spec.conduit is not None:
        return ConduitBackend(name, spec.conduit, spec.args, concurrency, declared_bytes, config)
    assert spec.cog is not None
    cog = spec.cog
    return CogBackend(name, cog.command, cog.cwd, cog.environment(), session, probe)
