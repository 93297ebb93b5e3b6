"""A single runner and a model pool serve one control API: the same routes, runner token and
operation-token checks (runners.control) in front of each one's control plane, and one tree of
refusals (runners.errors)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from protocol.paths import (
    CACHE_FLUSH_PATH,
    CAPABILITIES_PATH,
    HEALTH_PATH,
    LOAD_PATH,
    LOAD_TASK_PATH,
    METRICS_PATH,
    UNLOAD_PATH,
)
from runners import control, errors
from runners.config import RunnerConfig
from runners.models.echo import EchoModel
from runners.pool.config import FixedProbe
from runners.pool.config_file import parse
from runners.pool.events import RejectCode
from runners.pool.http import create_app as create_pool_app
from runners.server import create_app as create_runner_app
from tests.runners.conftest import StartRunner

MiB = 2**20
TOKEN = "seam-token-of-the-test-hosts"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONTROL_ROUTES = [
    ("GET", CAPABILITIES_PATH),
    ("POST", LOAD_PATH),
    ("GET", LOAD_TASK_PATH),
    ("POST", UNLOAD_PATH),
    ("POST", CACHE_FLUSH_PATH),
    ("GET", HEALTH_PATH),
    ("GET", METRICS_PATH),
]
POOL_FILE = {
    "budget": "64MiB",
    "models": [{"name": "echo", "size": MiB, "backend": {"conduit": "echo"}}],
}


def _runner_app() -> web.Application:
    return create_runner_app(EchoModel(), 1, RunnerConfig(token=TOKEN))


def _pool_app() -> web.Application:
    return create_pool_app(
        parse(POOL_FILE), RunnerConfig(token=TOKEN), probe=FixedProbe((64 * MiB,))
    )


def _handler(app: web.Application, method: str, path: str) -> Any:
    for resource in app.router.resources():
        if resource.canonical == path:
            for route in resource:
                if route.method == method:
                    return route.handler
    raise AssertionError(f"no {method} {path}")


@pytest.mark.parametrize(("method", "path"), CONTROL_ROUTES)
def test_both_hosts_serve_each_control_route_with_the_same_handler(method: str, path: str) -> None:
    runner, pool = _handler(_runner_app(), method, path), _handler(_pool_app(), method, path)
    assert runner is pool
    assert runner.__module__ == control.__name__


@asynccontextmanager
async def _serving(app: web.Application) -> AsyncIterator[str]:
    async with TestServer(app, host="127.0.0.1", port=0) as server:
        yield str(server.make_url("")).rstrip("/")


async def _answer(
    http: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    async with http.request(method, url, **kwargs) as response:
        return response.status, await response.json(content_type=None)


async def test_both_hosts_refuse_control_calls_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the runner token: 401; a lifecycle call with no key configured: 403; one whose
    body is not an object: 400 -- the same answer, byte for byte, from either host."""
    monkeypatch.delenv("VERIFIED_OP_TOKEN_KEY_PATH", raising=False)
    answers: list[list[tuple[int, dict[str, Any]]]] = []
    async with aiohttp.ClientSession() as http:
        for app in (_runner_app(), _pool_app()):
            async with _serving(app) as url:
                answers.append(
                    [
                        await _answer(http, "GET", url + CAPABILITIES_PATH),
                        await _answer(
                            http,
                            "POST",
                            url + LOAD_PATH,
                            json={"modelId": "echo"},
                            headers=AUTH,
                        ),
                        await _answer(http, "POST", url + UNLOAD_PATH, json=[1], headers=AUTH),
                    ]
                )
    runner, pool = answers
    assert runner == pool
    assert [(status, body["code"]) for status, body in runner] == [
        (401, "unauthorized"),
        (403, "op-tokens-not-configured"),
        (400, "invalid-body"),
    ]


def test_every_refusal_of_the_pool_core_is_a_class_of_the_one_error_tree() -> None:
    def tree(root: type[errors.RequestRefused]) -> list[type[errors.RequestRefused]]:
        return [root, *(c for sub in root.__subclasses__() for c in tree(sub))]

    by_code = {cls.code: cls for cls in tree(errors.RequestRefused)}
    for code in RejectCode:
        assert code.value in by_code, code
        assert by_code[code.value].__module__ == errors.__name__


async def test_a_runner_answers_at_once_when_respond_async_is_one_of_several_preferences(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner()
    headers = {"Prefer": "respond-async, wait=5"}
    body = {"input": {"prompt": "x"}}
    status, answer = await _answer(
        http, "POST", f"{runner.url}/predictions", json=body, headers=headers
    )
    assert (status, answer["status"]) == (202, "starting")
