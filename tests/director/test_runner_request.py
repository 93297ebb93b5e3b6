"""What the director's start asks of a runner about output files: where to PUT them."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from protocol.client import RunnerClient


async def _bodies_of_starts(**start: Any) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = []

    async def put(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.json_response({"status": "starting"}, status=202)

    app = web.Application()
    app.router.add_put("/predictions/{id}", put)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            client = RunnerClient(str(server.make_url("")), session)
            await client.start("p1", {"a": 1}, "http://receiver/runner/p1/1/s", **start)
    finally:
        await server.close()
    return bodies


async def test_the_start_names_the_attempts_files_url_as_output_file_prefix() -> None:
    prefix = "http://receiver/runner/p1/1/s/files/"
    [body] = await _bodies_of_starts(output_file_prefix=prefix)
    assert body["output_file_prefix"] == prefix
    assert body["webhook"] == "http://receiver/runner/p1/1/s"


async def test_without_a_store_the_start_names_none() -> None:
    [body] = await _bodies_of_starts()
    assert "output_file_prefix" not in body
