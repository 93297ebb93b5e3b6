"""The aiohttp app key under which the runner's service lives (shared by the route modules)."""

from __future__ import annotations

from aiohttp import web

from runners.service import RunnerService

SERVICE = web.AppKey("runner_service", RunnerService)
